"""TensorRT on NVIDIA GPUs and Jetson: engines built on the device from the ONNX model, and cached.

UNVERIFIED: no machine this was written on has TensorRT. The build and run paths follow the
TensorRT 10.x / 11.x Python API (name-based I/O, `execute_async_v3`) and are tested only against a
test double of the `tensorrt` and `cuda.bindings.runtime` modules that records and checks the calls.
Run it on a real GPU (TensorRT 10.x on JetPack 6, 11.x from pip on x86) before relying on it.

Engines are specific to the GPU and the TensorRT version, so a bundle never carries one: the engine
is built on the device on first load and cached, keyed by (model sha256, TensorRT version, GPU
name, compute capability, precision, shape profile), in a cache that survives releases
(`EDGESERVE_ENGINE_CACHE`, else ~/.cache/edgeserve/engines); the timing cache sits next to it.
Precision: TensorRT 10.x takes it from builder flags (fp16, int8 with fp16 fallback; "auto" = fp16;
"fp32" also turns TF32 off, for exactness). TensorRT 11.x is strongly typed and has no such flags:
precision comes from the ONNX file (cast or quantize it before the build).
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from edgeserve.backends import cuda
from edgeserve.backends.options import LoadOptions, Precision, TritonNames
from edgeserve.backends.tensors import ShapeProfile, check_inputs, shape_profile
from edgeserve.errors import BackendError
from edgeserve.hardware import Platform
from edgeserve.types import TensorDict

log = logging.getLogger(__name__)
WORKSPACE_BYTES = 1 << 30
DYNAMIC_MAX = 2048
"""The largest size given to a dynamic non-batch dim that the profile leaves unbounded."""


class TensorRT:
    """A cached engine; one execution context, stream and set of buffers per calling thread."""

    name = "tensorrt"
    package: ClassVar[str | None] = (
        None  # comes with JetPack on the device (or the NVIDIA image), never from pip
    )
    platforms: ClassVar[tuple[str, ...]] = ("jetson", "nvidia-gpu")
    triton: ClassVar[TritonNames] = TritonNames("tensorrt_plan", "tensorrt", "KIND_GPU")
    prepared: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def prepare(cls, model_path: Path, bundle: Path) -> None:
        """Nothing: an engine is specific to the GPU, so it is built on the device itself."""

    @classmethod
    def available(cls, platform: Platform) -> str | None:
        if not platform.has_cuda:
            return f"needs an NVIDIA GPU or a Jetson, and this is a {platform.kind} machine"
        if "tensorrt" not in platform.modules:
            return "tensorrt is not installed (pip tensorrt, or JetPack's python3-libnvinfer)"
        if "cuda.bindings" not in platform.modules:
            return "cuda-python is not installed (pip install 'edgeserve[gpu]')"
        return None

    def __init__(self, model_path: Path, options: LoadOptions) -> None:
        import tensorrt as trt

        self.signature = options.signature
        self.buckets: tuple[int, ...] = ()
        profile = options.profile or shape_profile(self.signature, max_batch_size=1)
        self._profile = {name: r.bounded(DYNAMIC_MAX) for name, r in profile.items()}
        self.device = cuda.use_device(options.cuda_device or 0)
        plan = build_engine(
            model_path, options.precision, self._profile, self.device, options.cache_dir
        )
        self._runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))  # must outlive the engine
        self._engine = self._runtime.deserialize_cuda_engine(plan.read_bytes())
        if self._engine is None:
            raise BackendError(f"tensorrt: cannot deserialize {plan}; delete it to rebuild")
        self._dtypes = {
            n: np.dtype(trt.nptype(self._engine.get_tensor_dtype(n))) for n in self._names()
        }
        self._local = threading.local()
        self._contexts: list[_Context] = []
        self._lock = threading.Lock()

    def infer(self, inputs: TensorDict) -> TensorDict:
        check_inputs(inputs, self.signature.inputs, self._profile)
        return self._context().run(inputs)

    def close(self) -> None:
        with self._lock:
            for context in self._contexts:
                context.buffers.free()
            self._contexts = []
        self._local = threading.local()

    def _names(self) -> list[str]:
        return [self._engine.get_tensor_name(i) for i in range(self._engine.num_io_tensors)]

    def _context(self) -> _Context:
        context = getattr(self._local, "context", None)
        if context is None:
            cuda.use_device(self.device.index)  # the device is current per thread
            context = _Context(self._engine, self._profile, self._dtypes, self.signature.outputs)
            self._local.context = context
            with self._lock:
                self._contexts.append(context)
        return context


class _Context:
    """One thread's execution context with buffers sized for the profile's largest shapes."""

    def __init__(
        self, engine: Any, profile: ShapeProfile, dtypes: dict[str, np.dtype], outputs: Any
    ) -> None:
        self.context = engine.create_execution_context()
        self.buffers = cuda.Buffers()
        self.outputs = [spec.name for spec in outputs]
        for name, shape_range in profile.items():
            self.context.set_input_shape(name, shape_range.max)
        largest = {name: r.max for name, r in profile.items()}
        largest.update({name: tuple(self.context.get_tensor_shape(name)) for name in self.outputs})
        if any(dim < 0 for shape in largest.values() for dim in shape):
            raise BackendError(
                f"tensorrt: data-dependent output shapes are not supported: {largest}"
            )
        self.device: dict[str, int] = {}
        self.host: dict[str, np.ndarray] = {}
        for name, shape in largest.items():
            nbytes = int(np.prod(shape)) * dtypes[name].itemsize
            self.device[name] = self.buffers.device(nbytes)
            self.host[name] = self.buffers.pinned(nbytes, dtypes[name])
            self.context.set_tensor_address(name, self.device[name])

    def run(self, inputs: TensorDict) -> TensorDict:
        for name, array in inputs.items():
            self.context.set_input_shape(name, array.shape)
            staged = self.host[name][: array.size].reshape(array.shape)
            np.copyto(staged, array)
            self.buffers.to_device(self.device[name], staged)
        shapes = {name: tuple(self.context.get_tensor_shape(name)) for name in self.outputs}
        if not self.context.execute_async_v3(int(self.buffers.stream)):
            raise BackendError("tensorrt: execute_async_v3 failed (see the TensorRT log above)")
        results = {}
        for name, shape in shapes.items():
            results[name] = self.host[name][: int(np.prod(shape))].reshape(shape)
            self.buffers.to_host(results[name], self.device[name])
        self.buffers.synchronize()
        return {name: array.copy() for name, array in results.items()}


@dataclass(frozen=True)
class EngineKey:
    """Everything an engine depends on; its digest names the cached plan file."""

    model_sha256: str
    tensorrt_version: str
    gpu_name: str
    compute_capability: tuple[int, int]
    precision: str
    profile: tuple[tuple[str, tuple[int, ...], tuple[int, ...], tuple[int, ...]], ...]

    def digest(self) -> str:
        return hashlib.sha256(repr(self).encode()).hexdigest()[:32]


def engine_cache_dir() -> Path:
    """Where engines live across releases: EDGESERVE_ENGINE_CACHE, else the user cache."""
    if configured := os.environ.get("EDGESERVE_ENGINE_CACHE"):
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "edgeserve" / "engines"


def engine_key(
    model_path: Path, precision: str, profile: ShapeProfile, device: cuda.Device
) -> EngineKey:
    import tensorrt as trt

    ranges = tuple((n, r.min, r.opt, r.max) for n, r in sorted(profile.items()))
    sha = hashlib.sha256(model_path.read_bytes()).hexdigest()
    return EngineKey(
        sha, trt.__version__, device.name, device.compute_capability, precision, ranges
    )


def build_engine(
    model_path: Path,
    precision: Precision,
    profile: ShapeProfile,
    device: cuda.Device,
    cache_dir: Path | None = None,
    workspace_bytes: int = WORKSPACE_BYTES,
) -> Path:
    """The cached plan for this model on this device, built (and cached) first if missing."""
    key = engine_key(model_path, precision, profile, device)
    cache = cache_dir or engine_cache_dir()
    plan = cache / f"{model_path.stem}-{key.digest()}.plan"
    if plan.is_file():
        return plan
    cache.mkdir(parents=True, exist_ok=True)
    major, minor = device.compute_capability
    slug = "".join(c if c.isalnum() else "-" for c in device.name)
    timing = cache / f"timing-{key.tensorrt_version}-{slug}-sm{major}{minor}.cache"
    log.info(
        "tensorrt: building %s for %s (%s); this takes a while once",
        plan.name,
        device.name,
        precision,
    )
    _write(plan, _build(model_path, precision, profile, timing, workspace_bytes))
    return plan


def _build(
    model_path: Path, precision: str, profile: ShapeProfile, timing: Path, workspace: int
) -> bytes:
    import tensorrt as trt

    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(0)  # explicit batch is the only mode since 10.0
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(model_path)):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise BackendError(f"tensorrt: cannot parse {model_path}: {errors}")
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace)
    _set_precision(trt, config, precision)
    optimization = builder.create_optimization_profile()
    for name, shape_range in profile.items():
        optimization.set_shape(name, shape_range.min, shape_range.opt, shape_range.max)
    config.add_optimization_profile(optimization)
    blob = timing.read_bytes() if timing.is_file() else b""
    config.set_timing_cache(config.create_timing_cache(blob), ignore_mismatch=True)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise BackendError(
            f"tensorrt: building an engine for {model_path} failed (see the log above)"
        )
    _write(timing, bytes(config.get_timing_cache().serialize()))
    return bytes(serialized)


def _set_precision(trt: Any, config: Any, precision: str) -> None:
    """10.x: builder flags. 11.x (no FP16 flag): strongly typed, the ONNX file decides."""
    flags = trt.BuilderFlag
    if precision == "fp32":
        config.clear_flag(flags.TF32)
        return
    if int(trt.__version__.split(".")[0]) >= 11 or not hasattr(flags, "FP16"):
        log.info(
            "tensorrt %s is strongly typed: precision %r comes from the ONNX file",
            trt.__version__,
            precision,
        )
        return
    config.set_flag(flags.FP16)
    if precision == "int8":
        config.set_flag(flags.INT8)  # the ONNX file must carry Q/DQ nodes: there is no calibrator


def _write(path: Path, data: bytes) -> None:
    """Write beside and rename, so a crash never leaves half a plan in the cache."""
    partial = path.with_name(path.name + ".partial")
    partial.write_bytes(data)
    partial.replace(path)
