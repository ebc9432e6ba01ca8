"""Optional inputs: a graph input that also has an initializer (older exporters,
`keep_initializers_as_inputs`), driven as a user drives it: `edgeserve init`, `serve` (one
process, and fronts before an inference process), v2 and /invoke requests, the metadata and the
model config. Sent, it is used; left out, the initializer's default is; requests that send
different inputs never share a batch that would mix them up."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from edgeserve.cli import main
from tests.models import OPTIONAL_DEFAULTS, optional_model
from tests.server import running

X = np.arange(8, dtype=np.float32).reshape(2, 4) / 8
SCALE = np.array([3.0], np.float32)
BIAS = np.array([[1.0, -1.0, 2.0, -2.0], [0.0, 0.5, 0.0, 0.5]], np.float32)
W = np.eye(4, 3, dtype=np.float32) * 2
INFER = "/v2/models/fn/infer"


def expected(**sent: np.ndarray) -> np.ndarray:
    """What the model answers for X with `sent`, the rest at the model's defaults."""
    given = {**OPTIONAL_DEFAULTS, **sent}
    return (X * given["scale"] + given["bias"]) @ given["w"]


def v2(**sent: np.ndarray) -> dict[str, Any]:
    tensors = {"x": X, **sent}
    return {
        "inputs": [
            {"name": n, "datatype": "FP32", "shape": list(a.shape), "data": a.ravel().tolist()}
            for n, a in tensors.items()
        ]
    }


def answer(response: httpx.Response) -> np.ndarray:
    assert response.status_code == 200, response.text
    output = response.json()["outputs"][0]
    return np.array(output["data"], np.float32).reshape(output["shape"])


async def send_together(url: str, bodies: list[dict[str, Any]]) -> list[httpx.Response]:
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        return await asyncio.gather(*(client.post(INFER, json=body) for body in bodies))


@pytest.fixture
def function(tmp_path: Path) -> Path:
    """`edgeserve init` of the model, batching 4 requests at a time (waiting up to 0.5 s)."""
    dest = tmp_path / "fn"
    assert main(["init", str(dest), "--model", str(optional_model(tmp_path / "old.onnx"))]) == 0
    manifest = dest / "function.toml"
    text = manifest.read_text()
    assert "#   input   x      FP32 [-1, 4]\n" in text
    for name, dims in (("scale", [1]), ("bias", [-1, 4]), ("w", [4, 3])):
        assert (
            f"#   input   {name:<5}  FP32 {dims} (optional: the model holds a default, used "
            "where not sent)\n"
        ) in text
    assert "[batching]" in text  # optional inputs take no part in the batching rule
    batching = "preferred_batch_sizes = [4]\nmax_queue_delay_ms = 500\n"
    resources = "[resources]\nprocesses_per_device = 1"
    manifest.write_text(text.replace("max_queue_delay_ms = 2.0", batching + resources))
    return dest


@pytest.mark.parametrize(
    ("backend", "workers"),
    [("onnxruntime", "1"), ("openvino", "1"), ("onnxruntime", "2"), ("openvino", "2")],
)
def test_an_optional_input_sent_is_used_and_left_out_is_its_default(
    function: Path, backend: str, workers: str
) -> None:
    """Sending `scale` was refused ("inputs: expected ['x']; unknown ['scale']"), the
    metadata did not list it, and init's manifest did not either. Now each request gets the
    answer of the inputs it sent, the others at their defaults, though all 5 arrived together:
    those sending the same inputs share a batch (the two of `x` alone, 2 rows each), one
    sending other inputs with a batch axis another (`bias`), one sending `scale` or `w` (no
    batch axis: its values are its own) one of its own, at once."""
    manifest = function / "function.toml"
    backend_section = f'[backend]\nprefer = ["{backend}"]\nprecision = "fp32"\n'
    manifest.write_text(manifest.read_text() + backend_section)
    bodies = [v2(), v2(scale=SCALE), v2(bias=BIAS), v2(), v2(bias=BIAS[::-1], w=W)]
    wanted = [expected(), expected(scale=SCALE), expected(bias=BIAS), expected()]
    wanted.append(expected(bias=BIAS[::-1], w=W))
    with running(function, "--workers", workers) as (url, _):
        responses = asyncio.run(send_together(url, bodies))
        invoked = httpx.post(f"{url}/invoke", json={"x": X.tolist(), "scale": [3.0]}, timeout=30)
        metadata = httpx.get(f"{url}/v2/models/fn").json()
        config = httpx.get(f"{url}/v2/models/fn/config").json()
        stats = httpx.get(f"{url}/v2/models/fn/stats").json()["model_stats"][0]
    for response, want in zip(responses, wanted, strict=True):
        np.testing.assert_allclose(answer(response), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(invoked.json()["y"], expected(scale=SCALE), rtol=1e-5, atol=1e-5)
    assert [(i["name"], i["shape"]) for i in metadata["inputs"]] == [
        ("x", [-1, 4]), ("scale", [1]), ("bias", [-1, 4]), ("w", [4, 3])
    ]  # fmt: skip
    assert [(i["name"], i["dims"], i["optional"]) for i in config["input"]] == [
        ("x", [4], False), ("scale", [1], True), ("bias", [4], True), ("w", [4, 3], True)
    ]  # fmt: skip
    assert config["max_batch_size"] == 32
    # x alone twice (4 rows), x + bias, x + scale alone, x + bias + w alone, then /invoke
    assert (stats["execution_count"], stats["inference_count"]) == (5, 12)


def test_what_a_request_may_send_is_said_when_it_sends_otherwise(function: Path) -> None:
    with running(function, "--workers", "1") as (url, _):
        unknown = httpx.post(f"{url}{INFER}", json=v2(shift=SCALE), timeout=30)
        wrong = httpx.post(f"{url}{INFER}", json=v2(w=W[:, :2]), timeout=30)
        rows = httpx.post(f"{url}{INFER}", json=v2(bias=BIAS[:1]), timeout=30)
        missing = httpx.post(f"{url}/invoke", json={"scale": [3.0]}, timeout=30)
    assert (unknown.status_code, unknown.json()) == (400, {
        "error": "inputs: expected ['x'] (optional: ['bias', 'scale', 'w']); unknown ['shift']"
    })  # fmt: skip
    assert wrong.json() == {"error": "tensor `w`: expected [4, 3] FP32, got [4, 2] FP32"}
    assert rows.json()["error"].startswith("inputs `x` (2 rows) and `bias` (1 row): every input")
    assert missing.json()["error"] == (
        "inputs: expected ['x'] (optional: ['bias', 'scale', 'w']); missing ['x']"
    )
