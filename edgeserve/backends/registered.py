"""Host memory the GPU reads in place: the fronts' arenas, registered with CUDA.

A ResNet-18 row is 602 KB. Copied by a CPU core from a front's arena into the pinned staging
buffer, a batch of 32 took 6-9 ms (2.5 GB/s: the arenas are written by other cores), longer than
the batch's run, so system shared memory served 0.80 of the in-process limit (RESULTS-gpu.md,
thirteenth session). Registered with `cudaHostRegister`, an arena is memory the GPU's copy
engine reads itself: each large row goes to the device in one asynchronous copy and no core
copies it.

Registering pins memory, so an arena is registered in chunks, each on the first large row that
lies in it (rows come from its low blocks: the front allocates first-fit). A row across two
chunks is staged as before. A front that goes away retires its arena: its chunks are
unregistered once no batch still copies from them.

The calls go to the libcudart that ONNX Runtime loaded, through ctypes.PyDLL, which keeps the
GIL: queueing a copy takes microseconds, while a call that lets the GIL go (cuda-python's, or
ctypes.CDLL's) waits up to a switch interval to get it back beside the busy event loop. Only
the calls that wait (a stream's end, registering) let it go. The registry is process-wide,
as CUDA's registration is.
"""

from __future__ import annotations

import bisect
import ctypes
import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from edgeserve.errors import BackendError

log = logging.getLogger(__name__)

DIRECT_BYTES = 256 * 2**10
"""A part at least this large is copied to the device from where it lies; a smaller one is
stacked by the CPU first (quick, with the GIL held: batching/rows.py) and goes in the batch's
one copy, since every copy the GPU makes costs it a few microseconds of its own."""
CHUNK = 32 * 2**20
_HOST_TO_DEVICE = 1  # cudaMemcpyHostToDevice
_NON_BLOCKING = 1  # cudaStreamNonBlocking
_PORTABLE = 1  # cudaHostRegisterPortable
_NOT_READY = 600  # cudaErrorNotReady


class Cudart:
    """The few libcudart calls of the direct path: `held` keeps the GIL, `released` lets it go."""

    def __init__(self, path: str) -> None:
        self.held = ctypes.PyDLL(path)
        self.released = ctypes.CDLL(path)
        for library in (self.held, self.released):
            library.cudaGetErrorString.restype = ctypes.c_char_p
            library.cudaMemcpyAsync.argtypes = [
                ctypes.c_void_p,
                ctypes.c_void_p,
                ctypes.c_size_t,
                ctypes.c_int,
                ctypes.c_void_p,
            ]
            library.cudaHostRegister.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint]
            library.cudaHostUnregister.argtypes = [ctypes.c_void_p]
            library.cudaStreamSynchronize.argtypes = [ctypes.c_void_p]
            library.cudaStreamQuery.argtypes = [ctypes.c_void_p]

    def check(self, status: int, call: str) -> None:
        if status:
            self.held.cudaGetLastError()  # or ONNX Runtime's next check on this thread sees it
            text = self.held.cudaGetErrorString(status).decode(errors="replace")
            raise BackendError(f"CUDA call {call} failed: {text} ({status})")


def loaded_cudart() -> Cudart | None:
    """The libcudart this process has loaded (ONNX Runtime's CUDA provider), or None."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    paths = {line.split()[-1] for line in maps.splitlines() if "/libcudart.so" in line}
    return Cudart(min(paths)) if paths else None


class Stream:
    """A thread's queue of copies to the device, and the parts they read until they are done."""

    def __init__(self, cudart: Cudart, device: int) -> None:
        self._cudart = cudart
        cudart.check(cudart.held.cudaSetDevice(device), "cudaSetDevice")
        handle = ctypes.c_void_p()
        status = cudart.held.cudaStreamCreateWithFlags(ctypes.byref(handle), _NON_BLOCKING)
        cudart.check(status, "cudaStreamCreateWithFlags")
        self._handle = handle
        self._device = device
        self._leases: list[Region] = []

    def to_device(self, target: int, source: int, nbytes: int) -> None:
        if nbytes:
            status = self._cudart.held.cudaMemcpyAsync(
                target, source, nbytes, _HOST_TO_DEVICE, self._handle
            )
            self._cudart.check(status, "cudaMemcpyAsync")

    def hold(self, arena: Region) -> None:
        """Keep `arena` registered until this stream's copies are done."""
        self._leases.append(arena)

    def wait(self) -> None:
        """Until every copy queued is done; then the arenas read may go. The GIL is let go
        only if they are not done yet."""
        status = self._cudart.held.cudaStreamQuery(self._handle)
        if status == _NOT_READY:
            self._cudart.held.cudaGetLastError()  # not an error: nothing must see it
            status = self._cudart.released.cudaStreamSynchronize(self._handle)
        leases, self._leases = self._leases, []
        for arena in leases:
            REGISTRY.release(arena)
        self._cudart.check(status, "cudaStreamSynchronize")


@dataclass(eq=False)
class Region:
    """A front's arena as the registry sees it: which chunks are registered, who reads them."""

    start: int
    size: int
    chunks: dict[int, int] = field(default_factory=dict)  # index -> address registered
    users: int = 0
    retired: bool = False
    failed: bool = False


class Registry:
    """The arenas shared with this process (`share`), registered chunk by chunk on `lease`."""

    def __init__(self) -> None:
        self.cudart: Cudart | None = None
        self._lock = threading.Lock()
        self._arenas: list[Region] = []  # sorted by start
        self._starts: list[int] = []

    def enable(self, cudart: Cudart) -> None:
        """From now on arenas shared are read in place (a backend that copies to a GPU)."""
        self.cudart = cudart

    def share(self, buffer: memoryview) -> None:
        """A front's arena: the GPU may read it in place (nothing is registered yet)."""
        if self.cudart is None or not len(buffer):
            return
        arena = Region(_address(buffer), len(buffer))
        with self._lock:
            index = bisect.bisect(self._starts, arena.start)
            self._starts.insert(index, arena.start)
            self._arenas.insert(index, arena)

    def retire(self, buffer: memoryview) -> None:
        """The front has gone: unregister its arena once no copy reads it."""
        if self.cudart is None or not len(buffer):
            return
        with self._lock:
            arena = self._find(_address(buffer), 1)
            if arena is None:
                return
            arena.retired = True
            index = self._arenas.index(arena)
            del self._arenas[index], self._starts[index]
            if not arena.users:
                self._unregister(arena)

    def lease(self, address: int, nbytes: int) -> Region | None:
        """The arena `nbytes` at `address` lie in, registered there and held until `release`;
        None where they are not in one chunk of a shared arena (then the CPU stages them)."""
        if self.cudart is None:
            return None
        with self._lock:
            arena = self._find(address, nbytes)
            if arena is None or arena.failed:
                return None
            chunk = (address - arena.start) // CHUNK
            across = (address + nbytes - 1 - arena.start) // CHUNK != chunk
            if across or not self._registered(arena, chunk):
                return None
            arena.users += 1
            return arena

    def release(self, arena: Region) -> None:
        with self._lock:
            arena.users -= 1
            if arena.retired and not arena.users:
                self._unregister(arena)

    def registered_bytes(self) -> int:
        """Host memory registered now (pinned), over every arena shared."""
        with self._lock:
            return sum(self._chunk_size(arena, i) for arena in self._arenas for i in arena.chunks)

    def _find(self, address: int, nbytes: int) -> Region | None:
        index = bisect.bisect(self._starts, address) - 1
        if index < 0:
            return None
        arena = self._arenas[index]
        return arena if address + nbytes <= arena.start + arena.size else None

    def _registered(self, arena: Region, chunk: int) -> bool:
        if chunk in arena.chunks:
            return True
        assert self.cudart is not None
        address = arena.start + chunk * CHUNK
        status = self.cudart.released.cudaHostRegister(
            address, self._chunk_size(arena, chunk), _PORTABLE
        )
        try:
            self.cudart.check(status, "cudaHostRegister")
        except BackendError as exc:
            log.warning("rows are staged by the CPU: a front's arena cannot be registered: %s", exc)
            arena.failed = True
            return False
        arena.chunks[chunk] = address
        return True

    def _unregister(self, arena: Region) -> None:
        assert self.cudart is not None
        for address in arena.chunks.values():
            status = self.cudart.released.cudaHostUnregister(address)
            try:
                self.cudart.check(status, "cudaHostUnregister")
            except BackendError as exc:
                log.warning("a retired arena stays registered: %s", exc)
        arena.chunks.clear()

    @staticmethod
    def _chunk_size(arena: Region, chunk: int) -> int:
        return min(CHUNK, arena.size - chunk * CHUNK)


def _address(buffer: memoryview) -> int:
    return int(np.frombuffer(buffer, np.uint8, count=1).ctypes.data)


REGISTRY = Registry()
