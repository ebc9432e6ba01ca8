"""CUDA shared-memory regions: Triton's CUDA shared-memory extension, through cuda-python.

A client on this machine allocates GPU memory, exports it as a CUDA IPC handle
(`cudaIpcGetMemHandle`; tritonclient.utils.cuda_shared_memory does both) and registers
{"raw_handle": {"b64": <the handle's 64 bytes, base64>}, "device_id": N, "byte_size": B}. Each
server process opens the handle once (`cudaIpcOpenMemHandle`) and then reads an input by one
copy from the device to the host, and writes an output by one copy to the device. A handle
opens only in another process than the one that made it (CUDA's rule).

This is one more kind of `sharedmemory.Region`: the registry, the routes and the v2 decoder are
shared with system regions. Without cuda-python or a GPU, registering is refused (400).
"""

from __future__ import annotations

import base64
import binascii
import ctypes
import weakref
from collections.abc import Mapping
from typing import Any

import numpy as np

from edgeserve.backends import cuda
from edgeserve.errors import BackendError, InvalidInput, echo, echo_repr
from edgeserve.transport import HTTP, Transport

HANDLE_BYTES = 64  # sizeof(cudaIpcMemHandle_t)


class CudaRegion:
    """`byte_size` bytes of device `device_id` memory that another process exported."""

    kind = "cuda"

    def __init__(self, name: str, device_id: int, byte_size: int, pointer: int) -> None:
        self.name = name
        self.device_id = device_id
        self.byte_size = byte_size
        self.pointer = pointer
        weakref.finalize(self, _close, pointer)  # the handle closes with the last reference

    def read(self, offset: int, size: int) -> memoryview:
        host = np.empty(size, np.uint8)
        self._copy(host.ctypes.data, self.pointer + offset, size, "DeviceToHost")
        return host.data.toreadonly()

    def write(self, offset: int, data: bytes | memoryview) -> None:
        host = np.frombuffer(data, np.uint8)
        self._copy(self.pointer + offset, host.ctypes.data, host.nbytes, "HostToDevice")

    def status(self) -> dict[str, Any]:
        return {"name": self.name, "device_id": self.device_id, "byte_size": self.byte_size}

    def _copy(self, dst: int, src: int, size: int, direction: str) -> None:
        cudart = cuda.runtime()
        kind = getattr(cudart.cudaMemcpyKind, f"cudaMemcpy{direction}")
        cuda.check(cudart.cudaSetDevice(self.device_id), "cudaSetDevice")  # per thread
        cuda.check(cudart.cudaMemcpy(dst, src, size, kind), f"cudaMemcpy ({direction})")


def open_cuda_region(name: str, body: Mapping[str, Any], transport: Transport = HTTP) -> CudaRegion:
    """Open a registration {"raw_handle": {"b64"}, "device_id", "byte_size"}; 400 if it is bad,
    or if this server has no CUDA (then status lists none and unregister is a no-op, as clients
    that clean up every kind expect)."""
    where = f"CUDA shared memory region `{echo(name)}`"
    cudart = _runtime(where, transport)
    handle, device_id, byte_size = _parse(where, body)
    try:
        cuda.check(cudart.cudaSetDevice(device_id), "cudaSetDevice")
        ipc = cudart.cudaIpcMemHandle_t()
        # the handle's bytes written into the struct: cuda-bindings 13 no longer has `reserved`
        ctypes.memmove(ipc.getPtr(), handle, HANDLE_BYTES)
        flags = cudart.cudaIpcMemLazyEnablePeerAccess
        pointer = int(cuda.check(cudart.cudaIpcOpenMemHandle(ipc, flags), "cudaIpcOpenMemHandle"))
    except BackendError as exc:
        raise InvalidInput(
            f"{where}: {exc}. Hint: the handle must come from cudaIpcGetMemHandle in another "
            f"process on this machine, for device_id {device_id}"
        ) from None
    return CudaRegion(name, device_id, byte_size, pointer)


def available() -> bool:
    """Whether this process can open CUDA regions: cuda-python imports and sees a GPU."""
    try:
        return bool(cuda.check(cuda.runtime().cudaGetDeviceCount(), "cudaGetDeviceCount"))
    except BackendError:
        return False


def _runtime(where: str, transport: Transport) -> Any:
    """cuda-python's runtime when this machine has a GPU for it; else 400 saying what to use."""
    if not available():
        raise InvalidInput(
            f"{where}: not served here (no GPU, or no cuda-python, in this server). "
            f"Hint: use system shared memory ({transport.system_shm})"
        )
    return cuda.runtime()


def _parse(where: str, body: Mapping[str, Any]) -> tuple[bytes, int, int]:
    raw, device_id, byte_size = body.get("raw_handle"), body.get("device_id"), body.get("byte_size")
    encoded = raw.get("b64") if isinstance(raw, dict) else None
    try:
        # Triton's C++ clients (perf_analyzer) encode with libb64, which breaks lines
        text = "".join(encoded.split()) if isinstance(encoded, str) else ""
        handle = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        handle = b""
    device, size = _int(device_id, 0), _int(byte_size, 1)
    if len(handle) != HANDLE_BYTES or device is None or size is None:
        raise InvalidInput(
            f'{where}: expected {{"raw_handle": {{"b64": <base64 of the {HANDLE_BYTES}-byte '
            'cudaIpcMemHandle_t>}, "device_id": <int >= 0>, "byte_size": <int > 0>}, got '
            f"raw_handle {echo_repr(raw)}, device_id {echo_repr(device_id)}, "
            f"byte_size {echo_repr(byte_size)}"
        )
    return handle, device, size


def _int(value: object, least: int) -> int | None:
    fits = isinstance(value, int) and not isinstance(value, bool) and value >= least
    return value if fits and isinstance(value, int) else None


def _close(pointer: int) -> None:
    cuda.runtime().cudaIpcCloseMemHandle(pointer)
