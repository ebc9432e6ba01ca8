"""A name from a fixed set, misspelt on the command line, in a profile, an environment
variable or a request, is refused with the closest name it could have meant."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.models import mlp_model, write_function
from tests.server import served

MANIFEST = '[function]\nname = "mlp"\n[backend]\nprefer = ["onnxruntime"]\n'


@pytest.fixture(autouse=True)
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EDGESERVE_CACHE_DIR", str(tmp_path / "cache"))


def _run(*argv: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "edgeserve", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "200", **env},
    )


def _said(done: subprocess.CompletedProcess[str]) -> str:
    return " ".join(done.stderr.split())


def test_a_misspelt_target_gets_the_closest_profile(tmp_path: Path) -> None:
    folder = write_function(tmp_path / "mlp", mlp_model, MANIFEST)
    done = _run("build", str(folder), "--out", str(tmp_path / "out"), "--target", "aws-lamda")
    assert done.returncode == 2
    assert "target 'aws-lamda': no aws-lamda.toml in " in _said(done)
    assert "; did you mean `aws-lambda`? (shipped profiles: [" in _said(done)


def test_a_misspelt_driver_in_a_profile_gets_the_closest_kind(tmp_path: Path) -> None:
    folder = write_function(tmp_path / "mlp", mlp_model, MANIFEST)
    (profile := tmp_path / "lab.toml").write_text('driver = "jetsn"\n', encoding="utf-8")
    done = _run("build", str(folder), "--out", str(tmp_path / "out"), "--target", str(profile))
    assert done.returncode == 2
    assert f"{profile}: field `driver`: unknown driver 'jetsn'; expected one of" in _said(done)
    assert "did you mean `jetson`?" in _said(done)


def test_a_misspelt_backend_in_the_environment_gets_the_closest(tmp_path: Path) -> None:
    folder = write_function(tmp_path / "mlp", mlp_model, MANIFEST)
    done = _run("doctor", str(folder), EDGESERVE_BACKEND="openvno")
    assert done.returncode == 2
    assert _said(done) == (
        "error: backend 'openvno' (from EDGESERVE_BACKEND=openvno): unknown; expected one of "
        "['onnxruntime', 'openvino', 'tensorrt']; did you mean `openvino`?"
    )


def test_a_misspelt_datatype_in_a_request_gets_the_closest(tmp_path: Path) -> None:
    folder = write_function(tmp_path / "mlp", mlp_model, MANIFEST)
    body = {"inputs": [{"name": "x", "shape": [1, 16], "datatype": "FP3", "data": [0.5] * 16}]}
    with served(folder) as url:
        answer = httpx.post(f"{url}/v2/models/mlp/infer", json=body, timeout=30)
    assert answer.status_code == 400
    assert "unknown datatype 'FP3'; expected one of [" in answer.json()["error"]
    assert answer.json()["error"].endswith("; did you mean `FP32`?")
