"""The CLI verbs for aws-lambda, through `edgeserve.cli.main`: build packages, deploy, status
and rollback against moto in server mode; a failed deploy exits 3 with what to do."""

from __future__ import annotations

import json
from pathlib import Path

import boto3
import pytest

from edgeserve.cli import main
from tests.aws_lambda_support import FAKE_CREDENTIALS, ROLE, TRUST, moto_endpoint, wheelhouse
from tests.models import mlp_model


@pytest.fixture
def source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A function folder carrying its own aws-lambda.toml (found before ./targets and shipped)."""
    monkeypatch.setenv("EDGESERVE_CACHE_DIR", str(tmp_path / "cache"))
    folder = tmp_path / "clifn"
    folder.mkdir()
    mlp_model(folder / "model.onnx")
    (folder / "function.toml").write_text('[function]\nname = "clifn"\n')
    (folder / "aws-lambda.toml").write_text(
        'driver = "aws-lambda"\n[settings]\n'
        f'role_arn = "{ROLE}"\nurl_auth_type = "NONE"\n'
        f'requirements = ["tinydep"]\nwheelhouse = "{wheelhouse(tmp_path)}"\n'
    )
    return folder


def test_build_target_aws_lambda_writes_the_zip_and_sam_template(
    source: Path, tmp_path: Path
) -> None:
    assert (
        main(
            [
                "build",
                str(source),
                "--out",
                str(tmp_path / "build" / "clifn"),
                "--target",
                "aws-lambda",
            ]
        )
        == 0
    )
    dist = tmp_path / "build" / "dist" / "clifn-aws-lambda"
    assert (dist / "clifn-aws-lambda.zip").is_file()
    assert 'CodeUri: "clifn-aws-lambda.zip"' in (dist / "template.yaml").read_text()


def test_deploy_status_rollback(
    source: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for key, value in FAKE_CREDENTIALS.items():
        monkeypatch.setenv(key, value)
    boto3.setup_default_session()
    with moto_endpoint() as url:
        monkeypatch.setenv("EDGESERVE_AWS_ENDPOINT_URL", url)
        assert main(["deploy", str(source), "--target", "aws-lambda"]) == 3  # no such role yet
        assert "cannot be assumed by Lambda; check role_arn" in capsys.readouterr().err
        boto3.client("iam", endpoint_url=url).create_role(
            RoleName="edgeserve-lambda", AssumeRolePolicyDocument=json.dumps(TRUST)
        )

        assert main(["deploy", str(source), "--target", "aws-lambda"]) == 0
        assert main(["deploy", str(source), "--target", "aws-lambda"]) == 0
        assert "clifn 2" in capsys.readouterr().out
        assert main(["rollback", str(source), "--target", "aws-lambda"]) == 0
        capsys.readouterr()
        assert main(["status", str(source), "--target", "aws-lambda"]) == 0
        status = json.loads(capsys.readouterr().out)
        alias = boto3.client("lambda", endpoint_url=url).get_alias(
            FunctionName="clifn", Name="live"
        )

    assert (status["live_version"], status["previous_version"], status["versions"]) == (
        "1",
        "2",
        ["1", "2"],
    )
    assert alias["FunctionVersion"] == "1"


def test_build_for_lambda_over_a_local_build_says_serve_now_runs_the_lambda_plan(
    source: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`build --target aws-lambda` writes build/NAME, where a local build was (the emulator
    serves it from there, docs/aws-lambda.md); it replaced that in silence, and `serve
    build/NAME` then ran ONNX Runtime alone. Build now says so, with the way to keep both."""
    out = tmp_path / "build" / "clifn"
    assert main(["build", str(source), "--out", str(out)]) == 0
    assert main(["build", str(source), "--out", str(out), "--target", "aws-lambda"]) == 0
    replaced = capsys.readouterr().out
    assert main(["build", str(source), "--out", str(out)]) == 0
    back = capsys.readouterr().out
    said = " ".join(replaced.split())
    assert "planned for local: this one is planned for aws-lambda, so `edgeserve serve " in said
    assert f"serve {out}` serves that plan (onnxruntime). Hint: --out elsewhere keeps a " in said
    assert "planned for aws-lambda: this one is planned for local, so" in " ".join(back.split())
    assert "Hint" not in back
