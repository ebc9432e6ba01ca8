"""An input the model declares no shape for (no `shape` in its type: any rank, any dims, as
opposed to `shape {}`, rank 0), driven as a user drives it: `edgeserve init`, `build`, `serve`
(one process, and fronts before an inference process), v2 and /invoke requests, the metadata
and the model config."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from edgeserve.cli import main
from tests.models import any_rank_model
from tests.server import running

INFER = "/v2/models/fn/infer"


def v2(x: np.ndarray) -> dict[str, Any]:
    data = x.ravel().tolist()
    return {"inputs": [{"name": "x", "datatype": "FP32", "shape": list(x.shape), "data": data}]}


@pytest.fixture
def function(tmp_path: Path) -> Path:
    """`edgeserve init` of the model, which says what it found, its backend left to choose."""
    dest = tmp_path / "fn"
    assert main(["init", str(dest), "--model", str(any_rank_model(tmp_path / "m.onnx"))]) == 0
    text = (dest / "function.toml").read_text()
    assert "#   input   x  FP32 [-1] (no shape in the model)\n" in text
    assert (
        "# No batching: the model has no batch axis (x any shape: no dynamic first dim), so" in text
    )
    return dest


@pytest.mark.parametrize("workers", ["1", "2"], ids=["one process", "front processes"])
def test_an_input_of_no_declared_shape_takes_requests_of_any_shape(
    function: Path, workers: str
) -> None:
    """It was read as rank 0: the metadata said shape [] and every real request was refused
    ("tensor `x`: expected [] FP32, got [2, 3] FP32"). Its dims now read [-1] (unknown, as
    Triton shows a dim it cannot know) and a request of any rank reaches the model, a scalar
    included; its datatype is still held to the model's."""
    shapes = [(), (3,), (2, 3), (1, 2, 2)]
    with running(function, "--workers", workers) as (url, _):
        metadata = httpx.get(f"{url}/v2/models/fn", timeout=30).json()
        config = httpx.get(f"{url}/v2/models/fn/config", timeout=30).json()
        answers = [
            httpx.post(f"{url}{INFER}", json=v2(np.arange(np.prod(s), dtype=np.float32).reshape(s)))
            for s in shapes
        ]
        invoked = httpx.post(f"{url}/invoke", json={"x": [[1, 2], [3, 4]]}, timeout=30)
        scalar = httpx.post(f"{url}/invoke", json={"x": 5}, timeout=30)
        deep = httpx.post(f"{url}/invoke", json={"x": nested(33)}, timeout=30)
        wrong = httpx.post(f"{url}{INFER}", json={"inputs": [
            {"name": "x", "datatype": "INT32", "shape": [2], "data": [1, 2]}
        ]})  # fmt: skip
    assert metadata["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1]}]
    assert (config["max_batch_size"], config["input"][0]["dims"]) == (0, [-1])
    for shape, answer in zip(shapes, answers, strict=True):
        assert answer.status_code == 200, answer.text
        output = answer.json()["outputs"][0]
        assert output["shape"] == list(shape)
        assert output["data"] == (2 * np.arange(np.prod(shape))).tolist()
    assert (invoked.json(), scalar.json()) == ({"y": [[2.0, 4.0], [6.0, 8.0]]}, {"y": 10.0})
    assert (wrong.status_code, wrong.json()) == (
        400,
        {"error": "tensor `x`: expected any shape FP32, got [2] INT32"},
    )
    assert (deep.status_code, deep.json()) == (  # it said "deeper than the tensor's 32 dims"
        400,
        {
            "error": "tensor `x`: FP32 any shape: `data` is nested deeper than 32 lists, the "
            "most dims a tensor may have"
        },
    )


def nested(levels: int) -> Any:
    value: Any = 1.0
    for _ in range(levels):
        value = [value]
    return value


def test_openvino_which_cannot_compile_any_rank_is_passed_over_saying_why(
    function: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """OpenVINO's CPU plugin refuses such a model at load ("doesn't support Parameter
    operation with dynamic rank"): the function built and the server died on it. The choice
    now passes it over for ONNX Runtime, and a manifest that wants OpenVINO alone is refused
    at build, saying why."""
    manifest = function / "function.toml"
    manifest.write_text(manifest.read_text() + '[backend]\nprefer = ["openvino"]\n')
    assert main(["build", str(function), "--out", str(tmp_path / "out")]) == 2
    said = " ".join(capsys.readouterr().err.split())
    assert "openvino needs each input's rank, and ['x'] declare no shape" in said
