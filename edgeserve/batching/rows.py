"""Stacking and splitting rows: many requests' tensors into one batch, and back (pure)."""

from __future__ import annotations

import itertools
from collections.abc import Collection, Hashable, Mapping, Sequence

import numpy as np

from edgeserve.batching.plan import Alone
from edgeserve.errors import BackendError
from edgeserve.types import TensorDict


def stack_rows(parts: Sequence[TensorDict], fills: Mapping[str, float]) -> TensorDict:
    """Stack each tensor along axis 0; shorter non-batch dims are padded with `fills[name]`."""
    if len(parts) == 1:
        return parts[0]
    return {name: _stack([part[name] for part in parts], fills.get(name, 0.0)) for name in parts[0]}


def _stack(arrays: list[np.ndarray], fill: float) -> np.ndarray:
    inner = tuple(max(dims) for dims in zip(*(array.shape[1:] for array in arrays), strict=True))
    if all(array.shape[1:] == inner for array in arrays):
        return _concatenate(arrays)
    out = np.full((sum(len(array) for array in arrays), *inner), fill, dtype=arrays[0].dtype)
    start = 0
    for array in arrays:
        out[(slice(start, start + len(array)), *(slice(0, dim) for dim in array.shape[1:]))] = array
        start += len(array)
    return out


def _concatenate(arrays: list[np.ndarray]) -> np.ndarray:
    """`np.concatenate(arrays)`, but parts that numpy would copy letting the GIL go, and that
    are small enough to copy holding it (`copy_rows`), are copied as bytes holding it."""
    if all(array.size <= NUMPY_KEEPS_GIL_ITEMS for array in arrays) or any(
        array.nbytes > HELD_COPY_BYTES for array in arrays
    ):
        return np.concatenate(arrays)
    out = np.empty((sum(len(array) for array in arrays), *arrays[0].shape[1:]), arrays[0].dtype)
    try:
        target, start = out.data.cast("B"), 0
        for array in arrays:
            end = start + array.nbytes
            target[start:end] = array.data.cast("B")
            start = end
    except (TypeError, ValueError, BufferError):  # strided parts, or a type memoryview lacks
        return np.concatenate(arrays)
    return out


NUMPY_KEEPS_GIL_ITEMS = 500
"""numpy copies up to this many items holding the GIL (its NPY_BEGIN_THREADS_THRESHOLDED):
np.concatenate of such parts is the quickest stacking (32 MLP rows: 3.6 us, against 9.5 us
copied as bytes)."""


HELD_COPY_BYTES = 256 * 1024
"""Up to here a copy (about 25 us) is far shorter than the wait for the GIL after it. A larger
one lets the GIL go, so the event loop runs beside it: ResNet's 600 KB rows served no faster
held (benchmarks/RESULTS-gpu.md, thirteenth session)."""


def copy_rows(out: np.ndarray, array: np.ndarray) -> None:
    """`out[...] = array`; a small contiguous copy keeps the GIL throughout.

    numpy lets the GIL go for a contiguous copy of more than about a thousand items, and must
    then get it back: where another thread of the process is busy in Python (the inference
    process's event loop, answering the fronts) each such copy waits up to a switch interval
    for it. On a 16-core GPU host, stacking 32 CRNN rows of 16 KB took 0.06 ms alone, 4.7-8.0
    ms beside a busy thread, 0.07 ms held; served at c=128, a batch's input phase fell from
    2.0-2.5 ms to 0.75-0.84 ms (benchmarks/gil_copies.py and RESULTS-gpu.md). A memoryview
    copy is one memcpy that keeps the GIL; what it cannot take (strided views, types the
    buffer protocol lacks, such as bfloat16) goes to numpy."""
    if out.shape == array.shape and out.dtype == array.dtype and array.nbytes <= HELD_COPY_BYTES:
        try:
            out.data.cast("B")[:] = array.data.cast("B")
            return
        except (TypeError, ValueError, BufferError):
            pass
    np.copyto(out, array, casting="no")


def split_rows(
    tensors: TensorDict, sizes: Sequence[int], whole: Collection[str] = ()
) -> list[TensorDict]:
    """Slice every tensor along axis 0 into consecutive parts of `sizes` rows (views); those
    named in `whole` (no batch axis) go to every part as they are."""
    if len(sizes) == 1:
        return [tensors]
    bounds = itertools.pairwise(itertools.accumulate(sizes, initial=0))
    return [
        {name: array if name in whole else array[lo:hi] for name, array in tensors.items()}
        for lo, hi in bounds
    ]


def split_outputs(outputs: TensorDict, sizes: Sequence[int], batched: bool) -> list[TensorDict]:
    """A batch's outputs split back into its requests' parts; a batched model's outputs must
    have one row per input row (BackendError: the backend answered another batch)."""
    rows = sum(sizes)
    if batched and (
        wrong := {n: a.shape for n, a in outputs.items() if not a.ndim or len(a) != rows}
    ):
        raise BackendError(f"outputs {wrong}: expected {rows} rows for the batch")
    return split_rows(outputs, sizes)


def part_sizes(rows: int, max_rows: int) -> list[int]:
    """A request larger than max_rows is split into parts of at most max_rows."""
    if not max_rows or rows <= max_rows:
        return [rows]
    return [max_rows] * (rows // max_rows) + ([rows % max_rows] if rows % max_rows else [])


def request_parts(
    inputs: TensorDict, rows: int, max_rows: int, whole: Collection[str] = ()
) -> list[tuple[TensorDict, int]]:
    """A request's parts of at most max_rows rows each (views), with their row counts; the
    tensors named in `whole` go to each part whole."""
    sizes = part_sizes(rows, max_rows)
    return list(zip(split_rows(inputs, sizes, whole), sizes, strict=True))


def rows_of(inputs: TensorDict, batched: bool, whole: Collection[str] = ()) -> int:
    """Rows of a request: 1 for an unbatched model, else the length of axis 0 (the same for
    every input but those sent `whole`, and at least 1: the data plane's checks saw to it)."""
    if not batched:
        return 1
    return int(next(a for name, a in inputs.items() if name not in whole).shape[0])


def batch_key(
    pad_axes: Mapping[str, int], batched: bool, whole: Collection[str], part: TensorDict
) -> Hashable:
    """Items stack when names, dtypes and non-batch dims agree (pad axes excepted): requests
    sending an optional input stack only with others sending it, and never one sending an
    input `whole` (a weight, a setting, whose values may differ): a key equal to no other."""
    if not batched:
        return None
    key = []
    for name, array in part.items():  # a loop: any(), a generator, sorted() took 1.2 us, this 0.6
        if name in whole:
            return Alone()
        key.append((name, array.dtype.str, key_dims(array.shape, pad_axes.get(name))))
    if len(key) > 1:
        key.sort()
    return tuple(key)


def key_dims(shape: tuple[int, ...], pad_axis: int | None) -> tuple[int, ...]:
    """The non-batch dims that must agree for rows to stack (a pad axis may differ: -1)."""
    if pad_axis is None:
        return shape[1:]
    return tuple(-1 if axis == pad_axis else dim for axis, dim in enumerate(shape) if axis)
