"""ONNX Runtime: the backend that runs everywhere (CPU), and on NVIDIA through the CUDA EP.

Sessions use `threads` intra-op threads (0: ONNX Runtime's default), one inter-op thread and
sequential execution: parallelism comes from the batcher's instances, which call `run`
concurrently (a session is safe to share between threads). Precision is the model's own: ONNX
Runtime has no switch for it, so an fp16 or int8 model must be converted before the build.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from edgeserve.backends.options import LoadOptions
from edgeserve.backends.tensors import check_inputs
from edgeserve.errors import BackendError, InvalidInput
from edgeserve.hardware import Platform
from edgeserve.manifest import ModelSection
from edgeserve.signature import read_signature
from edgeserve.types import TensorDict

log = logging.getLogger(__name__)


class OnnxRuntime:
    """One InferenceSession, shared by every worker thread."""

    name = "onnxruntime"

    @classmethod
    def available(cls, platform: Platform) -> str | None:
        if "onnxruntime" not in platform.modules:
            return "the onnxruntime package is not installed (pip install onnxruntime)"
        return None

    def __init__(self, model_path: Path, options: LoadOptions) -> None:
        import onnxruntime as ort

        self.signature = read_signature(model_path, ModelSection())
        self._profile = options.profile
        cuda = (
            options.cuda_device
            if "CUDAExecutionProvider" in ort.get_available_providers()
            else None
        )
        if cuda is not None and hasattr(ort, "preload_dlls"):
            ort.preload_dlls()  # the pip nvidia-* CUDA / cuDNN libraries, before the session
        self.providers_requested = providers(cuda, tf32=options.precision != "fp32")
        try:
            self._session = ort.InferenceSession(
                str(model_path), session_options(options), providers=self.providers_requested
            )
        except Exception as exc:  # onnxruntime raises its own Fail / InvalidGraph / RuntimeError
            raise BackendError(f"onnxruntime: cannot load {model_path}: {exc}") from None
        self.providers: list[str] = self._session.get_providers()
        if options.cuda_device is not None and "CUDAExecutionProvider" not in self.providers:
            log.warning("onnxruntime: CUDA was requested but only %s are usable", self.providers)
        self._output_names = [spec.name for spec in self.signature.outputs]

    def infer(self, inputs: TensorDict) -> TensorDict:
        from onnxruntime.capi.onnxruntime_pybind11_state import InvalidArgument

        check_inputs(inputs, self.signature.inputs, self._profile)
        feeds = {name: _text(name, array) for name, array in inputs.items()}
        try:
            values = self._session.run(self._output_names, feeds)
        except InvalidArgument as exc:
            raise InvalidInput(f"onnxruntime rejected the inputs: {exc}") from None
        except Exception as exc:
            raise BackendError(f"onnxruntime: inference failed: {exc}") from None
        return dict(zip(self._output_names, values, strict=True))

    def close(self) -> None:
        self._session = None


def providers(cuda_device: int | None, tf32: bool = False) -> list[Any]:
    """The CUDA EP on the given device, then the CPU; or the CPU alone.

    TF32 (on by default in the CUDA EP) stays off unless the precision is not "fp32".
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
