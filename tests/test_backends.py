"""The OpenVINO and ONNX Runtime backends on real small models, and the backend choice table.

Tolerance: OpenVINO with precision "fp32" (f32 pinned) and ONNX Runtime agree with each other
and with a plain onnxruntime session within rtol 1e-4, atol 1e-5 (other kernels, same fp32 maths).
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgeserve.backends import BACKENDS, Choice, choose, load_backend
from edgeserve.backends.openvino import IR_PATH, OpenVINO, compile_config, export_ir
from edgeserve.backends.options import LoadOptions
from edgeserve.dataplane import InputChecks
from edgeserve.errors import BackendError, ConfigError, InvalidInput, ModelRefused
from edgeserve.hardware import Cpu, Gpu, Jetson, Platform
from edgeserve.manifest import ModelSection
from edgeserve.shapes import ShapeRange, shape_profile
from edgeserve.signature import read_signature
from edgeserve.types import Signature
from tests.models import conv_model, mlp_model, scalar_model, varlen_model

RTOL, ATOL = 1e-4, 1e-5
RNG = np.random.default_rng(7)


def reshaper(path: Path) -> Path:
    """Reshape to [-1, 5]: fails inside the engine when the element count is not a multiple of 5."""
    shape = numpy_helper.from_array(np.array([-1, 5], dtype=np.int64), "shape")
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["y"])]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "K"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["M", 5])
    graph = helper.make_graph(nodes, "reshaper", [x], [y], [shape])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


MODELS = {
    "mlp": (mlp_model, {"x": (5, 16)}),
    "conv": (conv_model, {"image": (3, 3, 16, 16)}),
    "varlen": (varlen_model, {"x": (2, 7)}),
}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("models")
    return {name: build(root / f"{name}.onnx") for name, (build, _) in MODELS.items()}


def _inputs(name: str) -> dict[str, np.ndarray]:
    return {
        k: RNG.standard_normal(shape).astype(np.float32) for k, shape in MODELS[name][1].items()
    }


def _direct(path: Path, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, inputs), strict=True))


@pytest.mark.parametrize("name", sorted(MODELS))
def test_openvino_and_onnxruntime_agree_with_a_direct_session(
    models: dict[str, Path], name: str
) -> None:
    inputs = _inputs(name)
    expected = _direct(models[name], inputs)
    for backend_name in ("openvino", "onnxruntime"):
        backend = load_backend(backend_name, models[name], precision="fp32")
        got = backend.infer(inputs)
        assert set(got) == set(expected)
        for key, value in expected.items():
            assert got[key].dtype == np.float32
            np.testing.assert_allclose(got[key], value, rtol=RTOL, atol=ATOL)
        backend.close()


def _mlp_reference(path: Path, x: np.ndarray) -> np.ndarray:
    w = {init.name: numpy_helper.to_array(init) for init in onnx.load(str(path)).graph.initializer}
    return np.maximum(x @ w["w1"] + w["b1"], 0) @ w["w2"] + w["b2"]


def test_mlp_matches_numpy_on_both_backends(models: dict[str, Path]) -> None:
    x = RNG.standard_normal((6, 16)).astype(np.float32)
    expected = _mlp_reference(models["mlp"], x)
    for backend_name in ("openvino", "onnxruntime"):
        got = load_backend(backend_name, models["mlp"]).infer({"x": x})["y"]
        np.testing.assert_allclose(got, expected, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("name", ["openvino", "onnxruntime"])
def test_a_read_only_scalar_input_runs_on_both_backends(tmp_path: Path, name: str) -> None:
    """A binary tensor is a read-only view of the request's body; OpenVINO refused a rank-0 one
    ("array is not writeable": a 500)."""
    backend = load_backend(name, scalar_model(tmp_path / "scalar.onnx"))
    x = np.frombuffer(np.float32(3.0).tobytes(), np.float32).reshape(())
    assert not x.flags.writeable
    assert float(backend.infer({"x": x})["y"]) == 9.0


def test_openvino_outputs_are_not_overwritten_by_the_next_call(models: dict[str, Path]) -> None:
    backend = load_backend("openvino", models["mlp"])
    a, b = np.ones((2, 16), np.float32), np.full((2, 16), -3.0, np.float32)
    first = backend.infer({"x": a})["y"]
    kept = first.copy()
    backend.infer({"x": b})
    np.testing.assert_array_equal(first, kept)


def test_openvino_loads_an_exported_ir(models: dict[str, Path], tmp_path: Path) -> None:
    OpenVINO.prepare(models["conv"], tmp_path / "bundle")
    xml = tmp_path / "bundle" / IR_PATH
    assert xml.is_file() and xml.with_suffix(".bin").is_file()
    inputs = _inputs("conv")
    backend = load_backend("openvino", models["conv"], prepared=tmp_path / "bundle")
    got = backend.infer(inputs)["logits"]
    np.testing.assert_allclose(got, _direct(models["conv"], inputs)["logits"], rtol=RTOL, atol=ATOL)


def test_export_ir_of_a_broken_file_is_a_backend_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    with pytest.raises(BackendError, match="cannot convert"):
        export_ir(bad, tmp_path / "ir" / "model.xml")


@pytest.mark.parametrize("backend_name", ["openvino", "onnxruntime"])
def test_a_model_failing_on_the_values_it_was_given_is_the_request_s_fault(
    tmp_path: Path, backend_name: str
) -> None:
    """A run the model fails on inputs of a form it takes (7 values do not reshape to [-1, 5])
    is ModelRefused (422), in the backend's own words without its source frames."""
    backend = load_backend(backend_name, reshaper(tmp_path / "reshape.onnx"))
    assert backend.infer({"x": np.arange(10, dtype=np.float32).reshape(1, 10)})["y"].shape == (2, 5)
    with pytest.raises(
        ModelRefused,
        match=f"^{backend_name}: the model failed on the request's values: .*[Rr]eshape",
    ) as caught:
        backend.infer({"x": np.zeros((1, 7), np.float32)})
    assert caught.value.status == 422
    assert "Exception from" not in caught.value.message
    assert "[ONNXRuntimeError]" not in caught.value.message


@pytest.mark.parametrize("backend_name", ["openvino", "onnxruntime"])
def test_a_missing_model_is_a_config_error(tmp_path: Path, backend_name: str) -> None:
    with pytest.raises(ConfigError, match="model file not found"):
        load_backend(backend_name, tmp_path / "absent.onnx")


def test_profile_bounds_the_shapes_openvino_accepts(models: dict[str, Path]) -> None:
    signature = read_signature(models["varlen"], ModelSection())
    profile = shape_profile(
        signature, max_batch_size=4, preferred_batch_sizes=(2,), dynamic_dim=(1, 8, 16)
    )
    assert profile == {"x": ShapeRange((1, 1), (2, 8), (4, 16))}
    assert shape_profile(signature, max_batch_size=8) == {
        "x": ShapeRange((1, 1), (8, 256), (8, -1))
    }
    backend = load_backend("openvino", models["varlen"], profile=profile)
    inputs = {"x": RNG.standard_normal((4, 16)).astype(np.float32)}
    expected = _direct(models["varlen"], inputs)
    got = backend.infer(inputs)
    for key in ("total", "doubled"):
        np.testing.assert_allclose(got[key], expected[key], rtol=RTOL, atol=ATOL)
    assert backend.profile == profile  # what it was compiled for: the data plane checks it
    door = InputChecks(signature, backend.profile, batching=False)
    with pytest.raises(
        InvalidInput, match=r"shape \[5, 3\] is outside the range .* \[1, 1\] \.\. \[4, 16\]"
    ):
        door({"x": np.zeros((5, 3), np.float32)})


@pytest.mark.parametrize("backend_name", ["openvino", "onnxruntime"])
def test_a_default_profile_bounds_the_batch_but_not_a_variable_length(
    models: dict[str, Path], backend_name: str
) -> None:
    profile = shape_profile(read_signature(models["varlen"], ModelSection()), max_batch_size=4)
    backend = load_backend(backend_name, models["varlen"], profile=profile)
    inputs = {"x": RNG.standard_normal((4, 5000)).astype(np.float32)}
    got = backend.infer(inputs)
    np.testing.assert_allclose(got["doubled"], inputs["x"] * 2, rtol=RTOL, atol=ATOL)
    assert backend.profile == profile
    door = InputChecks(read_signature(models["varlen"], ModelSection()), backend.profile, False)
    with pytest.raises(InvalidInput, match=r"shape \[5, 3\] is outside .* \[1, 1\] \.\. \[4, -1\]"):
        door({"x": np.zeros((5, 3), np.float32)})


def test_bounded_caps_only_unbounded_dims() -> None:
    assert ShapeRange((1, 1), (8, 256), (8, -1)).bounded(64) == ShapeRange((1, 1), (8, 64), (8, 64))
    assert ShapeRange((1, 3), (2, 3), (4, 3)).bounded(64) == ShapeRange((1, 3), (2, 3), (4, 3))


@pytest.mark.parametrize("backend_name", ["openvino", "onnxruntime"])
def test_instances_run_concurrently_from_worker_threads(
    models: dict[str, Path], backend_name: str
) -> None:
    backend = load_backend(backend_name, models["mlp"], instances=2, threads=1)
    batches = [RNG.standard_normal((3, 16)).astype(np.float32) for _ in range(8)]
    results: dict[int, np.ndarray] = {}

    def work(start: int) -> None:
        for i in range(start, len(batches), 2):
            results[i] = backend.infer({"x": batches[i]})["y"]

    threads = [threading.Thread(target=work, args=(s,)) for s in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert sorted(results) == list(range(8))
    for i, x in enumerate(batches):
        np.testing.assert_allclose(
            results[i], _mlp_reference(models["mlp"], x), rtol=RTOL, atol=ATOL
        )


NO_TENSORS = Signature((), (), batched=False)  # compile_config reads no tensor


def test_openvino_compile_config_follows_precision_instances_and_threads() -> None:
    import openvino as ov

    one = compile_config(LoadOptions(NO_TENSORS, precision="fp32"))
    assert one == {
        "PERFORMANCE_HINT": ov.properties.hint.PerformanceMode.LATENCY,
        "INFERENCE_PRECISION_HINT": ov.Type.f32,
    }
    four = compile_config(LoadOptions(NO_TENSORS, precision="auto", instances=4, threads=3))
    assert four == {
        "PERFORMANCE_HINT": ov.properties.hint.PerformanceMode.THROUGHPUT,
        "NUM_STREAMS": 4,
        "INFERENCE_NUM_THREADS": 3,
    }
    shared = compile_config(LoadOptions(NO_TENSORS, threads=2, shares_cpu=True))
    assert shared["ENABLE_CPU_PINNING"] is False  # alone, OpenVINO's own pinning stays
    assert "INFERENCE_PRECISION_HINT" not in compile_config(
        LoadOptions(NO_TENSORS, precision="int8")
    )
    assert (
        compile_config(LoadOptions(NO_TENSORS, precision="fp16"))["INFERENCE_PRECISION_HINT"]
        == ov.Type.f16
    )


CPU = Cpu("Intel(R) Xeon(R) Platinum 8480+", 8, frozenset({"avx2", "avx512f", "amx_bf16"}))
H200 = Gpu(0, "NVIDIA H200", (9, 0), 150_754_820_096, "580.159.04")
ORIN = Jetson("NVIDIA Jetson AGX Orin Developer Kit", "tegra234", (8, 7), "36.4.3", "6.2")
ALL = frozenset({"tensorrt", "cuda.bindings", "openvino", "onnxruntime"})
PREFER = ("tensorrt", "openvino", "onnxruntime")


def _platform(kind: str, modules: frozenset[str] = ALL) -> Platform:
    gpus = (H200,) if kind == "nvidia-gpu" else ()
    return Platform(kind, CPU, gpus, ORIN if kind == "jetson" else None, modules)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kind", "modules", "prefer", "chosen", "rejected"),
    [
        ("cpu", ALL, PREFER, "openvino", ()),
        (
            "cpu",
            ALL - {"openvino"},
            PREFER,
            "onnxruntime",
            (("openvino", "openvino package is not installed"),),
        ),
        ("cpu", ALL, ("onnxruntime", "openvino"), "onnxruntime", ()),
        ("nvidia-gpu", ALL, PREFER, "tensorrt", ()),
        ("jetson", ALL, PREFER, "tensorrt", ()),
        (
            "jetson",
            ALL - {"tensorrt"},
            PREFER,
            "onnxruntime",
            (("tensorrt", "tensorrt is not installed"),),
        ),
        (
            "nvidia-gpu",
            ALL - {"cuda.bindings"},
            PREFER,
            "onnxruntime",
            (("tensorrt", "cuda-python"),),
        ),
        ("nvidia-gpu", ALL, ("openvino", "onnxruntime"), "onnxruntime", ()),
        ("cpu", ALL, ("tensorrt", "openvino"), "openvino", ()),
        (
            "nvidia-gpu",
            frozenset({"openvino"}),
            PREFER,
            "openvino",
            (("tensorrt", ""), ("onnxruntime", "")),
        ),
    ],
)
def test_choose_walks_the_prefer_list_in_platform_order(
    kind: str, modules: frozenset[str], prefer: tuple[str, ...], chosen: str, rejected: tuple
) -> None:
    choice = choose(_platform(kind, modules), prefer)
    assert choice.name == chosen
    assert [name for name, _ in choice.rejected] == [name for name, _ in rejected]
    for (_, why), (_, fragment) in zip(choice.rejected, rejected, strict=True):
        assert fragment in why


def test_choose_says_why() -> None:
    choice = choose(_platform("cpu"), PREFER)
    assert choice == Choice(
        "openvino",
        "first usable of ['tensorrt', 'openvino', 'onnxruntime'] (manifest) "
        "suited to a cpu platform",
    )
    assert choose(_platform("nvidia-gpu"), prefer=()) == choose(_platform("nvidia-gpu"), PREFER)
    fallback = choose(_platform("nvidia-gpu", frozenset({"openvino"})), PREFER)
    assert (
        fallback.reason
        == "no backend suited to a nvidia-gpu platform (tensorrt, onnxruntime) is usable"
    )


def test_tensorrt_is_refused_on_a_cpu_machine_even_when_installed() -> None:
    assert BACKENDS[0].available(_platform("cpu")) is not None
    assert BACKENDS[0].available(_platform("nvidia-gpu")) is None


def test_override_beats_the_environment_which_beats_the_manifest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    platform = _platform("nvidia-gpu")
    monkeypatch.setenv("EDGESERVE_BACKEND", "onnxruntime")
    assert choose(platform, PREFER) == Choice("onnxruntime", "set by EDGESERVE_BACKEND=onnxruntime")
    assert choose(platform, PREFER, override="openvino") == Choice(
        "openvino", "set by the explicit override"
    )
    monkeypatch.delenv("EDGESERVE_BACKEND")
    assert choose(platform, PREFER).name == "tensorrt"


def test_an_override_naming_an_unusable_backend_is_a_config_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(ConfigError) as caught:
        choose(_platform("cpu"), PREFER, override="tensorrt")
    assert caught.value.message == (
        "backend 'tensorrt' (from the explicit override) cannot run here: needs an NVIDIA GPU or a "
        "Jetson, and this is a cpu machine. Usable on this cpu machine: ['openvino', 'onnxruntime']"
    )
    monkeypatch.setenv("EDGESERVE_BACKEND", "tensorflow")
    with pytest.raises(
        ConfigError, match=r"'tensorflow' \(from EDGESERVE_BACKEND=tensorflow\): unknown"
    ):
        choose(_platform("cpu"), PREFER)


def test_no_usable_backend_is_a_backend_error() -> None:
    with pytest.raises(
        BackendError, match=r"no usable backend on this cpu machine .*tensorrt: needs an NVIDIA"
    ):
        choose(_platform("cpu", frozenset()), ("tensorrt", "openvino"))


@pytest.mark.gpu
@pytest.mark.skipif(
    "CUDAExecutionProvider" not in ort.get_available_providers(),
    reason="needs onnxruntime-gpu with CUDA (e.g. 1.31 with CUDA 13) and an NVIDIA GPU",
)
def test_onnxruntime_runs_on_the_cuda_execution_provider(models: dict[str, Path]) -> None:
    backend = load_backend("onnxruntime", models["conv"], device="cuda:0")
    assert backend.providers[0] == "CUDAExecutionProvider"  # type: ignore[attr-defined]
    inputs = _inputs("conv")
    got = backend.infer(inputs)["logits"]
    np.testing.assert_allclose(got, _direct(models["conv"], inputs)["logits"], rtol=1e-3, atol=1e-4)
