"""Padding requests of different lengths into one batch, and undoing it for each (pure).

An input with a `pad_axis` may be padded to the longest of its batch-mates. The outputs then
come back at the padded length too, which would hand each request its batch-mates' length.
So padding is allowed only when every output can be cut back: each dynamic non-batch axis of
an output must be declared to follow an input's pad axis (`[model.outputs.<o>] pad_axis,
follows, ratio`), its length being floor(input length x ratio), at least 1 (a CRNN that
downsamples its width by 4 declares 0.25). A batch whose requests all have the same length was
not padded and is not cut. Where some output cannot be cut, requests of different lengths
never share a batch: `Padding.axes` is then empty and the batcher keys items by exact shape.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from edgeserve.errors import BackendError
from edgeserve.types import Signature, TensorDict


@dataclass(frozen=True)
class Cut:
    """Output `output`'s axis `axis` has floor(length x ratio) entries, `length` being the
    request's own length along input `source`'s axis `source_axis`."""

    output: str
    axis: int
    source: str
    source_axis: int
    ratio: float

    def length(self, source_length: int) -> int:
        """At least 1: a network that downsamples still answers one step for a short input."""
        return max(1, math.floor(source_length * self.ratio + 1e-9))


@dataclass(frozen=True)
class Padding:
    """Which input axes may pad (`axes`), and how each output is cut back (`cuts`)."""

    axes: Mapping[str, int]
    cuts: tuple[Cut, ...]
    why_not: str = ""  # why padding is off although inputs declare pad axes

    @classmethod
    def of(cls, signature: Signature) -> Padding:
        axes = {s.name: s.pad_axis for s in signature.inputs if s.pad_axis is not None}
        if not axes or not signature.batched:
            return cls({}, ())
        cuts = tuple(
            Cut(spec.name, spec.pad_axis, spec.follows, axes[spec.follows], spec.ratio)
            for spec in signature.outputs
            if spec.pad_axis is not None and spec.follows in axes
        )
        declared = {(cut.output, cut.axis) for cut in cuts}
        uncut = [
            f"`{spec.name}` (no declared shape)" for spec in signature.outputs if not spec.ranked
        ]
        uncut += [
            f"`{spec.name}` axis {axis}"
            for spec in signature.outputs
            for axis, dim in enumerate(spec.dims)
            if spec.ranked and axis and dim == -1 and (spec.name, axis) not in declared
        ]
        if uncut:
            return cls({}, (), f"outputs {', '.join(uncut)} vary in length but follow no input")
        return cls(axes, cuts)

    def cut_all(
        self, parts: list[TensorDict], inputs: list[TensorDict], padded: Mapping[str, int]
    ) -> list[TensorDict]:
        """Each request's outputs cut back to its own lengths, once the batch's outputs are
        checked against the declared ratio; a batch that was not padded is left as it is.
        `padded`: the lengths the batch ran at (its widest request's, or its bucket's)."""
        if not self.cuts:
            return parts
        lengths = [self.lengths(one) for one in inputs]
        if all(own == padded for own in lengths):
            return parts
        self.check(parts, padded)
        return [self.cut(part, own) for part, own in zip(parts, lengths, strict=True)]

    def lengths(self, inputs: TensorDict) -> dict[str, int]:
        """A request's own length along each pad axis."""
        return {name: inputs[name].shape[axis] for name, axis in self.axes.items()}

    def check(self, parts: list[TensorDict], padded: Mapping[str, int]) -> None:
        """Refuse a batch whose outputs do not have the declared length (a wrong `ratio`)."""
        for cut in self.cuts:
            want, got = cut.length(padded[cut.source]), parts[0][cut.output].shape[cut.axis]
            if got != want:
                raise BackendError(
                    f"output `{cut.output}` axis {cut.axis} has {got} entries for input "
                    f"`{cut.source}` of length {padded[cut.source]}, but the manifest's "
                    f"ratio {cut.ratio:g} says {want}. Hint: fix [model.outputs.{cut.output}] ratio"
                )

    def cut(self, outputs: TensorDict, lengths: Mapping[str, int]) -> TensorDict:
        """One request's outputs cut back to its own lengths (views)."""
        if not self.cuts:
            return outputs
        cut_outputs = dict(outputs)
        for cut in self.cuts:
            index = [slice(None)] * cut.axis + [slice(0, cut.length(lengths[cut.source]))]
            cut_outputs[cut.output] = cut_outputs[cut.output][tuple(index)]
        return cut_outputs
