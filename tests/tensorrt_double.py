"""A test double of the `tensorrt` (10.x or 11.x) and `cuda.bindings.runtime` modules.

No machine here has TensorRT or a GPU. The double keeps "device memory" in host bytearrays,
and an engine "runs" by giving its ONNX file to onnxruntime, reading inputs from and writing
outputs to that device memory: data only comes back right if the backend's shapes, addresses
and copies are right. Calls are recorded in `Gpu.calls`, and calls the real API refuses are
refused here too (shapes outside the profile, executing before every address is set, builder
flags TensorRT 11 removed, EXPLICIT_BATCH). Only the API surface of reference section 4 is here.
"""

from __future__ import annotations

import ctypes
import enum
import json
import sys
import types
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from edgeserve import datatypes

DEVICE_BASE = 0x7F00_0000_0000


class Error(enum.IntEnum):
    cudaSuccess = 0
    cudaErrorInvalidValue = 1


class MemcpyKind(enum.IntEnum):
    cudaMemcpyHostToDevice = 1
    cudaMemcpyDeviceToHost = 2


class Stream:
    def __init__(self, handle: int) -> None:
        self.handle = handle

    def __int__(self) -> int:
        return self.handle


@dataclass
class Gpu:
    """The shared state of both doubles: memory, streams, and the log of calls."""

    name: str = "NVIDIA H200"
    capability: tuple[int, int] = (9, 0)
    device: dict[int, bytearray] = field(default_factory=dict)
    host: dict[int, Any] = field(default_factory=dict)
    streams: set[int] = field(default_factory=set)
    calls: list[tuple] = field(default_factory=list)
    builds: list[dict] = field(default_factory=list)

    def called(self, name: str) -> list[tuple]:
        return [call for call in self.calls if call[0] == name]


def cudart_module(gpu: Gpu) -> types.ModuleType:
    """A `cuda.bindings.runtime` double: every call returns (cudaError_t, *values)."""
    ok = Error.cudaSuccess

    def record(name: str, *args: Any) -> None:
        gpu.calls.append((name, *args))

    def cudaSetDevice(index: int) -> tuple:
        record("cudaSetDevice", index)
        return (ok,) if index == 0 else (Error.cudaErrorInvalidValue,)

    def cudaGetDeviceProperties(index: int) -> tuple:
        props = types.SimpleNamespace(
            name=gpu.name.encode(), major=gpu.capability[0], minor=gpu.capability[1]
        )
        return ok, props

    def cudaStreamCreate() -> tuple:
        handle = 1000 + len(gpu.called("cudaStreamCreate"))
        gpu.streams.add(handle)
        record("cudaStreamCreate", handle)
        return ok, Stream(handle)

    def cudaMalloc(nbytes: int) -> tuple:
        pointer = DEVICE_BASE + (1 << 24) * len(gpu.called("cudaMalloc"))
        gpu.device[pointer] = bytearray(nbytes)
        record("cudaMalloc", nbytes)
        return ok, pointer

    def cudaMallocHost(nbytes: int) -> tuple:
        buffer = ctypes.create_string_buffer(nbytes)
        gpu.host[ctypes.addressof(buffer)] = buffer
        record("cudaMallocHost", nbytes)
        return ok, ctypes.addressof(buffer)

    def cudaMemcpyAsync(dst: int, src: int, nbytes: int, kind: MemcpyKind, stream: Stream) -> tuple:
        assert int(stream) in gpu.streams, "copy on an unknown stream"
        if kind == MemcpyKind.cudaMemcpyHostToDevice:
            assert dst in gpu.device and nbytes <= len(gpu.device[dst]), (
                "H2D into unallocated memory"
            )
            gpu.device[dst][:nbytes] = ctypes.string_at(src, nbytes)
        else:
            assert src in gpu.device and nbytes <= len(gpu.device[src]), (
                "D2H from unallocated memory"
            )
            ctypes.memmove(dst, bytes(gpu.device[src][:nbytes]), nbytes)
        record("cudaMemcpyAsync", kind.name, nbytes)
        return (ok,)

    def cudaStreamSynchronize(stream: Stream) -> tuple:
        record("cudaStreamSynchronize", int(stream))
        return (ok,)

    def cudaFree(pointer: int) -> tuple:
        del gpu.device[pointer]
        return (ok,)

    def cudaFreeHost(pointer: int) -> tuple:
        del gpu.host[pointer]
        return (ok,)

    def cudaStreamDestroy(stream: Stream) -> tuple:
        gpu.streams.remove(int(stream))
        return (ok,)

    module = types.ModuleType("cuda.bindings.runtime")
    module.__dict__.update(
        {name: value for name, value in locals().items() if name.startswith("cuda")},
        cudaError_t=Error,
        cudaMemcpyKind=MemcpyKind,
    )
    return module


class Network:
    def __init__(self) -> None:
        self.onnx_path: str | None = None
        self.inputs: dict[str, list[int]] = {}


class Profile:
    def __init__(self) -> None:
        self.shapes: dict[str, tuple] = {}

    def set_shape(self, name: str, min: tuple, opt: tuple, max: tuple) -> None:
        assert all(lo <= o <= hi for lo, o, hi in zip(min, opt, max, strict=True)), (min, opt, max)
        self.shapes[name] = (tuple(min), tuple(opt), tuple(max))


class TimingCache:
    def __init__(self, blob: bytes) -> None:
        self.blob = bytes(blob)

    def serialize(self) -> bytes:
        return self.blob + b"+timing"


def tensorrt_module(gpu: Gpu, version: str) -> types.ModuleType:
    """A `tensorrt` double of the given version; 11.x has no FP16/INT8 builder flags."""
    major = int(version.split(".")[0])
    flag_names = ["TF32", "DEBUG", "GPU_FALLBACK", "REFIT", "VERSION_COMPATIBLE"]
    flag_names += ["FP16", "INT8", "BF16"] if major < 11 else []
    BuilderFlag = enum.IntEnum("BuilderFlag", flag_names)
    DataType = enum.IntEnum(
        "DataType", ["FLOAT", "HALF", "INT8", "INT32", "BOOL", "INT64", "UINT8"]
    )
    TensorIOMode = enum.IntEnum("TensorIOMode", ["INPUT", "OUTPUT"])
    numpy_of = {
        DataType.FLOAT: np.float32,
        DataType.HALF: np.float16,
        DataType.INT8: np.int8,
        DataType.INT32: np.int32,
        DataType.BOOL: np.bool_,
        DataType.INT64: np.int64,
        DataType.UINT8: np.uint8,
    }
    by_numpy = {np.dtype(v): k for k, v in numpy_of.items()}

    class Logger:
        WARNING = 2

        def __init__(self, severity: int) -> None:
            self.severity = severity

    class BuilderConfig:
        def __init__(self) -> None:
            self.flags = {BuilderFlag.TF32}  # TF32 is on by default in TensorRT
            self.pools: dict[str, int] = {}
            self.profiles: list[Profile] = []
            self.timing: TimingCache | None = None

        def set_memory_pool_limit(self, pool: str, size: int) -> None:
            self.pools[pool] = size

        def set_flag(self, flag: Any) -> None:
            self.flags.add(BuilderFlag(flag))

        def clear_flag(self, flag: Any) -> None:
            self.flags.discard(BuilderFlag(flag))

        def add_optimization_profile(self, profile: Profile) -> int:
            self.profiles.append(profile)
            return len(self.profiles) - 1

        def create_timing_cache(self, blob: bytes) -> TimingCache:
            return TimingCache(blob)

        def set_timing_cache(self, cache: TimingCache, ignore_mismatch: bool) -> bool:
            self.timing = cache
            return True

        def get_timing_cache(self) -> TimingCache | None:
            return self.timing

    class Builder:
        def __init__(self, logger: Logger) -> None:
            self.logger = logger

        def create_network(self, flags: int = 0) -> Network:
            assert flags == 0, "EXPLICIT_BATCH is deprecated in 10.x and removed in 11.x"
            return Network()

        def create_builder_config(self) -> BuilderConfig:
            return BuilderConfig()

        def create_optimization_profile(self) -> Profile:
            return Profile()

        def build_serialized_network(self, network: Network, config: BuilderConfig) -> bytes | None:
            assert network.onnx_path, "build before parse"
            assert "WORKSPACE" in config.pools and config.profiles, "no optimization profile"
            for shapes in (profile.shapes for profile in config.profiles):
                for name, dims in network.inputs.items():
                    assert name in shapes or all(d > 0 for d in dims), (
                        f"dynamic input {name} has no shape"
                    )
            build = {
                "version": version,
                "onnx": network.onnx_path,
                "profiles": [profile.shapes for profile in config.profiles],
                "flags": sorted(f.name for f in config.flags),
                "timing_blob": config.timing.blob.decode() if config.timing else None,
            }
            gpu.builds.append(build)
            return json.dumps(build).encode()

    class OnnxParser:
        def __init__(self, network: Network, logger: Logger) -> None:
            self.network = network
            self.errors: list[str] = []

        @property
        def num_errors(self) -> int:
            return len(self.errors)

        def get_error(self, index: int) -> str:
            return self.errors[index]

        def parse_from_file(self, path: str) -> bool:
            try:
                model = onnx.load(path)
            except Exception as exc:
                self.errors.append(f"ModelImporter: failed to parse: {type(exc).__name__}")
                return False
            self.network.onnx_path = path
            for value in model.graph.input:
                dims = value.type.tensor_type.shape.dim
                self.network.inputs[value.name] = [
                    d.dim_value if d.HasField("dim_value") else -1 for d in dims
                ]
            return True

    class ExecutionContext:
        def __init__(self, engine: Engine) -> None:
            self.engine = engine
            self.profile = 0
            self.shapes: dict[str, tuple] = {}
            self.addresses: dict[str, int] = {}
            gpu.calls.append(("create_execution_context",))

        def set_optimization_profile_async(self, index: int, stream_handle: int) -> bool:
            assert 0 <= index < len(self.engine.profiles), f"no profile {index}"
            assert stream_handle in gpu.streams and not self.shapes, "set the profile first"
            self.profile = index
            gpu.calls.append(("set_optimization_profile_async", index))
            return True

        def set_input_shape(self, name: str, shape: tuple) -> bool:
            low, _, high = self.engine.profiles[self.profile][name]
            assert all(lo <= n <= hi for lo, n, hi in zip(low, shape, high, strict=True)), shape
            self.shapes[name] = tuple(shape)
            return True

        def get_tensor_shape(self, name: str) -> tuple:
            if name in self.engine.input_names:
                return self.shapes[name]
            zeros = {n: np.zeros(s, self.engine.dtype(n)) for n, s in self.shapes.items()}
            return self.engine.session.run([name], zeros)[0].shape

        def set_tensor_address(self, name: str, pointer: int) -> bool:
            assert pointer in gpu.device, f"{name}: not a device pointer"
            self.addresses[name] = pointer
            return True

        def execute_async_v3(self, stream_handle: int) -> bool:
            assert isinstance(stream_handle, int) and stream_handle in gpu.streams
            assert set(self.addresses) == set(self.engine.names), (
                "execute before every address is set"
            )
            feeds = {}
            for name in self.engine.input_names:
                count = int(np.prod(self.shapes[name]))
                raw = gpu.device[self.addresses[name]]
                feeds[name] = np.frombuffer(raw, self.engine.dtype(name), count).reshape(
                    self.shapes[name]
                )
            outputs = self.engine.session.run(self.engine.output_names, feeds)
            for name, value in zip(self.engine.output_names, outputs, strict=True):
                target = gpu.device[self.addresses[name]]
                assert value.nbytes <= len(target), f"{name}: output buffer too small"
                target[: value.nbytes] = value.tobytes()
            gpu.calls.append(("execute_async_v3", stream_handle))
            return True

    class Engine:
        def __init__(self, plan: dict) -> None:
            self.session = ort.InferenceSession(plan["onnx"], providers=["CPUExecutionProvider"])
            self.profiles = [
                {n: tuple(map(tuple, s)) for n, s in shapes.items()} for shapes in plan["profiles"]
            ]
            self.input_names = [i.name for i in self.session.get_inputs()]
            self.output_names = [o.name for o in self.session.get_outputs()]
            self.names = self.input_names + self.output_names
            model = onnx.load(plan["onnx"], load_external_data=False)
            values = list(model.graph.input) + list(model.graph.output)
            self.dtypes = {
                v.name: datatypes.from_onnx(v.type.tensor_type.elem_type).numpy for v in values
            }

        @property
        def num_io_tensors(self) -> int:
            return len(self.names)

        def get_tensor_name(self, index: int) -> str:
            return self.names[index]

        def get_tensor_mode(self, name: str) -> Any:
            return TensorIOMode.INPUT if name in self.input_names else TensorIOMode.OUTPUT

        def get_tensor_dtype(self, name: str) -> Any:
            return by_numpy[self.dtypes[name]]

        def dtype(self, name: str) -> np.dtype:
            return self.dtypes[name]

        def create_execution_context(self) -> ExecutionContext:
            return ExecutionContext(self)

    class Runtime:
        def __init__(self, logger: Logger) -> None:
            self.logger = logger

        def deserialize_cuda_engine(self, data: bytes) -> Engine | None:
            plan = json.loads(data)
            return Engine(plan) if plan["version"] == version else None

    module = types.ModuleType("tensorrt")
    module.__dict__.update(
        __version__=version,
        Logger=Logger,
        Builder=Builder,
        OnnxParser=OnnxParser,
        Runtime=Runtime,
        BuilderFlag=BuilderFlag,
        DataType=DataType,
        TensorIOMode=TensorIOMode,
        MemoryPoolType=types.SimpleNamespace(WORKSPACE="WORKSPACE"),
        NetworkDefinitionCreationFlag=types.SimpleNamespace(STRONGLY_TYPED=1),
        nptype=lambda dtype: numpy_of[dtype],
    )
    return module


def install(monkeypatch: pytest.MonkeyPatch, version: str, gpu: Gpu | None = None) -> Gpu:
    """Put both doubles into sys.modules (undone by monkeypatch after the test)."""
    gpu = gpu or Gpu()
    runtime = cudart_module(gpu)
    bindings = types.ModuleType("cuda.bindings")
    bindings.runtime = runtime  # type: ignore[attr-defined]
    package = types.ModuleType("cuda")
    package.bindings = bindings  # type: ignore[attr-defined]
    for name, module in (
        ("cuda", package),
        ("cuda.bindings", bindings),
        ("cuda.bindings.runtime", runtime),
    ):
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setitem(sys.modules, "tensorrt", tensorrt_module(gpu, version))
    return gpu
