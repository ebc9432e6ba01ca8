"""Packaging for AWS Lambda: the zip (layout, determinism, limits), the image context and the
SAM template (checked by cfn-lint). The settings replace the bundle's requirements with one
small pure-Python wheel from a local wheelhouse, so pip runs offline with the real platform
flags."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from edgeserve.aws_lambda.driver import AwsLambda
from edgeserve.aws_lambda.image import lambda_image_plan
from edgeserve.aws_lambda.package import at_most, check_size, package_zip
from edgeserve.aws_lambda.sam import sam_template
from edgeserve.aws_lambda.settings import LambdaSettings, for_bundle
from edgeserve.builder import build
from edgeserve.bundle import Bundle
from edgeserve.errors import ConfigError, DeployError
from edgeserve.profiles import load_target
from edgeserve.targets import package_targets
from tests.aws_lambda_support import FUNCTION_TOML, small_bundle, wheelhouse, write_profile
from tests.models import mlp_model
from tests.terminal import in_terminal

CFN_LINT = shutil.which("cfn-lint", path=str(Path(sys.executable).parent)) or shutil.which(
    "cfn-lint"
)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Bundle:
    return small_bundle(tmp_path_factory.mktemp("package"))


def test_zip_holds_the_task_root_and_is_deterministic(bundle: Bundle, tmp_path: Path) -> None:
    settings = LambdaSettings(requirements=("tinydep",), wheelhouse=str(wheelhouse(tmp_path)))
    first = package_zip(bundle, settings, tmp_path / "a")
    second = package_zip(bundle, settings, tmp_path / "b")

    names = zipfile.ZipFile(first).namelist()
    assert first.name == "tiny-aws-lambda.zip"
    assert names == sorted(names)
    assert {
        "app.py",
        "edgeserve/aws_lambda/adapter.py",
        "edgeserve/runtime.py",
        "edgeserve/templates/openapi/docs.html",  # read when the app is created
        "tinydep/__init__.py",
    } <= set(names)
    assert {f"bundle/{name}" for name in bundle.metadata["files"]} <= set(names)
    assert not [name for name in names if "__pycache__" in name or name.endswith(".pyc")]
    assert "handler = create_handler()" in zipfile.ZipFile(first).read("app.py").decode()
    assert {info.date_time for info in zipfile.ZipFile(first).infolist()} == {(1980, 1, 1, 0, 0, 0)}
    # edgeserve's own sources are shared with engineers editing them; compare the rest bytewise
    stable = [n for n in names if not n.startswith("edgeserve/")]
    assert [zipfile.ZipFile(first).read(n) for n in stable] == [
        zipfile.ZipFile(second).read(n) for n in stable
    ]


def test_pip_gets_wheels_for_the_profiles_platform_or_says_why(
    bundle: Bundle, tmp_path: Path
) -> None:
    arm = LambdaSettings(
        architecture="arm64",
        python_version="3.13",
        requirements=("missingdep",),
        wheelhouse=str(wheelhouse(tmp_path)),
    )
    with pytest.raises(DeployError) as caught:
        package_zip(bundle, arm, tmp_path)
    assert "manylinux2014_aarch64 to manylinux_2_34_aarch64 wheels for Python 3.13" in (
        caught.value.message
    )
    assert 'package_type = "image"' in caught.value.message


def test_over_250_mb_unzipped_points_to_the_image_package_type() -> None:
    with pytest.raises(DeployError) as caught:
        check_size(251 * 2**20, "fn")
    assert "fn: its zip package would be 251.0 MB unzipped, over Lambda's 250 MB" in (
        caught.value.message
    )
    assert 'Hint: set package_type = "image"' in caught.value.message
    check_size(250 * 2**20, "fn")  # at the limit: fine


@pytest.mark.parametrize(
    ("requirement", "resolved"),
    [
        ("numpy==2.4.6", "numpy<=2.4.6"),
        ("onnxruntime==1.32.0", "onnxruntime<=1.32.0"),
        ("pillow>=10", "pillow>=10"),
        ("torch==2.2; python_version < '3.13'", "torch==2.2; python_version < '3.13'"),
    ],
)
def test_pins_give_way_to_older_versions_only_where_no_wheel_fits(
    requirement: str, resolved: str
) -> None:
    assert at_most(requirement) == resolved


def test_the_image_is_single_arch_on_the_lambda_base_image(bundle: Bundle) -> None:
    """The plan alone (pure); tests/test_image.py builds and runs a Lambda image for real."""
    settings = LambdaSettings(package_type="image", architecture="arm64", python_version="3.12")
    plan = lambda_image_plan(bundle, settings, bundle.requirements("aws-lambda"))
    text = plan.containerfile()
    assert text.startswith("FROM --platform=linux/arm64 public.ecr.aws/lambda/python:3.12\n")
    assert "COPY --chown=0:0 app /var/task\n" in text and "WORKDIR /var/task\n" in text
    assert "USER" not in text and "ENTRYPOINT" not in text  # the base's entry point and user
    assert text.endswith('CMD ["app.handler"]\n')
    assert plan.requirements == tuple(bundle.requirements("aws-lambda"))


def test_another_base_gets_the_runtime_interface_client(bundle: Bundle) -> None:
    settings = LambdaSettings(package_type="image", base_image="debian-python:3.11")
    plan = lambda_image_plan(bundle, settings, ["numpy==2.0"])
    assert plan.requirements == ("numpy==2.0", "awslambdaric")
    assert 'ENTRYPOINT ["python3", "-m", "awslambdaric"]\n' in plan.containerfile()


@pytest.mark.skipif(CFN_LINT is None, reason="cfn-lint is not installed")
@pytest.mark.parametrize(
    "settings",
    [
        LambdaSettings(
            url_auth_type="NONE",
            reserved_concurrency=4,
            provisioned_concurrency=1,
            environment={"A": "b", "EDGESERVE_CORS_ORIGINS": "https://demo.example.com"},
        ),
        LambdaSettings(
            package_type="image", role_arn="arn:aws:iam::123456789012:role/r", url_auth_type="off"
        ),
    ],
    ids=["zip", "image"],
)
def test_sam_template_passes_cfn_lint(settings: LambdaSettings, tmp_path: Path) -> None:
    template = tmp_path / "template.yaml"
    template.write_text(sam_template("ocr", settings, "ocr-aws-lambda.zip"))
    done = subprocess.run(
        [str(CFN_LINT), str(template)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_sam_template_carries_the_profile() -> None:
    text = sam_template(
        "ocr", LambdaSettings(memory_mb=3008, timeout_s=60, url_auth_type="NONE"), "ocr.zip"
    )
    lines = text.splitlines()
    for line in (
        'FunctionName: "ocr"',
        "MemorySize: 3008",
        "Timeout: 60",
        'Handler: "app.handler"',
    ):
        assert f"      {line}" in lines
    for line in ('CodeUri: "ocr.zip"', 'AutoPublishAlias: "live"', 'Runtime: "python3.12"'):
        assert f"      {line}" in lines
    assert '        AuthType: "NONE"' in lines


def test_sam_templates_url_leaves_cors_to_the_app() -> None:
    """The app answers CORS (http/cors.py): a `Cors` on the URL as well would send browsers
    two Allow-Origin values, which they refuse. The origins travel as the app reads them."""
    origins = {"EDGESERVE_CORS_ORIGINS": "https://demo.example.com"}
    settings = LambdaSettings(url_auth_type="NONE", environment=origins)
    text = sam_template("ocr", settings, "ocr.zip")
    assert '          EDGESERVE_CORS_ORIGINS: "https://demo.example.com"' in text.splitlines()
    assert 'FunctionUrlConfig:\n        AuthType: "NONE"\n' in text and "Cors" not in text


def test_build_target_packaging_writes_zip_and_template(bundle: Bundle, tmp_path: Path) -> None:
    """What `edgeserve build --target aws-lambda` runs after building (profile from ./targets)."""
    function_dir = tmp_path / "fn"
    function_dir.mkdir()
    wheels = wheelhouse(tmp_path)
    settings = f'url_auth_type = "NONE"\nrequirements = ["tinydep"]\nwheelhouse = "{wheels}"\n'
    write_profile(function_dir / "aws-lambda.toml", settings)
    code = AwsLambda().package(bundle, load_target("aws-lambda", function_dir), tmp_path / "dist")
    assert code == tmp_path / "dist" / "tiny-aws-lambda.zip"
    assert 'CodeUri: "tiny-aws-lambda.zip"' in (tmp_path / "dist" / "template.yaml").read_text()
    assert (
        package_targets(bundle, ["local"], tmp_path / "dist", function_dir) == []
    )  # nothing to package


@pytest.mark.parametrize("terminal", [True, False], ids=["terminal", "pipe"])
def test_build_shows_pips_steps_live_on_a_terminal_only(tmp_path: Path, terminal: bool) -> None:
    """`edgeserve build --target aws-lambda`: the wheels pip fetches show as it goes."""
    source = tmp_path / "fn"
    source.mkdir()
    mlp_model(source / "model.onnx")
    (source / "function.toml").write_text(FUNCTION_TOML.format(name="fn"))
    settings = f'requirements = ["tinydep"]\nwheelhouse = "{wheelhouse(tmp_path)}"\n'
    write_profile(source / "aws-lambda.toml", settings)
    command = [sys.executable, "-m", "edgeserve", "build", str(source), "--target", "aws-lambda"]
    command += ["--out", str(tmp_path / "build" / "fn")]
    if terminal:
        code, output = in_terminal(command)
    else:
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        code, output = done.returncode, done.stdout + done.stderr
    assert code == 0, output
    assert "packaged" in output and "fn-aws-lambda.zip" in output
    assert ("packaging: pip: Processing" in output and "tinydep" in output) == terminal


def sized_bundle(tmp_path: Path, memory: str) -> Bundle:
    """A bundle whose function.toml says `memory` under [resources] (nothing: "")."""
    source = tmp_path / "src"
    source.mkdir()
    mlp_model(source / "model.onnx")
    (source / "function.toml").write_text(
        FUNCTION_TOML.format(name="tiny") + (f"\n[resources]\n{memory}\n" if memory else "")
    )
    return build(source, tmp_path / "bundle", targets=("aws-lambda",))


@pytest.mark.parametrize(
    ("function", "profile", "memory_mb"),
    [
        ("memory_mb = 3008", "", 3008),  # the function's own
        ("memory_mb = 3008", "memory_mb = 1536", 1536),  # the profile's over it
        ("", "", 2048),  # neither: Lambda's default
        ("port = 9000", "", 2048),  # [resources] without memory_mb
    ],
)
def test_lambda_memory_is_the_profiles_else_the_functions(
    tmp_path: Path, function: str, profile: str, memory_mb: int
) -> None:
    """`[resources] memory_mb` of function.toml, which `edgeserve help manifest` says Lambda
    reads, was read by the Kubernetes targets alone: Lambda ran at 2048 MB whatever it said."""
    bundle = sized_bundle(tmp_path, function)
    target = load_target(write_profile(tmp_path / "lambda.toml", profile + "\n"))

    settings = for_bundle(target, bundle)

    assert settings.memory_mb == memory_mb
    assert f"      MemorySize: {memory_mb}" in sam_template("tiny", settings, "tiny.zip")


def test_a_functions_memory_past_lambdas_range_is_refused_naming_both_places(
    tmp_path: Path,
) -> None:
    bundle = sized_bundle(tmp_path, "memory_mb = 20000")
    target = load_target(write_profile(tmp_path / "lambda.toml", "\n"))
    with pytest.raises(ConfigError) as refused:
        for_bundle(target, bundle)
    assert "[resources] memory_mb = 20000: Lambda sizes a function from 128 to 10240 MB" in str(
        refused.value
    )
    assert f"Hint: set memory_mb in the {tmp_path / 'lambda.toml'} [settings]" in str(refused.value)
