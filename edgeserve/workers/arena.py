"""The shared memory a front's tensors cross in: one memfd per front, a block per request.

The front owns its arena: it allocates a block per request, writes the request's tensors into
it once, and frees it when the inference process has answered, never before, so the inference
process may read the inputs in place (stacking them into its batch buffer is the only copy) and
write the outputs back into the same block. What does not fit (outputs larger than the inputs,
BYTES tensors) travels inline in the control message instead.

The arena is an anonymous memfd handed over a unix socket (SCM_RIGHTS): nothing to unlink,
and the kernel frees it when the last of the two processes holding it exits.
"""

from __future__ import annotations

import bisect
import math
import mmap
import os

import numpy as np

from edgeserve.batching.rows import copy_rows
from edgeserve.types import TensorDict

ALIGN = 64
"""Block and tensor alignment: a cache line, and what SIMD loads like."""

Ref = tuple[str, tuple[int, ...], int]
"""A tensor in the arena: (dtype.str, shape, offset)."""
Placed = dict[str, Ref | np.ndarray]
"""Tensors by name, each in the arena (a Ref) or inline (an array: wire.py's ARRAY or TEXTS)."""


class Arena:
    """A shared memory region; `tensors` and `place` read and write tensors in it."""

    def __init__(self, fd: int, size: int) -> None:
        self.fd = fd
        self.size = size
        self._map = mmap.mmap(fd, size)
        self.buffer = memoryview(self._map)

    @classmethod
    def create(cls, size: int) -> Arena:
        fd = os.memfd_create("edgeserve-arena", os.MFD_CLOEXEC)
        os.ftruncate(fd, size)
        return cls(fd, size)

    def tensors(self, placed: Placed) -> TensorDict:
        """Arrays over the arena (no copy) for each Ref, the inline arrays as they came."""
        return {name: self._view(where) for name, where in placed.items()}

    def copied(self, placed: Placed) -> TensorDict:
        """Like `tensors`, but owning their memory: for results read before their block is freed."""
        return {name: np.array(array) for name, array in self.tensors(placed).items()}

    def place(self, tensors: TensorDict, offset: int, size: int) -> Placed:
        """Write `tensors` into the block [offset, offset + size); what does not fit is inline."""
        placed: Placed = {}
        end = offset + size
        for name, array in tensors.items():
            nbytes = array.nbytes
            if array.dtype.hasobject or offset + nbytes > end:
                placed[name] = np.asarray(array, order="C")  # ascontiguousarray: rank 0 -> 1
                continue
            target = np.frombuffer(self.buffer, array.dtype, array.size, offset)
            copy_rows(target, array.reshape(-1))  # the GIL held: see copy_rows
            placed[name] = (array.dtype.str, array.shape, offset)
            offset += _aligned(nbytes)
        return placed

    def _view(self, where: Ref | np.ndarray) -> np.ndarray:
        if isinstance(where, np.ndarray):
            return where
        dtype, shape, offset = where
        count = math.prod(shape)  # numpy's prod costs 3 us a tensor
        return np.frombuffer(self.buffer, np.dtype(dtype), count, offset).reshape(shape)

    def close(self) -> None:
        """Close the descriptor; the mapping goes with the last array over it (closing it
        now would fail while a batch still holds a view)."""
        os.close(self.fd)


class Blocks:
    """First-fit allocation of arena blocks, with neighbours merged on free (front side only)."""

    def __init__(self, size: int) -> None:
        self._starts = [0]  # free ranges, sorted by start
        self._sizes = [size]

    def allocate(self, nbytes: int) -> int | None:
        """The offset of a free block of at least `nbytes`, or None when none is free."""
        nbytes = _aligned(max(nbytes, 1))
        for index, free in enumerate(self._sizes):
            if free >= nbytes:
                offset = self._starts[index]
                if free == nbytes:
                    del self._starts[index], self._sizes[index]
                else:
                    self._starts[index] += nbytes
                    self._sizes[index] -= nbytes
                return offset
        return None

    def free(self, offset: int, nbytes: int) -> None:
        nbytes = _aligned(max(nbytes, 1))
        index = bisect.bisect(self._starts, offset)
        if index and self._starts[index - 1] + self._sizes[index - 1] == offset:
            index -= 1
            self._sizes[index] += nbytes
        else:
            self._starts.insert(index, offset)
            self._sizes.insert(index, nbytes)
        following = index + 1
        if following < len(self._starts) and offset + nbytes == self._starts[following]:
            self._sizes[index] += self._sizes[following]
            del self._starts[following], self._sizes[following]

    @property
    def free_bytes(self) -> int:
        return sum(self._sizes)


def block_size(tensors: TensorDict) -> int:
    """Bytes a block needs to hold `tensors` (object arrays travel inline and take none)."""
    return sum(_aligned(a.nbytes) for a in tensors.values() if not a.dtype.hasobject)


def _aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN
