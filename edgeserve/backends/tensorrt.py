"""TensorRT on NVIDIA GPUs and Jetson: engines built on the device from the ONNX model, and cached.

UNVERIFIED: no machine this was written on has TensorRT. The build and run paths follow the
TensorRT 10.x / 11.x Python API (name-based I/O, `execute_async_v3`) and are tested only against a
test double of the `tensorrt` and `cuda.bindings.runtime` modules that records and checks the calls.
Run it on a real GPU (TensorRT 10.x on JetPack 6, 11.x from pip on x86) before relying on it.

Engines are specific to the GPU and the TensorRT version, so a bundle never carries one: the engine
is built on the device on first load and cached, keyed by (model sha256, TensorRT version, GPU
name, compute capability, precision, shape profiles), in a cache that survives releases
(`EDGESERVE_ENGINE_CACHE`, else ~/.cache/edgeserve/engines); the timing cache sits next to it.
Precision: TensorRT 10.x takes it from builder flags (fp16, int8 with fp16 fallback; "auto" = fp16;
"fp32" also turns TF32 off, for exactness). TensorRT 11.x is strongly typed and has no such flags:
precision comes from the ONNX file (cast or quantize it before the build).

Buckets: where every dynamic dim is the batch axis or a padded axis, the engine holds one
optimization profile per bucket shape (the same buckets as ONNX Runtime's sessions, fixed
min = opt = max), batches are padded up to their bucket and run in a context bound to its
profile, and outputs are cut back to the batch's rows. Otherwise one profile spans the range.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from edgeserve.backends import cuda
from edgeserve.backends.buckets import Buckets, batch_shapes, buckets_for, write_parts
from edgeserve.backends.options import (
    LoadOptions,
    Precision,
    TritonNames,
    missing_module,
    unranked_inputs,
    unsupported_types,
)
from edgeserve.batching.rows import stack_rows
from edgeserve.errors import BackendError
from edgeserve.hardware import Platform
from edgeserve.shapes import Shape, ShapeProfile, ShapeRange, shape_profile
from edgeserve.types import Signature, TensorDict

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
    int_range: ClassVar[tuple[int, int] | None] = None
    optional_inputs: ClassVar[bool] = False
    """Its ONNX parser takes an input that has an initializer for a weight: the default holds."""
    modules: ClassVar[dict[str, str]] = {
        "tensorrt": "tensorrt is not installed (pip tensorrt, or JetPack's python3-libnvinfer)",
        "cuda.bindings": "cuda-python is not installed (pip install 'edgeserve[gpu]')",
    }

    @classmethod
    def prepare(cls, model_path: Path, bundle: Path) -> None:
        """Nothing: an engine is specific to the GPU, so it is built on the device itself."""

    @classmethod
    def declines(cls, signature: Signature, model: Path) -> str | None:
        """TensorRT's engines have no string nor FP64 tensors, and an optimization profile
        for each input's shape (of a known rank)."""
        return unranked_inputs(signature, "tensorrt") or unsupported_types(
            signature, ("BYTES", "FP64"), "tensorrt"
        )

    @classmethod
    def differs(cls, model: Path, signature: Signature) -> str | None:
        """Nothing known at build: its engine is built on the device, where it is warmed."""
        return None

    @classmethod
    def available(cls, platform: Platform) -> str | None:
        if not platform.has_cuda:
            return f"needs an NVIDIA GPU or a Jetson, and this is a {platform.kind} machine"
        return missing_module(cls.modules, platform)

    @classmethod
    def reaches_gpu(cls, platform: Platform) -> bool:
        """TensorRT runs only on the GPU."""
        return platform.has_cuda

    def __init__(self, model_path: Path, options: LoadOptions) -> None:
        import tensorrt as trt

        self.signature = options.signature
        profile = options.profile or shape_profile(self.signature, max_batch_size=1)
        self.profile: ShapeProfile = {n: r.bounded(DYNAMIC_MAX) for n, r in profile.items()}
        dims = {spec.name: spec.dims for spec in self.signature.required}  # the engine's inputs
        shapes = buckets_for(self.signature, self.profile)
        self.shapes = shapes if shapes.decides(dims) else Buckets()
        self.buckets = self.shapes.rows
        buckets = list(self.shapes.every(dims)) if self.shapes.rows else []
        self._index = {_key(bucket): index for index, bucket in enumerate(buckets)}
        self._profiles = [
            {name: ShapeRange(shape, shape, shape) for name, shape in bucket.items()}
            for bucket in buckets
        ] or [self.profile]
        self._fills = {spec.name: spec.pad_value for spec in self.signature.inputs}
        self.device = cuda.use_device(options.cuda_device or 0)
        plan = build_engine(
            model_path, options.precision, self._profiles, self.device, options.cache_dir
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

    def assemble(self, parts: Sequence[TensorDict], fills: Mapping[str, float]) -> TensorDict:
        """The batch at its bucket's padded lengths (its rows as they are), so that the batcher
        cuts outputs against the lengths the engine ran."""
        shapes = batch_shapes(parts)
        bucket = self.shapes.shapes(shapes) if self.shapes.rows else None
        if bucket is None:
            return stack_rows(parts, fills)
        batch = {
            name: np.empty((shapes[name][0], *bucket[name][1:]), parts[0][name].dtype)
            for name in bucket
        }
        write_parts(batch, parts, fills)
        return batch

    def infer(self, inputs: TensorDict) -> TensorDict:
        shapes = {name: tuple(array.shape) for name, array in inputs.items()}
        bucket = self.shapes.shapes(shapes) if self.shapes.rows else None
        index = self._index[_key(bucket)] if bucket is not None else 0
        return self._context(index).run(inputs, bucket, self._fills)

    def close(self) -> None:
        with self._lock:
            for context in self._contexts:
                context.buffers.free()
            self._contexts = []
        self._local = threading.local()

    def _names(self) -> list[str]:
        return [self._engine.get_tensor_name(i) for i in range(self._engine.num_io_tensors)]

    def _context(self, index: int) -> _Context:
        """This thread's context for profile `index` (made on first use)."""
        contexts = self._local.__dict__.setdefault("contexts", {})
        if index not in contexts:
            cuda.use_device(self.device.index)  # the device is current per thread
            contexts[index] = _Context(
                self._engine, index, self._profiles[index], self._dtypes, self.signature.outputs
            )
            with self._lock:
                self._contexts.append(contexts[index])
        context: _Context = contexts[index]
        return context


def _key(bucket: Mapping[str, Shape]) -> tuple[tuple[str, Shape], ...]:
    return tuple(sorted(bucket.items()))


class _Context:
    """One thread's execution context on one profile, with buffers for its largest shapes."""

    def __init__(
        self,
        engine: Any,
        index: int,
        profile: ShapeProfile,
        dtypes: dict[str, np.dtype],
        outputs: Any,
    ) -> None:
        self.context = engine.create_execution_context()
        self.buffers = cuda.Buffers()
        self.context.set_optimization_profile_async(index, int(self.buffers.stream))
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

    def run(
        self, inputs: TensorDict, bucket: Mapping[str, Shape] | None, fills: Mapping[str, float]
    ) -> TensorDict:
        """Run `inputs`, padded to `bucket` when given (then outputs are cut to their rows)."""
        for name, array in inputs.items():
            shape = bucket[name] if bucket is not None else array.shape
            self.context.set_input_shape(name, shape)
            staged = self.host[name][: int(np.prod(shape))].reshape(shape)
            write_parts({name: staged}, [{name: array}], fills)
            self.buffers.to_device(self.device[name], staged)
        shapes = {name: tuple(self.context.get_tensor_shape(name)) for name in self.outputs}
        if not self.context.execute_async_v3(int(self.buffers.stream)):
            raise BackendError("tensorrt: execute_async_v3 failed (see the TensorRT log above)")
        results = {}
        for name, shape in shapes.items():
            results[name] = self.host[name][: int(np.prod(shape))].reshape(shape)
            self.buffers.to_host(results[name], self.device[name])
        self.buffers.synchronize()
        rows = len(next(iter(inputs.values()))) if bucket is not None else None
        return {name: array[:rows].copy() for name, array in results.items()}


@dataclass(frozen=True)
class EngineKey:
    """Everything an engine depends on; its digest names the cached plan file."""

    model_sha256: str
    tensorrt_version: str
    gpu_name: str
    compute_capability: tuple[int, int]
    precision: str
    profiles: tuple[tuple[tuple[str, Shape, Shape, Shape], ...], ...]

    def digest(self) -> str:
        return hashlib.sha256(repr(self).encode()).hexdigest()[:32]


def engine_cache_dir() -> Path:
    """Where engines live across releases: EDGESERVE_ENGINE_CACHE, else the user cache."""
    if configured := os.environ.get("EDGESERVE_ENGINE_CACHE"):
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "edgeserve" / "engines"


def engine_key(
    model_path: Path, precision: str, profiles: Sequence[ShapeProfile], device: cuda.Device
) -> EngineKey:
    import tensorrt as trt

    ranges = tuple(
        tuple((n, r.min, r.opt, r.max) for n, r in sorted(profile.items())) for profile in profiles
    )
    sha = hashlib.sha256(model_path.read_bytes()).hexdigest()
    return EngineKey(
        sha, trt.__version__, device.name, device.compute_capability, precision, ranges
    )


def build_engine(
    model_path: Path,
    precision: Precision,
    profiles: Sequence[ShapeProfile],
    device: cuda.Device,
    cache_dir: Path | None = None,
    workspace_bytes: int = WORKSPACE_BYTES,
) -> Path:
    """The cached plan for this model on this device, built (and cached) first if missing."""
    key = engine_key(model_path, precision, profiles, device)
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
    _write(plan, _build(model_path, precision, profiles, timing, workspace_bytes))
    return plan


def _build(
    model_path: Path,
    precision: str,
    profiles: Sequence[ShapeProfile],
    timing: Path,
    workspace: int,
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
    for profile in profiles:  # in order: a profile's index is its place in `profiles`
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
    """Write beside and rename, so a crash never leaves half a plan in the cache; the partial
    file is this process's own (one inference process per GPU may build the same plan at once)."""
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    partial.write_bytes(data)
    partial.replace(path)
