"""The shape profile: per input, the smallest, the most frequent and the largest shape served.

The runtime derives it from the signature and the batching settings; a backend compiles for it
(TensorRT's optimization profile, OpenVINO's bounded reshape) and says which shapes it accepts
(`Backend.profile`); the data plane refuses, at the door, a request outside it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from edgeserve.errors import ConfigError
from edgeserve.types import Signature

Shape = tuple[int, ...]

UNBOUNDED = -1
DYNAMIC_DIM = (1, 256, UNBOUNDED)
"""(min, opt, max) of a dynamic non-batch dim when nothing narrower is known; -1: no upper bound."""


@dataclass(frozen=True)
class ShapeRange:
    """The smallest, the most frequent and the largest shape an input will be given (-1: any)."""

    min: Shape
    opt: Shape
    max: Shape

    def admits(self, shape: Shape) -> bool:
        return len(shape) == len(self.min) and all(
            lo <= n and (hi == UNBOUNDED or n <= hi)
            for lo, n, hi in zip(self.min, shape, self.max, strict=True)
        )

    def bounded(self, limit: int) -> ShapeRange:
        """This range with every unbounded dim capped at `limit` (engines that need a maximum)."""
        high = tuple(limit if hi == UNBOUNDED else hi for hi in self.max)
        return ShapeRange(self.min, tuple(map(min, self.opt, high)), high)


ShapeProfile = dict[str, ShapeRange]


def shape_profile(
    signature: Signature,
    max_batch_size: int,
    preferred_batch_sizes: Sequence[int] = (),
    dynamic_dim: tuple[int, int, int] = DYNAMIC_DIM,
) -> ShapeProfile:
    """One range per required input: batch from 1 to max_batch_size (opt: the largest preferred
    size). An optional input has none: engines that compile for ranges hold it at its default
    (its dims alone are checked at the door); nor has one of no declared shape (any rank).

    max_batch_size 0 (batching off) leaves a dynamic batch axis like any other dynamic dim.
    """
    opt_batch = max(preferred_batch_sizes, default=max_batch_size)
    profile = {}
    for spec in (spec for spec in signature.required if spec.ranked):  # else: any shape
        ranges = [
            _dim_range(dim, dynamic_dim, (spec.name, axis) in signature.may_be_empty)
            for axis, dim in enumerate(spec.dims)
        ]
        ranges = [_bounded(r, axis, spec.min_dims, spec.max_dims) for axis, r in enumerate(ranges)]
        if signature.batched and spec.dims and max_batch_size > 0:
            ranges[0] = (1, opt_batch, max_batch_size)
        lows, opts, highs = zip(*ranges, strict=True) if ranges else ((), (), ())
        profile[spec.name] = ShapeRange(tuple(lows), tuple(opts), tuple(highs))
    return profile


def _bounded(
    dim: tuple[int, int, int],
    axis: int,
    low: tuple[int, ...] | None,
    high: tuple[int, ...] | None,
) -> tuple[int, int, int]:
    """A dim's (min, opt, max) within the manifest's min_dims and max_dims (-1 there: none)."""
    lo, opt, hi = dim
    if low is not None and low[axis] != -1:
        lo = low[axis]
    if high is not None and high[axis] != -1:
        hi = high[axis]
    opt = max(opt, lo) if hi == UNBOUNDED else min(max(opt, lo), hi)
    return lo, opt, hi


def _dim_range(dim: int, dynamic: tuple[int, int, int], empty: bool) -> tuple[int, int, int]:
    """`empty`: a dynamic dim that may be 0 (`Signature.may_be_empty`)."""
    if dim == -1:
        return (0, *dynamic[1:]) if empty else dynamic
    if dim < 0:
        raise ConfigError(f"dimension {dim} is neither fixed nor -1 (dynamic)")
    return (dim, dim, dim)
