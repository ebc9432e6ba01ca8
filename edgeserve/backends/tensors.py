"""What every backend checks before it runs (names, dtypes, shapes) and the shape ranges it serves.

Checking here, against the model's own signature, gives one clear `InvalidInput` message whatever
the engine (ONNX Runtime, OpenVINO and TensorRT word their shape errors differently, or not at all).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from edgeserve import datatypes
from edgeserve.errors import ConfigError, InvalidInput
from edgeserve.types import Signature, TensorDict, TensorSpec

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
    """One range per input: batch from 1 to max_batch_size (opt: the largest preferred size).

    max_batch_size 0 (batching off) leaves a dynamic batch axis like any other dynamic dim.
    """
    opt_batch = max(preferred_batch_sizes, default=max_batch_size)
    profile = {}
    for spec in signature.inputs:
        ranges = [_dim_range(dim, dynamic_dim) for dim in spec.dims]
        if signature.batched and spec.dims and max_batch_size > 0:
            ranges[0] = (1, opt_batch, max_batch_size)
        lows, opts, highs = zip(*ranges, strict=True) if ranges else ((), (), ())
        profile[spec.name] = ShapeRange(tuple(lows), tuple(opts), tuple(highs))
    return profile


def _dim_range(dim: int, dynamic: tuple[int, int, int]) -> tuple[int, int, int]:
    if dim == -1:
        return dynamic
    if dim < 0:
        raise ConfigError(f"dimension {dim} is neither fixed nor -1 (dynamic)")
    return (dim, dim, dim)


def check_inputs(
    inputs: TensorDict, specs: Sequence[TensorSpec], profile: ShapeProfile | None
) -> None:
    """Raise InvalidInput unless `inputs` holds exactly the model's tensors, of fitting shape."""
    expected = {spec.name for spec in specs}
    unknown = sorted(set(inputs) - expected)
    missing = sorted(expected - set(inputs))
    if unknown or missing:
        raise InvalidInput(
            f"inputs: expected tensors {sorted(expected)}, got {sorted(inputs)}"
            f" (unknown: {unknown or '-'}, missing: {missing or '-'})"
        )
    for spec in specs:
        _check_tensor(inputs[spec.name], spec, profile.get(spec.name) if profile else None)


def _check_tensor(array: object, spec: TensorSpec, within: ShapeRange | None) -> None:
    dtype = datatypes.DATATYPES[spec.datatype].numpy
    shape = tuple(getattr(array, "shape", ()))
    got_dtype = getattr(array, "dtype", type(array).__name__)
    fits = len(shape) == len(spec.dims) and all(
        want in (-1, got) for want, got in zip(spec.dims, shape, strict=True)
    )
    if not fits or got_dtype != dtype:
        raise InvalidInput(
            f"tensor `{spec.name}`: expected {list(spec.dims)} {dtype}, "
            f"got {list(shape)} {got_dtype}"
        )
    if within is not None and not within.admits(shape):
        raise InvalidInput(
            f"tensor `{spec.name}`: shape {list(shape)} is outside the range this model was "
            f"loaded for: {list(within.min)} .. {list(within.max)}"
        )
