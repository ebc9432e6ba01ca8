"""A backend that refuses the model: build plans the others, serve --backend plans its own."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from edgeserve.bundle import Bundle
from edgeserve.cli import main
from tests.models import determinant_model, identity_model, write_function
from tests.server import running, served

OPENVINO_ONLY = '[function]\nname = "det"\n[backend]\nprefer = ["openvino"]\n'
DET = {"name": "x", "shape": [1, 3, 3], "datatype": "FP32", "data": [2, 0, 0, 0, 3, 0, 0, 0, 4]}


@pytest.fixture(autouse=True)
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("EDGESERVE_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_build_plans_past_a_backend_that_refuses_the_model_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = write_function(tmp_path / "det", determinant_model, '[function]\nname = "det"\n')
    assert main(["build", str(folder), "--out", str(tmp_path / "out")]) == 0
    said = capsys.readouterr().out.replace("\n", "")
    assert "warning: openvino refuses the model, so the bundle plans onnxruntime only" in said
    assert f"cannot convert {folder / 'model.onnx'} to IR" in said  # not a scratch copy
    assert "Det" in said  # OpenVINO's own words
    bundle = Bundle.open(tmp_path / "out")
    assert bundle.planned_backends() == ("onnxruntime",)
    assert not any(line.startswith("openvino") for line in bundle.requirements("local"))
    assert bundle.file("model/model.xml") is None


def test_a_function_whose_only_backend_refuses_the_model_fails_to_build(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = write_function(tmp_path / "det", determinant_model, OPENVINO_ONLY)
    assert main(["build", str(folder), "--out", str(tmp_path / "out")]) != 0
    assert "Det" in capsys.readouterr().err


@pytest.mark.parametrize("forcing", [("--backend", "onnxruntime"), ()])
def test_serve_with_a_forced_backend_plans_that_backend_alone(
    tmp_path: Path, forcing: tuple[str, ...]
) -> None:
    folder = write_function(tmp_path / "det", determinant_model, OPENVINO_ONLY)
    env = {} if forcing else {"EDGESERVE_BACKEND": "onnxruntime"}
    with served(folder, *forcing, env=env) as url:
        answer = httpx.post(f"{url}/v2/models/det/infer", json={"inputs": [DET]}).json()
    assert answer["outputs"][0]["data"] == [24.0]
    # the bundle cached for onnxruntime alone is not what a serve forcing nothing opens
    plain = [sys.executable, "-m", "edgeserve", "serve", str(folder), "--port", "0"]
    refused = subprocess.run(plain, capture_output=True, text=True, timeout=60, check=False)
    assert refused.returncode != 0
    assert "Det" in refused.stderr


def test_a_backend_forced_on_a_bundle_not_planned_for_it_is_said_with_why(tmp_path: Path) -> None:
    """An FP64 model plans ONNX Runtime alone (OpenVINO computes FP64 in FP32): forcing
    OpenVINO on its bundle serves, as forced, with a warning naming the plan and the reason
    (it served with none)."""
    folder = write_function(
        tmp_path / "fn", lambda path: identity_model(path, ("FP64",)), '[function]\nname = "fn"\n'
    )
    assert main(["build", str(folder), "--out", str(tmp_path / "out")]) == 0
    with running(tmp_path / "out", "--backend", "openvino") as (url, server):
        assert httpx.get(f"{url}/v2/health/ready").status_code == 200
    said = "".join(server.output)
    assert (
        "WARNING: openvino is not a backend this bundle was planned for (onnxruntime), since "
        "openvino has no FP64 tensors (`in_FP64`): it serves the model unchecked by build"
    ) in said
