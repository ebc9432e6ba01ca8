"""How a backend is asked to load a model: one value shared by every backend's constructor."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from edgeserve.errors import BackendError, ConfigError, EdgeserveError, ModelRefused
from edgeserve.hardware import Platform
from edgeserve.shapes import ShapeProfile
from edgeserve.types import Signature

Precision = Literal["fp32", "fp16", "int8", "auto"]


def unsupported_types(signature: Signature, datatypes: tuple[str, ...], name: str) -> str | None:
    """Why a backend that has none of `datatypes` declines the model, or None."""
    for spec in (*signature.inputs, *signature.outputs):
        if spec.datatype in datatypes:
            return f"{name} has no {spec.datatype} tensors (`{spec.name}`)"
    return None


def unranked_inputs(signature: Signature, name: str) -> str | None:
    """Why a backend that needs each input's rank declines a model with an input of no declared
    shape (any rank), or None."""
    unranked = [spec.name for spec in signature.required if not spec.ranked]
    if unranked:
        return f"{name} needs each input's rank, and {unranked} declare no shape"
    return None


def missing_module(modules: Mapping[str, str], platform: Platform) -> str | None:
    """What to install, for the first of a backend's `modules` (import name -> how to get it)
    this machine lacks; None when all import."""
    return next((how for name, how in modules.items() if name not in platform.modules), None)


MACHINE_FAULTS = (
    "out of memory",
    "failed to allocate",
    "bad_alloc",
    "bad allocation",
    "cuda failure",
    "cuda error",
    "cudaerror",
    "cublas failure",
    "cudnn failure",
)
"""Words (lowercase) of a failed run that are the machine's fault, not the request's."""


def run_failure(backend: str, message: str) -> EdgeserveError:
    """A run that failed on inputs the door let through (their datatype, dims and ranges
    checked, so the loaded and warmed model is not refused their form): the model failed on
    their values (TopK's k past its axis, a Reshape to a shape an input gives), which is
    ModelRefused (422) with the backend's words; BackendError (500) where the words say the
    machine failed (memory, the GPU)."""
    if any(fault in message.lower() for fault in MACHINE_FAULTS):
        return BackendError(f"{backend}: inference failed: {message}")
    return ModelRefused(f"{backend}: the model failed on the request's values: {message}")


@dataclass(frozen=True)
class TritonNames:
    """How Triton names a backend in model metadata and config (`platform`, `backend`) and the
    kind of its instance group."""

    platform: str
    backend: str
    instance_kind: str = "KIND_CPU"


@dataclass(frozen=True)
class LoadOptions:
    """`signature` is the one the bundle holds (backends never read the model for it); `device`
    is "cpu" or "cuda:N"; `profile` bounds the input shapes (TensorRT needs one); `prepared` is
    the folder where the backend's `prepare` wrote its files (the bundle), if it did."""

    signature: Signature
    precision: Precision = "fp32"
    threads: int = 0
    instances: int = 1
    device: str = "cpu"
    profile: ShapeProfile | None = None
    prepared: Path | None = None
    cache_dir: Path | None = None
    buckets: bool | None = None
    """Run batches at bucket shapes in bound buffers (None: where CUDA is used)."""
    cuda_graphs: bool = False
    """Run each bucket's batches as a CUDA graph (ONNX Runtime on CUDA, where it can capture)."""
    shares_cpu: bool = False
    """Other inference processes run on this CPU too: no thread is pinned to a core."""

    @property
    def cuda_device(self) -> int | None:
        """The CUDA device index, or None when the device is the CPU."""
        return cuda_index(self.device)


def cuda_index(device: str) -> int | None:
    """The CUDA device index of "cuda:N" ("cuda": 0), None for "cpu"; ConfigError otherwise."""
    if device == "cpu":
        return None
    kind, _, index = device.partition(":")
    if kind != "cuda" or not (index or "0").isdigit():
        raise ConfigError(f"device {device!r}: expected 'cpu' or 'cuda:<index>'")
    return int(index or "0")
