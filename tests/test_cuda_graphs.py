"""CUDA graphs: each bucket's batches launched as one captured graph (ONNX Runtime on CUDA).

The GPU tests compare every answer with the same model run kernel by kernel, over many batch
shapes and through two threads' buffers; they skip without a GPU. Which dims a bucket fixes is
pure and checked everywhere.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from edgeserve.backends import load_backend
from edgeserve.backends.sessions import dim_names, fixed_dims
from edgeserve.batching import Batcher, BatchPolicy
from edgeserve.manifest import ModelSection
from edgeserve.shapes import ShapeRange, shape_profile
from edgeserve.signature import read_signature
from tests.models import branching_model, varlen_model
from tests.test_stage_ahead import serve_all

NO_CUDA = "CUDAExecutionProvider" not in ort.get_available_providers()


def test_a_bucket_fixes_the_models_named_dims(tmp_path: Path) -> None:
    names = dim_names(varlen_model(tmp_path / "varlen.onnx"))
    assert names == {"x": {0: "N", 1: "L"}}
    assert fixed_dims(names, {"x": (8, 192)}) == {"N": 8, "L": 192}


def test_a_name_two_inputs_give_different_sizes_stays_free() -> None:
    names = {"a": {0: "N", 1: "T"}, "b": {0: "N", 1: "T"}}
    assert fixed_dims(names, {"a": (4, 64), "b": (4, 96)}) == {"N": 4}


def _crnn_backend(tmp_path: Path, cuda_graphs: bool):
    from benchmarks.models import crnn

    model = crnn(tmp_path / "crnn.onnx")
    section = ModelSection.model_validate({"inputs": {"image": {"pad_axis": 3}}})
    signature = read_signature(model, section)
    profile = shape_profile(signature, 8)
    profile["image"] = ShapeRange((1, 1, 32, 16), (8, 1, 32, 256), (8, 1, 32, 512))
    return load_backend(
        "onnxruntime",
        model,
        signature=signature,
        device="cuda:0",
        profile=profile,
        cuda_graphs=cuda_graphs,
    )


def _on_cuda(model: Path):
    """`model` on cuda:0 with CUDA graphs asked for, batches of up to 4 rows, its own dims."""
    signature = read_signature(model, ModelSection())
    return load_backend(
        "onnxruntime",
        model,
        signature=signature,
        device="cuda:0",
        profile=shape_profile(signature, 4),
        cuda_graphs=True,
    )


@pytest.mark.gpu
@pytest.mark.skipif(NO_CUDA, reason="needs onnxruntime-gpu with CUDA and an NVIDIA GPU")
def test_every_bucket_runs_as_a_graph_that_answers_as_kernel_by_kernel(tmp_path: Path) -> None:
    graphs = _crnn_backend(tmp_path, cuda_graphs=True)
    plain = _crnn_backend(tmp_path, cuda_graphs=False)
    assert graphs.graphs and not plain.graphs
    opened = graphs.plans
    rng = np.random.default_rng(7)
    for _ in range(40):
        rows, width = int(rng.integers(1, 9)), int(rng.integers(16, 513))
        x = {"image": rng.random((rows, 1, 32, width), dtype=np.float32)}
        got, expected = graphs.infer(x)["logits"], plain.infer(x)["logits"]
        assert got.shape == expected.shape
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
    assert graphs.graphs and graphs.plans == opened
    graphs.close()
    plain.close()


@pytest.mark.gpu
@pytest.mark.skipif(NO_CUDA, reason="needs onnxruntime-gpu with CUDA and an NVIDIA GPU")
def test_a_model_with_control_flow_runs_kernel_by_kernel(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        backend = _on_cuda(branching_model(tmp_path / "branching.onnx"))
    assert not backend.graphs
    assert "CUDA graphs are off" in caplog.text
    for sign, factor in ((1.0, 2.0), (-1.0, 3.0), (1.0, 2.0)):
        x = np.full((3, 4), sign, np.float32)
        np.testing.assert_array_equal(backend.infer({"x": x})["y"], factor * x)
    backend.close()


@pytest.mark.gpu
@pytest.mark.skipif(NO_CUDA, reason="needs onnxruntime-gpu with CUDA and an NVIDIA GPU")
def test_a_shape_no_bucket_decides_serves_from_two_threads_without_graphs(tmp_path: Path) -> None:
    """A dynamic dim that is not a pad axis: its bindings are made on first use, while other
    threads run batches, where a capture would fail; such a model runs kernel by kernel."""
    backend = _on_cuda(varlen_model(tmp_path / "varlen.onnx"))
    assert not backend.graphs
    policy = BatchPolicy(4, max_queue_delay_s=0.001, max_queue_size=256, instances=1)
    batcher = Batcher(
        backend.infer, backend.signature, policy, None, backend.assemble, stage_ahead=True
    )
    rng = np.random.default_rng(9)
    requests = [
        {"x": rng.normal(size=(1, int(rng.integers(1, 40)))).astype(np.float32)} for _ in range(200)
    ]
    answers = serve_all(batcher, requests, backend.warm_thread)
    for request, answer in zip(requests, answers, strict=True):
        np.testing.assert_allclose(answer["total"], request["x"].sum(axis=1), rtol=1e-5, atol=1e-4)
    backend.close()
