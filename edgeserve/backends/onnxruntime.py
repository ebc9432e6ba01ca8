"""ONNX Runtime: the backend that runs everywhere (CPU), and on NVIDIA through the CUDA EP.

Sessions use `threads` intra-op threads (0: ONNX Runtime's default), one inter-op thread and
sequential execution: parallelism comes from the batcher's instances, which call `run`
concurrently (a session is safe to share between threads). Precision is the model's own: ONNX
Runtime has no switch for it, so an fp16 or int8 model must be converted before the build.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from edgeserve.backends.options import LoadOptions, TritonNames
from edgeserve.backends.tensors import ShapeProfile, check_inputs
from edgeserve.errors import BackendError, InvalidInput
from edgeserve.hardware import Platform
from edgeserve.types import TensorDict

log = logging.getLogger(__name__)


class OnnxRuntime:
    """One InferenceSession, shared by every worker thread."""

    name = "onnxruntime"
    package: ClassVar[str | None] = "onnxruntime"
    platforms: ClassVar[tuple[str, ...]] = ("jetson", "nvidia-gpu", "cpu", "lambda")
    triton: ClassVar[TritonNames] = TritonNames("onnxruntime_onnx", "onnxruntime")
    prepared: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def prepare(cls, model_path: Path, bundle: Path) -> None:
        """Nothing: ONNX Runtime reads the ONNX model as it is."""

    @classmethod
    def available(cls, platform: Platform) -> str | None:
        if "onnxruntime" not in platform.modules:
            return "the onnxruntime package is not installed (pip install onnxruntime)"
        return None

    def __init__(self, model_path: Path, options: LoadOptions) -> None:
        import onnxruntime as ort
        from onnxruntime.capi import onnxruntime_pybind11_state as pybind_state

        self.signature = options.signature
        self._profile = options.profile
        cuda = (
            options.cuda_device
            if "CUDAExecutionProvider" in ort.get_available_providers()
            else None
        )
        if cuda is not None and hasattr(ort, "preload_dlls"):
            ort.preload_dlls()  # the pip nvidia-* CUDA / cuDNN libraries, before the session
        self.providers_requested = providers(cuda, tf32=options.precision != "fp32")
        self.buckets: tuple[int, ...] = (
            batch_buckets(self._profile) if cuda is not None and self.signature.batched else ()
        )
        self._sessions = {
            bucket: self._open(ort, model_path, options) for bucket in self.buckets or (0,)
        }
        self.providers: list[str] = next(iter(self._sessions.values())).get_providers()
        self._invalid_argument: type[Exception] = pybind_state.InvalidArgument
        if options.cuda_device is not None and "CUDAExecutionProvider" not in self.providers:
            log.warning("onnxruntime: CUDA was requested but only %s are usable", self.providers)
        self._output_names = [spec.name for spec in self.signature.outputs]

    def _open(self, ort: Any, model_path: Path, options: LoadOptions) -> Any:
        try:
            return ort.InferenceSession(
                str(model_path), session_options(options), providers=self.providers_requested
            )
        except Exception as exc:  # onnxruntime raises its own Fail / InvalidGraph / RuntimeError
            raise BackendError(f"onnxruntime: cannot load {model_path}: {exc}") from None

    def infer(self, inputs: TensorDict) -> TensorDict:
        check_inputs(inputs, self.signature.inputs, self._profile)
        feeds = {name: _text(name, array) for name, array in inputs.items()}
        rows = next(iter(feeds.values())).shape[0] if self.buckets else 0
        bucket = next((b for b in self.buckets if b >= rows), 0)
        if bucket > rows:
            feeds = {name: _pad_rows(array, bucket) for name, array in feeds.items()}
        try:
            values = self._sessions[bucket].run(self._output_names, feeds)
        except self._invalid_argument as exc:
            raise InvalidInput(f"onnxruntime rejected the inputs: {exc}") from None
        except Exception as exc:
            raise BackendError(f"onnxruntime: inference failed: {exc}") from None
        if bucket > rows:
            values = [value[:rows] for value in values]
        return dict(zip(self._output_names, values, strict=True))

    def close(self) -> None:
        self._sessions.clear()


def batch_buckets(profile: ShapeProfile | None) -> tuple[int, ...]:
    """Batch sizes with a CUDA session each: powers of two up to the profile's max batch, and it.

    The CUDA EP re-plans its cuDNN convolutions whenever an input shape changes (measured on an
    H200 with a ResNet-18-shaped model: 50-450 ms per change, against 0.7 ms a batch at a steady
    shape). A session per bucket keeps every session at one batch shape; a batch is padded with
    zero rows up to its bucket and its outputs are cut back.
    """
    if not profile:
        return ()
    highest = max(shape.max[0] for shape in profile.values() if shape.max)
    sizes = {1 << power for power in range(highest.bit_length()) if 1 << power <= highest}
    return tuple(sorted(sizes | {highest}))


def _pad_rows(array: np.ndarray, rows: int) -> np.ndarray:
    padded = np.zeros((rows, *array.shape[1:]), dtype=array.dtype)
    padded[: array.shape[0]] = array
    return padded


def providers(cuda_device: int | None, tf32: bool = False) -> list[Any]:
    """The CUDA EP on the given device, then the CPU; or the CPU alone.

    TF32 (on by default in the CUDA EP) stays off unless the precision is not "fp32". cuDNN's
    algorithm search stays EXHAUSTIVE: HEURISTIC left every Conv of a ResNet-18-shaped model in
    cuDNN's fallback mode on an H200 (38 ms a batch against 0.7 ms).
    """
    if cuda_device is None:
        return ["CPUExecutionProvider"]
    cuda = ("CUDAExecutionProvider", {"device_id": str(cuda_device), "use_tf32": str(int(tf32))})
    return [cuda, "CPUExecutionProvider"]


def session_options(options: LoadOptions) -> Any:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = options.threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # No spinning between runs: on a few cores the spinning pool starves the event loop.
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return so


def _text(name: str, array: np.ndarray) -> np.ndarray:
    """BYTES elements as str: ONNX Runtime's Python API would store a bytes element as its repr."""
    if array.dtype != object or not any(isinstance(item, bytes) for item in array.flat):
        return array
    try:
        decoded = [item.decode() if isinstance(item, bytes) else item for item in array.flat]
    except UnicodeDecodeError:
        raise InvalidInput(f"tensor `{name}`: onnxruntime takes UTF-8 text only") from None
    return np.array(decoded, dtype=object).reshape(array.shape)
