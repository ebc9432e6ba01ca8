"""The TensorRT backend against a test double of `tensorrt` and `cuda.bindings.runtime`.

Real TensorRT is not available on any machine here: these tests check the calls the backend makes
(build flags per TensorRT version, profile, timing and engine caches, name-based execution, one
context per thread, copies through pinned buffers) and that data flows through them correctly.
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from edgeserve.backends import load_backend
from edgeserve.backends.cuda import Buffers, Device, use_device
from edgeserve.backends.tensorrt import build_engine, engine_cache_dir
from edgeserve.dataplane import InputChecks
from edgeserve.errors import BackendError, InvalidInput
from edgeserve.manifest import ModelSection
from edgeserve.shapes import ShapeRange, shape_profile
from edgeserve.signature import read_signature
from tests import tensorrt_double
from tests.models import mlp_model, varlen_model

TRT10, TRT11 = "10.3.0.30", "11.4.0.106"
MLP_PROFILE = {"x": ShapeRange((1, 16), (8, 16), (16, 16))}
H200 = Device(0, "NVIDIA H200", (9, 0))


@pytest.fixture
def model(tmp_path: Path) -> Path:
    return mlp_model(tmp_path / "mlp.onnx")


def _expected(path: Path, x: np.ndarray, output: str = "y") -> np.ndarray:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run([output], {"x": x})[0]


@pytest.mark.parametrize("version", [TRT10, TRT11])
def test_engine_builds_and_runs_with_tensorrt_double(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, model: Path, version: str
) -> None:
    gpu = tensorrt_double.install(monkeypatch, version)
    backend = load_backend(
        "tensorrt", model, device="cuda:0", profile=MLP_PROFILE, cache_dir=tmp_path / "engines"
    )
    for rows in (1, 5, 16):
        x = np.random.default_rng(rows).standard_normal((rows, 16)).astype(np.float32)
        np.testing.assert_array_equal(backend.infer({"x": x})["y"], _expected(model, x))
    (build,) = gpu.builds
    rows = (1, 2, 4, 8, 16)  # one profile per batch bucket, each of its one shape
    assert build["profiles"] == [{"x": ((r, 16), (r, 16), (r, 16))} for r in rows]
    # 1 row runs on the profile of 1, 5 rows (padded) on that of 8, 16 on that of 16
    assert [call[1] for call in gpu.called("set_optimization_profile_async")] == [0, 3, 4]
    assert "TF32" not in build["flags"]  # fp32 means fp32: TF32 off
    copies = [call[1] for call in gpu.called("cudaMemcpyAsync")]
    assert copies == ["cudaMemcpyHostToDevice", "cudaMemcpyDeviceToHost"] * 3
    assert len(gpu.called("execute_async_v3")) == 3
    backend.close()
    assert gpu.device == {} and gpu.host == {} and gpu.streams == set()


@pytest.mark.parametrize(
    ("version", "precision", "flags"),
    [
        (TRT10, "fp32", []),
        (TRT10, "fp16", ["FP16", "TF32"]),
        (TRT10, "auto", ["FP16", "TF32"]),
        (TRT10, "int8", ["FP16", "INT8", "TF32"]),
        (TRT11, "fp16", ["TF32"]),  # strongly typed: the ONNX file carries the precision
        (TRT11, "int8", ["TF32"]),
    ],
)
def test_precision_maps_to_builder_flags_by_version_with_tensorrt_double(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    model: Path,
    version: str,
    precision: str,
    flags: list,
) -> None:
    gpu = tensorrt_double.install(monkeypatch, version)
    build_engine(model, precision, [MLP_PROFILE], H200, cache_dir=tmp_path)  # type: ignore[arg-type]
    assert gpu.builds[0]["flags"] == flags


def test_engine_cache_is_keyed_by_model_precision_gpu_and_version_with_tensorrt_double(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, model: Path
) -> None:
    gpu = tensorrt_double.install(monkeypatch, TRT10)
    plan = build_engine(model, "fp32", [MLP_PROFILE], H200, cache_dir=tmp_path)
    assert build_engine(model, "fp32", [MLP_PROFILE], H200, cache_dir=tmp_path) == plan
    assert len(gpu.builds) == 1
    others = {
        build_engine(model, "fp16", [MLP_PROFILE], H200, cache_dir=tmp_path),
        build_engine(
            model, "fp32", [MLP_PROFILE], Device(0, "Orin (nvgpu)", (8, 7)), cache_dir=tmp_path
        ),
        build_engine(
            model, "fp32", [{"x": ShapeRange((1, 16), (4, 16), (8, 16))}], H200, cache_dir=tmp_path
        ),
    }
    assert len(others | {plan}) == 4 and len(gpu.builds) == 4
    tensorrt_double.install(monkeypatch, "10.3.0.31", gpu)
    assert build_engine(model, "fp32", [MLP_PROFILE], H200, cache_dir=tmp_path) != plan
    assert sorted(p.name.split("-")[0] for p in tmp_path.glob("*.plan")) == ["mlp"] * 5


def test_timing_cache_is_saved_and_reused_with_tensorrt_double(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, model: Path
) -> None:
    gpu = tensorrt_double.install(monkeypatch, TRT10)
    build_engine(model, "fp32", [MLP_PROFILE], H200, cache_dir=tmp_path)
    build_engine(model, "fp16", [MLP_PROFILE], H200, cache_dir=tmp_path)
    assert [b["timing_blob"] for b in gpu.builds] == ["", "+timing"]
    (timing,) = tmp_path.glob("timing-*.cache")
    assert timing.name == "timing-10.3.0.30-NVIDIA-H200-sm90.cache"
    assert timing.read_bytes() == b"+timing+timing"


def test_each_thread_gets_its_own_context_and_stream_with_tensorrt_double(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, model: Path
) -> None:
    gpu = tensorrt_double.install(monkeypatch, TRT10)
    backend = load_backend(
        "tensorrt", model, device="cuda:0", profile=MLP_PROFILE, cache_dir=tmp_path
    )
    x = np.ones((2, 16), np.float32)
    results = []
    threads = [
        threading.Thread(target=lambda: results.append(backend.infer({"x": x})["y"]))
        for _ in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert len(results) == 3 and all(np.array_equal(r, _expected(model, x)) for r in results)
    assert len(gpu.called("create_execution_context")) == 3
    assert len({call[1] for call in gpu.called("execute_async_v3")}) == 3
    assert len(gpu.called("cudaMallocHost")) == 6  # pinned staging: one input + one output each
    backend.close()
    assert gpu.device == {} and gpu.streams == set()


def test_variable_length_axis_uses_the_profile_with_tensorrt_double(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    model = varlen_model(tmp_path / "varlen.onnx")
    gpu = tensorrt_double.install(monkeypatch, TRT11)
    default = shape_profile(read_signature(model, ModelSection()), max_batch_size=8)
    load_backend("tensorrt", model, device="cuda:0", profile=default, cache_dir=tmp_path).close()
    # L is no padded axis: no buckets, one profile over the range (capped: DYNAMIC_MAX)
    assert gpu.builds[0]["profiles"] == [{"x": ((1, 1), (8, 256), (8, 2048))}]
    profile = {"x": ShapeRange((1, 1), (4, 32), (8, 64))}
    backend = load_backend("tensorrt", model, device="cuda:0", profile=profile, cache_dir=tmp_path)
    for shape in ((1, 3), (8, 64), (2, 17)):
        x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
        got = backend.infer({"x": x})
        for output in ("total", "doubled"):
            np.testing.assert_array_equal(got[output], _expected(model, x, output))
    door = InputChecks(read_signature(model, ModelSection()), backend.profile, batching=True)
    with pytest.raises(InvalidInput, match=r"tensor `x`: shape \[2, 65\] is outside the range"):
        door({"x": np.zeros((2, 65), np.float32)})  # the data plane refuses what it cannot run
    backend.close()


def test_width_buckets_are_optimization_profiles_with_tensorrt_double(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The same buckets as ONNX Runtime's sessions: one profile per (rows, width) bucket, built
    once; every batch runs padded on its bucket's profile and comes back cut to its rows."""
    model = varlen_model(tmp_path / "varlen.onnx")
    gpu = tensorrt_double.install(monkeypatch, TRT10)
    signature = read_signature(
        model, ModelSection.model_validate({"inputs": {"x": {"pad_axis": 1}}})
    )
    profile = {"x": ShapeRange((1, 1), (8, 64), (8, 300))}
    backend = load_backend(
        "tensorrt", model, signature=signature, device="cuda:0", profile=profile, cache_dir=tmp_path
    )
    (build,) = gpu.builds
    widths = (64, 96, 128, 192, 256, 300)
    assert build["profiles"] == [
        {"x": ((r, w), (r, w), (r, w))} for r in (1, 2, 4, 8) for w in widths
    ]
    rng = np.random.default_rng(4)
    for rows, width in ((3, 100), (1, 7), (8, 300), (2, 64)):
        part = {"x": rng.standard_normal((rows, width)).astype(np.float32)}
        got = backend.infer(backend.assemble([part], {"x": 0.0}))  # type: ignore[attr-defined]
        np.testing.assert_allclose(got["total"], part["x"].sum(axis=1), rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(got["doubled"][:, :width], 2 * part["x"])
        assert not got["doubled"][:, width:].any()
    indices = [call[1] for call in gpu.called("set_optimization_profile_async")]
    assert indices == [2 * 6 + 2, 0, 3 * 6 + 5, 1 * 6 + 0]  # (rows bucket, width bucket)
    assert len(gpu.builds) == 1
    backend.close()


def test_an_unparsable_model_is_a_backend_error_with_tensorrt_double(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    tensorrt_double.install(monkeypatch, TRT10)
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x00garbage")
    with pytest.raises(BackendError, match=r"tensorrt: cannot parse .*bad.onnx: ModelImporter"):
        build_engine(bad, "fp32", [MLP_PROFILE], H200, cache_dir=tmp_path)
    assert list(tmp_path.glob("*.plan")) == []


def test_a_missing_cuda_device_is_a_backend_error_with_tensorrt_double(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, model: Path
) -> None:
    tensorrt_double.install(monkeypatch, TRT10)
    with pytest.raises(BackendError, match="CUDA call cudaSetDevice failed: cudaErrorInvalidValue"):
        load_backend("tensorrt", model, device="cuda:3", profile=MLP_PROFILE, cache_dir=tmp_path)


def test_engine_cache_dir_survives_releases(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("EDGESERVE_ENGINE_CACHE", str(tmp_path / "engines"))
    assert engine_cache_dir() == tmp_path / "engines"
    monkeypatch.delenv("EDGESERVE_ENGINE_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert engine_cache_dir() == tmp_path / "cache" / "edgeserve" / "engines"


def _cuda_device_count() -> int:
    try:
        from cuda.bindings import runtime as cudart
    except ImportError:
        return 0
    err, count = cudart.cudaGetDeviceCount()
    return int(count) if int(err) == 0 else 0


@pytest.mark.gpu
@pytest.mark.skipif(_cuda_device_count() == 0, reason="needs cuda-python and an NVIDIA GPU")
def test_cuda_buffers_round_trip_through_a_real_gpu() -> None:
    device = use_device(0)
    assert device.name.startswith("NVIDIA") and device.compute_capability >= (5, 0)
    buffers = Buffers()
    data = np.arange(1000, dtype=np.float32)
    staged, back = (
        buffers.pinned(data.nbytes, np.dtype(np.float32)),
        buffers.pinned(4000, np.dtype(np.float32)),
    )
    pointer = buffers.device(data.nbytes)
    np.copyto(staged, data)
    buffers.to_device(pointer, staged)
    buffers.to_host(back, pointer)
    buffers.synchronize()
    np.testing.assert_array_equal(back, data)
    buffers.free()
