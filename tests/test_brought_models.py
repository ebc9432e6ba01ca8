"""Models as users bring them from their own tools, driven as a user drives them (`edgeserve
init`, `build`, `serve`, requests), answers compared with ONNX Runtime's on the same inputs:
ONNX Runtime's own int8 quantization, and files and tensors named as exporters and people name
them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.http as triton

from edgeserve.cli import main
from tests.models import quantized_model
from tests.server import running


@pytest.fixture(autouse=True)
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EDGESERVE_CACHE_DIR", str(tmp_path / "cache"))


def test_an_onnxruntime_quantized_conv_net_is_served_on_openvino(tmp_path: Path) -> None:
    """quantize_static's Q/DQ conv net: build refused it ("openvino: cannot load ...: No
    suitable implementations"): at the default precision, "auto", OpenVINO chose bf16 on this
    AMX CPU and has no bf16 kernel for it. It compiles at f32 now and answers as ONNX Runtime
    does (on a CPU without bf16, "auto" was f32 already)."""
    model = quantized_model(tmp_path / "q.onnx")
    source = tmp_path / "fn"
    assert main(["init", str(source), "--model", str(model)]) == 0
    assert main(["build", str(source), "--out", str(tmp_path / "out")]) == 0
    image = np.random.default_rng(0).random((2, 3, 16, 16), np.float32)
    want = ort.InferenceSession(str(model)).run(None, {"image": image})[0]
    with running(tmp_path / "out", "--workers", "1") as (url, server):
        client = triton.InferenceServerClient(url.removeprefix("http://"))
        sent = triton.InferInput("image", list(image.shape), "FP32")
        sent.set_data_from_numpy(image, binary_data=True)
        got = client.infer("fn", [sent]).as_numpy("logits")
    assert "loaded fn on openvino" in "".join(server.output)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
