"""The little of the CUDA runtime the backends need (buffers, pinned host memory): cuda-python.

`cuda.bindings.runtime` is the cuda-python >= 12.6 / 13.x name; the old `cuda.cudart` shim (gone in
13) is the fallback. Every call returns `(cudaError_t, *values)`; `check` turns a failure into a
BackendError that names the call.
"""

from __future__ import annotations

import ctypes
import importlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgeserve.errors import BackendError


def runtime() -> Any:
    """The cuda-python runtime module, imported on first use."""
    try:
        return importlib.import_module("cuda.bindings.runtime")
    except ImportError:
        pass
    try:
        return importlib.import_module("cuda.cudart")
    except ImportError:
        raise BackendError(
            "cuda-python is not installed. Hint: pip install 'edgeserve[gpu]'"
        ) from None


def check(result: Any, call: str) -> Any:
    """Unpack `(err, *values)`; raise BackendError naming `call` unless err is cudaSuccess."""
    err, *values = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        raise BackendError(f"CUDA call {call} failed: {getattr(err, 'name', err)}")
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


@dataclass(frozen=True)
class Device:
    """What makes an engine fit a GPU: its name and compute capability."""

    index: int
    name: str
    compute_capability: tuple[int, int]


def use_device(index: int) -> Device:
    """Make `index` current for this thread and describe it."""
    cudart = runtime()
    check(cudart.cudaSetDevice(index), "cudaSetDevice")
    props = check(cudart.cudaGetDeviceProperties(index), "cudaGetDeviceProperties")
    name = props.name.decode() if isinstance(props.name, bytes) else str(props.name)
    return Device(index, name.rstrip("\x00"), (int(props.major), int(props.minor)))


def pinned(nbytes: int, dtype: np.dtype) -> tuple[int, np.ndarray]:
    """Page-locked host memory (freed by `free_pinned`) and a flat array of `dtype` over it."""
    pointer = int(check(runtime().cudaMallocHost(max(nbytes, 1)), "cudaMallocHost"))
    raw = (ctypes.c_byte * max(nbytes, 1)).from_address(pointer)
    return pointer, np.frombuffer(memoryview(raw), dtype=np.uint8, count=nbytes).view(dtype)


def free_pinned(pointer: int) -> None:
    check(runtime().cudaFreeHost(pointer), "cudaFreeHost")


class Buffers:
    """Device memory and pinned host memory owned by one thread's stream; freed by `free`."""

    def __init__(self) -> None:
        self._cudart = runtime()
        self.stream = check(self._cudart.cudaStreamCreate(), "cudaStreamCreate")
        self._device: list[int] = []
        self._host: list[int] = []

    def device(self, nbytes: int) -> int:
        pointer = int(check(self._cudart.cudaMalloc(max(nbytes, 1)), "cudaMalloc"))
        self._device.append(pointer)
        return pointer

    def pinned(self, nbytes: int, dtype: np.dtype) -> np.ndarray:
        """A flat array over page-locked host memory, so async copies really are async."""
        pointer, array = pinned(nbytes, dtype)
        self._host.append(pointer)
        return array

    def to_device(self, pointer: int, host: np.ndarray) -> None:
        kind = self._cudart.cudaMemcpyKind.cudaMemcpyHostToDevice
        call = self._cudart.cudaMemcpyAsync(
            pointer, host.ctypes.data, host.nbytes, kind, self.stream
        )
        check(call, "cudaMemcpyAsync (host to device)")

    def to_host(self, host: np.ndarray, pointer: int) -> None:
        kind = self._cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost
        call = self._cudart.cudaMemcpyAsync(
            host.ctypes.data, pointer, host.nbytes, kind, self.stream
        )
        check(call, "cudaMemcpyAsync (device to host)")

    def synchronize(self) -> None:
        check(self._cudart.cudaStreamSynchronize(self.stream), "cudaStreamSynchronize")

    def free(self) -> None:
        for pointer in self._device:
            check(self._cudart.cudaFree(pointer), "cudaFree")
        for pointer in self._host:
            check(self._cudart.cudaFreeHost(pointer), "cudaFreeHost")
        check(self._cudart.cudaStreamDestroy(self.stream), "cudaStreamDestroy")
        self._device, self._host = [], []
