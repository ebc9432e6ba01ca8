"""`edgeserve deploy --target aws-lambda` against a real AWS API endpoint: moto in server mode.

The zip is packaged from a real bundle, but the profile replaces its requirements with one
small pure-Python wheel from a local wheelhouse (`requirements`, `wheelhouse` settings), so
no large wheels are fetched. Every assertion reads the result back through boto3.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from edgeserve.aws_lambda.driver import AwsLambda
from edgeserve.bundle import Bundle
from edgeserve.errors import DeployError
from edgeserve.profiles import TargetProfile, load_target
from tests.aws_lambda_support import (
    FAKE_CREDENTIALS,
    HANDLER,
    ROLE,
    TRUST,
    moto_endpoint,
    small_bundle,
    wheelhouse,
    write_profile,
)


@pytest.fixture
def endpoint(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    for key, value in FAKE_CREDENTIALS.items():
        monkeypatch.setenv(key, value)
    boto3.setup_default_session()  # forget credentials a previous test resolved
    with moto_endpoint() as url:
        monkeypatch.setenv("EDGESERVE_AWS_ENDPOINT_URL", url)
        yield url


@pytest.fixture
def aws(endpoint: str) -> Any:
    return boto3.client("lambda", endpoint_url=endpoint, region_name="us-east-1")


@pytest.fixture
def role(endpoint: str) -> str:
    iam = boto3.client("iam", endpoint_url=endpoint, region_name="us-east-1")
    iam.create_role(RoleName="edgeserve-lambda", AssumeRolePolicyDocument=json.dumps(TRUST))
    return ROLE


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Bundle:
    return small_bundle(tmp_path_factory.mktemp("deploy"))


@pytest.fixture
def driver() -> AwsLambda:
    return AwsLambda()


def profile(tmp_path: Path, role: str, extra: str = "") -> TargetProfile:
    settings = (
        f'role_arn = "{role}"\nurl_auth_type = "NONE"\nreserved_concurrency = 5\n'
        f'requirements = ["tinydep"]\nwheelhouse = "{wheelhouse(tmp_path)}"\n{extra}'
    )
    return load_target(write_profile(tmp_path / "lambda.toml", settings))


def test_first_deploy_creates_function_version_alias_url_and_concurrency(
    tmp_path: Path, aws: Any, role: str, bundle: Bundle, driver: AwsLambda
) -> None:
    target = profile(tmp_path, role, 'memory_mb = 1024\narchitecture = "arm64"\n')
    zipped = driver.package(bundle, target, tmp_path / "out")  # the same bytes deploy uploads
    result = driver.deploy(bundle, target)

    config = aws.get_function_configuration(FunctionName="tiny", Qualifier="live")
    assert (result.version, result.previous_version) == ("1", None)
    assert {
        key: config[key] for key in ("Runtime", "Handler", "MemorySize", "Timeout", "Role")
    } == {
        "Runtime": "python3.12",
        "Handler": "app.handler",
        "MemorySize": 1024,
        "Timeout": 30,
        "Role": ROLE,
    }
    assert config["Architectures"] == ["arm64"]
    assert config["Version"] == "1"
    assert (
        config["CodeSha256"]
        == base64.b64encode(hashlib.sha256(zipped.read_bytes()).digest()).decode()
    )
    assert [
        v["Version"] for v in aws.list_versions_by_function(FunctionName="tiny")["Versions"]
    ] == [
        "$LATEST",
        "1",
    ]
    assert aws.get_alias(FunctionName="tiny", Name="live")["FunctionVersion"] == "1"
    url = aws.get_function_url_config(FunctionName="tiny", Qualifier="live")
    assert (url["AuthType"], url["FunctionUrl"]) == ("NONE", result.url)
    statements = json.loads(aws.get_policy(FunctionName="tiny", Qualifier="live")["Policy"])[
        "Statement"
    ]
    assert sorted((s["Sid"], s["Action"]) for s in statements) == [
        ("edgeserve-url", "lambda:InvokeFunctionUrl"),
        ("edgeserve-url-invoke", "lambda:InvokeFunction"),
    ]
    assert aws.get_function_concurrency(FunctionName="tiny")["ReservedConcurrentExecutions"] == 5


def test_redeploy_updates_publishes_moves_alias_and_rollback_returns(
    tmp_path: Path, aws: Any, role: str, bundle: Bundle, driver: AwsLambda
) -> None:
    driver.deploy(bundle, profile(tmp_path, role))
    second = driver.deploy(bundle, profile(tmp_path, role, "timeout_s = 60\n"))

    assert (second.version, second.previous_version) == ("2", "1")
    assert aws.get_alias(FunctionName="tiny", Name="live")["FunctionVersion"] == "2"
    assert aws.get_function_configuration(FunctionName="tiny", Qualifier="2")["Timeout"] == 60
    statements = json.loads(aws.get_policy(FunctionName="tiny", Qualifier="live")["Policy"])[
        "Statement"
    ]
    assert len(statements) == 2  # the URL permissions are granted once, not per deploy

    back = driver.rollback("tiny", profile(tmp_path, role))
    assert (back.version, back.previous_version) == ("1", "2")
    assert aws.get_alias(FunctionName="tiny", Name="live")["FunctionVersion"] == "1"
    status = driver.status("tiny", profile(tmp_path, role))
    assert {
        key: status[key] for key in ("live_version", "previous_version", "versions", "state")
    } == {
        "live_version": "1",
        "previous_version": "2",
        "versions": ["1", "2"],
        "state": "Active",
    }


def test_failed_step_moves_alias_back_provisioned_concurrency_missing_in_moto(
    tmp_path: Path, aws: Any, role: str, bundle: Bundle, driver: AwsLambda
) -> None:
    """moto does not implement PutProvisionedConcurrencyConfig (404): the deploy fails at that
    step, which exercises the alias rollback; the request we sent is checked via botocore events."""
    driver.deploy(bundle, profile(tmp_path, role))
    sent: list[dict[str, Any]] = []
    boto3.DEFAULT_SESSION.events.register(  # type: ignore[union-attr]
        "provide-client-params.lambda.PutProvisionedConcurrencyConfig",
        lambda params, **_: sent.append(dict(params)),
    )

    with pytest.raises(DeployError, match="step 'provisioned concurrency'"):
        driver.deploy(bundle, profile(tmp_path, role, "provisioned_concurrency = 2\n"))

    assert sent == [
        {"FunctionName": "tiny", "Qualifier": "live", "ProvisionedConcurrentExecutions": 2}
    ]
    assert aws.get_alias(FunctionName="tiny", Name="live")["FunctionVersion"] == "1"
    assert [v["Version"] for v in aws.list_versions_by_function(FunctionName="tiny")["Versions"]][
        -1
    ] == "2"


def test_missing_role_says_which_role_and_what_to_check(
    tmp_path: Path, endpoint: str, bundle: Bundle, driver: AwsLambda
) -> None:
    with pytest.raises(DeployError, match=r"cannot be assumed.*check role_arn") as caught:
        driver.deploy(bundle, profile(tmp_path, "arn:aws:iam::123456789012:role/nope"))
    assert "role/nope" in caught.value.message


def test_no_credentials_is_a_deploy_error_with_a_hint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bundle: Bundle
) -> None:
    for key in (*FAKE_CREDENTIALS, "AWS_PROFILE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("EDGESERVE_AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    boto3.setup_default_session()
    with pytest.raises(DeployError, match=r"no AWS credentials found\. Hint: set AWS_PROFILE"):
        AwsLambda().status("tiny", profile(tmp_path, ROLE))


def test_status_and_rollback_of_an_unknown_function(tmp_path: Path, endpoint: str) -> None:
    with pytest.raises(
        DeployError, match=r"ResourceNotFoundException.*deploy first, or check region"
    ):
        AwsLambda().status("ghost", profile(tmp_path, ROLE))
    with pytest.raises(DeployError, match="no previous version"):
        AwsLambda().rollback("ghost", profile(tmp_path, ROLE))


def test_rollback_after_a_single_deploy_has_nowhere_to_go(
    tmp_path: Path, role: str, bundle: Bundle, driver: AwsLambda
) -> None:
    driver.deploy(bundle, profile(tmp_path, role))
    with pytest.raises(DeployError, match="no previous version to return to"):
        driver.rollback("tiny", profile(tmp_path, role))


def test_a_zip_over_50_mb_is_deployed_from_s3(
    tmp_path: Path, aws: Any, role: str, bundle: Bundle, driver: AwsLambda, endpoint: str
) -> None:
    """Lambda takes a zip inline only up to 50 MB: a larger one goes to the account's code
    bucket (created on first use) and the function is created from that object."""
    house = wheelhouse(tmp_path, "bigdep", payload=os.urandom(51 << 20))  # incompressible
    settings = f'role_arn = "{role}"\nrequirements = ["bigdep"]\nwheelhouse = "{house}"\n'
    result = driver.deploy(bundle, load_target(write_profile(tmp_path / "big.toml", settings)))

    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    stored = s3.list_objects_v2(Bucket="edgeserve-code-123456789012-us-east-1")["Contents"]
    assert [item["Key"] for item in stored] == [f"tiny/{bundle.content_hash}.zip"]
    assert stored[0]["Size"] > 50 << 20
    body = s3.get_object(Bucket="edgeserve-code-123456789012-us-east-1", Key=stored[0]["Key"])
    config = aws.get_function_configuration(FunctionName="tiny", Qualifier="live")
    digest = hashlib.sha256(body["Body"].read()).digest()
    assert config["CodeSha256"] == base64.b64encode(digest).decode()
    assert (result.version, config["CodeSize"]) == ("1", stored[0]["Size"])


BROKEN_ON_LAMBDA = """\
import os

if "AWS_LAMBDA_FUNCTION_NAME" in os.environ:
    raise RuntimeError("MODEL_KEY is not set")
"""


def test_a_handler_failing_at_init_is_stopped_before_upload_and_the_alias_stays(
    tmp_path: Path, aws: Any, role: str, bundle: Bundle, driver: AwsLambda
) -> None:
    """The handler imports at build, but fails in Lambda's init: the preflight (the emulated
    Lambda runtime) catches it before any upload, so version 1 stays live and unchanged."""
    driver.deploy(bundle, profile(tmp_path, role))
    before = aws.get_function_configuration(FunctionName="tiny")["CodeSha256"]
    broken = small_bundle(tmp_path / "broken", handler=BROKEN_ON_LAMBDA + HANDLER)

    with pytest.raises(
        DeployError, match=r"preflight before upload failed: .*MODEL_KEY is not set"
    ):
        driver.deploy(broken, profile(tmp_path, role))

    assert aws.get_alias(FunctionName="tiny", Name="live")["FunctionVersion"] == "1"
    versions = aws.list_versions_by_function(FunctionName="tiny")["Versions"]
    assert [v["Version"] for v in versions] == ["$LATEST", "1"]
    assert aws.get_function_configuration(FunctionName="tiny")["CodeSha256"] == before


def test_a_failed_deploy_puts_the_url_permissions_and_reserved_concurrency_back(
    tmp_path: Path, aws: Any, role: str, bundle: Bundle, driver: AwsLambda
) -> None:
    """The new profile asks for a public URL, no reserved concurrency and provisioned
    concurrency (which moto lacks, so that step fails): the function keeps its IAM URL, no
    public permissions and its reserved concurrency of 2."""
    house = wheelhouse(tmp_path)
    common = f'role_arn = "{role}"\nrequirements = ["tinydep"]\nwheelhouse = "{house}"\n'
    first = write_profile(tmp_path / "iam.toml", common + 'url_auth_type = "AWS_IAM"\n')
    driver.deploy(bundle, load_target(first))
    aws.put_function_concurrency(FunctionName="tiny", ReservedConcurrentExecutions=2)
    second = common + 'url_auth_type = "NONE"\nprovisioned_concurrency = 1\n'

    with pytest.raises(DeployError, match="step 'provisioned concurrency'"):
        driver.deploy(bundle, load_target(write_profile(tmp_path / "public.toml", second)))

    assert aws.get_alias(FunctionName="tiny", Name="live")["FunctionVersion"] == "1"
    assert aws.get_function_url_config(FunctionName="tiny", Qualifier="live")["AuthType"] == (
        "AWS_IAM"
    )
    with pytest.raises(aws.exceptions.ResourceNotFoundException):
        aws.get_policy(FunctionName="tiny", Qualifier="live")
    assert aws.get_function_concurrency(FunctionName="tiny")["ReservedConcurrentExecutions"] == 2


@pytest.mark.parametrize("now", ["off", "AWS_IAM"])
def test_a_url_no_longer_public_loses_its_public_permissions(
    tmp_path: Path, aws: Any, role: str, bundle: Bundle, driver: AwsLambda, now: str
) -> None:
    """A public URL (NONE) redeployed with url_auth_type "off" stayed, public; with "AWS_IAM"
    its statements granting everyone the invocation stayed on the alias's policy."""
    common = (
        f'role_arn = "{role}"\nrequirements = ["tinydep"]\nwheelhouse = "{wheelhouse(tmp_path)}"\n'
    )
    public = write_profile(tmp_path / "public.toml", common + 'url_auth_type = "NONE"\n')
    first = driver.deploy(bundle, load_target(public))
    assert first.url is not None

    changed = write_profile(tmp_path / "changed.toml", common + f'url_auth_type = "{now}"\n')
    second = driver.deploy(bundle, load_target(changed))

    if now == "off":
        assert second.url is None
        with pytest.raises(aws.exceptions.ResourceNotFoundException):
            aws.get_function_url_config(FunctionName="tiny", Qualifier="live")
    else:
        url = aws.get_function_url_config(FunctionName="tiny", Qualifier="live")
        assert (url["AuthType"], url["FunctionUrl"]) == ("AWS_IAM", first.url)
    with pytest.raises(aws.exceptions.ResourceNotFoundException):
        aws.get_policy(FunctionName="tiny", Qualifier="live")


def test_a_failed_deploy_gives_a_public_url_its_permissions_back(
    tmp_path: Path, aws: Any, role: str, bundle: Bundle, driver: AwsLambda
) -> None:
    """The new profile makes the URL IAM-only (its public statements go) and asks for
    provisioned concurrency, which moto lacks: the URL is public again, both statements back."""
    common = (
        f'role_arn = "{role}"\nrequirements = ["tinydep"]\nwheelhouse = "{wheelhouse(tmp_path)}"\n'
    )
    public = write_profile(tmp_path / "public.toml", common + 'url_auth_type = "NONE"\n')
    driver.deploy(bundle, load_target(public))
    iam = common + 'url_auth_type = "AWS_IAM"\nprovisioned_concurrency = 1\n'

    with pytest.raises(DeployError, match="step 'provisioned concurrency'"):
        driver.deploy(bundle, load_target(write_profile(tmp_path / "iam.toml", iam)))

    assert aws.get_function_url_config(FunctionName="tiny", Qualifier="live")["AuthType"] == "NONE"
    statements = json.loads(aws.get_policy(FunctionName="tiny", Qualifier="live")["Policy"])[
        "Statement"
    ]
    assert sorted((s["Sid"], s["Action"]) for s in statements) == [
        ("edgeserve-url", "lambda:InvokeFunctionUrl"),
        ("edgeserve-url-invoke", "lambda:InvokeFunction"),
    ]


def test_a_redeploy_moves_the_function_to_the_profiles_python_and_architecture(
    tmp_path: Path, aws: Any, role: str, bundle: Bundle, driver: AwsLambda
) -> None:
    """The zip is built for the profile's Python and architecture; a redeploy that changed
    them uploaded it but left the function on the old runtime and architecture, where its
    wheels do not load. moto keeps no architecture on UpdateFunctionCode: the request is
    read through botocore's events."""
    common = (
        f'role_arn = "{role}"\nrequirements = ["tinydep"]\nwheelhouse = "{wheelhouse(tmp_path)}"\n'
    )
    driver.deploy(bundle, load_target(write_profile(tmp_path / "first.toml", common)))
    sent: list[dict[str, Any]] = []
    boto3.DEFAULT_SESSION.events.register(  # type: ignore[union-attr]
        "provide-client-params.lambda.UpdateFunctionCode",
        lambda params, **_: sent.append({k: v for k, v in params.items() if k != "ZipFile"}),
    )
    moved = common + 'python_version = "3.13"\narchitecture = "arm64"\n'

    second = driver.deploy(bundle, load_target(write_profile(tmp_path / "moved.toml", moved)))

    config = aws.get_function_configuration(FunctionName="tiny", Qualifier="live")
    assert (second.version, config["Runtime"], config["Handler"]) == (
        "2",
        "python3.13",
        "app.handler",
    )
    assert sent == [{"FunctionName": "tiny", "Architectures": ["arm64"]}]


NEEDS_MODEL_KEY = """\
import os

if "AWS_LAMBDA_FUNCTION_NAME" in os.environ and os.environ.get("MODEL_KEY") != "k-123":
    raise RuntimeError("MODEL_KEY is not set")
"""


def test_the_preflight_runs_with_the_profiles_environment(
    tmp_path: Path, aws: Any, role: str, driver: AwsLambda, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The function reads MODEL_KEY, which the profile's `environment` gives it on Lambda: the
    preflight ran without it, failed at init and refused the deploy."""
    monkeypatch.delenv("MODEL_KEY", raising=False)
    needs_key = small_bundle(tmp_path / "key", handler=NEEDS_MODEL_KEY + HANDLER)
    settings = (
        f'role_arn = "{role}"\nrequirements = ["tinydep"]\nwheelhouse = "{wheelhouse(tmp_path)}"\n'
        'environment = { EDGESERVE_BACKEND = "onnxruntime", MODEL_KEY = "k-123" }\n'
    )

    result = driver.deploy(needs_key, load_target(write_profile(tmp_path / "key.toml", settings)))

    config = aws.get_function_configuration(FunctionName="tiny", Qualifier="live")
    assert (result.version, config["Environment"]["Variables"]) == (
        "1",
        {"EDGESERVE_BACKEND": "onnxruntime", "MODEL_KEY": "k-123"},
    )


HAND_CORS = {"AllowOrigins": ["*"], "AllowMethods": ["POST"]}
PAGE_ORIGINS = 'environment = { EDGESERVE_CORS_ORIGINS = "http://page.test" }\n'


@pytest.fixture
def clearing_cors(monkeypatch: pytest.MonkeyPatch) -> None:
    """moto (5.x) keeps a URL's Cors when an update sends an empty one; AWS clears it (an update
    without Cors keeps it): moto is taught AWS's rule, so the deploy is seen doing what works."""
    from moto.awslambda.models import FunctionUrlConfig

    keep = FunctionUrlConfig.update

    def update(self: FunctionUrlConfig, new_config: dict[str, Any]) -> None:
        if new_config.get("Cors") == {}:
            self.config.pop("Cors", None)
        keep(self, new_config)

    monkeypatch.setattr(FunctionUrlConfig, "update", update)


@pytest.mark.usefixtures("clearing_cors")
def test_a_cors_put_on_the_url_by_hand_goes_where_the_app_answers_cors_on_moto_taught_awss_rule(
    tmp_path: Path,
    aws: Any,
    role: str,
    bundle: Bundle,
    driver: AwsLambda,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A Cors set on the function URL in the console answered beside the app's own CORS
    headers, two Access-Control-Allow-Origin values that every browser refuses, and deploys
    kept it: now a function with CORS origins has it removed, saying so; a failed deploy puts
    it back; a function without origins keeps it (the URL's is then the only answer)."""
    url = {"FunctionName": "tiny", "Qualifier": "live"}
    driver.deploy(bundle, profile(tmp_path, role))
    aws.update_function_url_config(**url, AuthType="NONE", Cors=HAND_CORS)
    driver.deploy(bundle, profile(tmp_path, role))
    assert aws.get_function_url_config(**url)["Cors"] == HAND_CORS  # no origins: kept

    with pytest.raises(DeployError, match="step 'provisioned concurrency'"):
        failing = PAGE_ORIGINS + "provisioned_concurrency = 1\n"
        driver.deploy(bundle, profile(tmp_path, role, failing))
    assert aws.get_function_url_config(**url)["Cors"] == HAND_CORS  # put back

    caplog.clear()
    driver.deploy(bundle, profile(tmp_path, role, PAGE_ORIGINS))
    assert not aws.get_function_url_config(**url).get("Cors")
    assert "removed the function URL's Cors setting" in caplog.text
    assert '"AllowOrigins": ["*"]' in caplog.text
