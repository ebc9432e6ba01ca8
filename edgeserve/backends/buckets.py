"""Buckets: the few input shapes a GPU session is kept warm for, and the shape a batch runs at.

ONNX Runtime's CUDA provider re-plans its cuDNN kernels whenever an input shape changes, and
caches only the last shape: on an H100 a CRNN batch at a new line width took 67-190 ms against
8 ms at a width it had just run, and going back to an earlier width re-planned again. So a
session is opened per bucket shape and only ever sees that shape: the batch axis is rounded up
to a power of two (or max_batch_size), each padded axis (`pad_axis` in the manifest, e.g. OCR
line widths) to the next of a short geometric ladder, and every bucket is warmed at load.

Pure (numpy only): no engine is imported here, so the choice of shape is tested without a GPU.
"""

from __future__ import annotations

import itertools
from collections.abc import Container, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from edgeserve.batching.rows import copy_rows
from edgeserve.shapes import UNBOUNDED, Shape, ShapeProfile
from edgeserve.types import Signature, TensorDict

PAD_LADDER = (64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048)
"""Sizes a padded axis is rounded up to (at most 1.5x wasted): OCR lines run 16-2048 columns."""


def row_buckets(highest: int) -> tuple[int, ...]:
    """Powers of two up to `highest`, and `highest` itself: at most 2x the rows a batch needs."""
    sizes = {1 << power for power in range(highest.bit_length()) if 1 << power <= highest}
    return tuple(sorted(sizes | {highest})) if highest > 0 else ()


def pad_buckets(low: int, high: int) -> tuple[int, ...]:
    """The ladder cut to [low, high] (high -1: the whole ladder), ending exactly at `high`."""
    top = PAD_LADDER[-1] if high == UNBOUNDED else high
    sizes = [size for size in PAD_LADDER if low <= size < top]
    return (*sizes, top)


@dataclass(frozen=True)
class Buckets:
    """Rows per batch and sizes per padded axis ({input: {axis: sizes}}) that sessions exist for."""

    rows: tuple[int, ...] = ()
    padded: Mapping[str, Mapping[int, tuple[int, ...]]] = field(default_factory=dict)

    def shape(self, name: str, shape: Shape) -> Shape | None:
        """The bucket shape `shape` runs at (None: larger than every bucket on some axis)."""
        axes = dict(self.padded.get(name, {}))
        if self.rows:
            axes[0] = self.rows
        out = list(shape)
        for axis, sizes in axes.items():
            size = next((s for s in sizes if s >= shape[axis]), None)
            if size is None:
                return None
            out[axis] = size
        return tuple(out)

    def shapes(self, shapes: Mapping[str, Shape]) -> dict[str, Shape] | None:
        """Bucket shapes for every input of a batch, or None when one does not fit a bucket."""
        fitted = {name: self.shape(name, shape) for name, shape in shapes.items()}
        if any(shape is None for shape in fitted.values()):
            return None
        return {name: shape for name, shape in fitted.items() if shape is not None}

    def decides(self, dims: Mapping[str, Shape]) -> bool:
        """Whether every dynamic dim of inputs of `dims` (-1) is a bucket's to choose."""
        return bool(self.rows) and all(
            dim >= 0 or axis == 0 or axis in self.padded.get(name, {})
            for name, shape in dims.items()
            for axis, dim in enumerate(shape)
        )

    def every(self, dims: Mapping[str, Shape]) -> Iterator[dict[str, Shape]]:
        """Every bucket combination for inputs of `dims` (-1 where a bucket decides), to warm."""
        choices: list[tuple[str, int, tuple[int, ...]]] = [
            (name, axis, sizes)
            for name, axes in self.padded.items()
            for axis, sizes in axes.items()
        ]
        row_choices = self.rows or (None,)
        for rows, sizes in itertools.product(
            row_choices, itertools.product(*(c[2] for c in choices))
        ):
            shapes = {name: list(shape) for name, shape in dims.items()}
            for (name, axis, _), size in zip(choices, sizes, strict=True):
                shapes[name][axis] = size
            if rows is not None:
                for shape in shapes.values():
                    shape[0] = rows
            yield {name: tuple(shape) for name, shape in shapes.items()}


def buckets_for(signature: Signature, profile: ShapeProfile | None) -> Buckets:
    """Buckets from the shape profile: rows up to its max batch, padded axes (the manifest's
    `pad_axis`, in the bundle's signature) over their range."""
    if not profile or not signature.batched:
        return Buckets()
    rows = row_buckets(max(r.max[0] for r in profile.values() if r.max))
    padded = {
        spec.name: {
            spec.pad_axis: pad_buckets(ranges.min[spec.pad_axis], ranges.max[spec.pad_axis])
        }
        for spec in signature.inputs
        if spec.pad_axis is not None and (ranges := profile.get(spec.name)) is not None
    }
    return Buckets(rows, padded)


def write_parts(
    buffers: Mapping[str, np.ndarray],
    parts: Sequence[TensorDict],
    fills: Mapping[str, float],
    skip: Container[tuple[int, str]] = (),
) -> int:
    """Write the parts' rows one after another into `buffers` (a bucket's shapes; what a part
    lacks on a padded axis is its fill); the number of rows. The rows of (part index, input)
    in `skip` are left as they are (the GPU reads those parts where they lie)."""
    rows = 0
    for name, buffer in buffers.items():
        rows = 0
        for index, part in enumerate(parts):
            array = part[name]
            if (index, name) in skip:
                rows += len(array)
                continue
            region = buffer[rows : rows + len(array)]
            if array.shape[1:] != buffer.shape[1:]:
                region.fill(fills.get(name, 0.0))
                region = region[(slice(None), *(slice(0, dim) for dim in array.shape[1:]))]
            copy_rows(region, array)
            rows += len(array)
    return rows


def batch_shapes(parts: Sequence[TensorDict]) -> dict[str, Shape]:
    """The shape of each stacked input: rows added up, other dims the largest of any part."""
    return {
        name: (
            sum(len(part[name]) for part in parts),
            *(max(dims) for dims in zip(*(part[name].shape[1:] for part in parts), strict=True)),
        )
        for name in parts[0]
    }
