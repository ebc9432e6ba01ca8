"""The shapes every part of edgeserve agrees on, named once."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import numpy as np

if TYPE_CHECKING:
    from edgeserve.shapes import ShapeProfile

TensorDict = dict[str, np.ndarray]
"""Tensors by name; the first axis is the batch axis wherever batching applies."""


@dataclass(frozen=True)
class TensorSpec:
    """One model input or output: its name, KServe v2 datatype and dims (-1 where dynamic)."""

    name: str
    datatype: str
    dims: tuple[int, ...]
    pad_axis: int | None = None
    pad_value: float = 0.0
    follows: str | None = None  # outputs: the input whose pad axis `pad_axis` follows...
    ratio: float = 1.0  # ...with floor(its length x ratio) entries (batching/padding.py)
    index_range: tuple[int, int] | None = None  # inputs: the values a lookup table allows
    min_dims: tuple[int, ...] | None = None  # inputs: the smallest size per axis (-1: any)
    max_dims: tuple[int, ...] | None = None  # inputs: the largest size per axis (-1: any)
    labels: tuple[str, ...] = ()  # outputs: class labels by index (the classification extension)
    ranked: bool = True  # False where the model declares no shape, not even a rank (a Loop's
    # or a custom op's output; an input of any rank and dims): dims all -1, shown as Triton would
    optional: bool = False  # inputs: the model holds a default (an initializer of that name,
    # as older exporters and keep_initializers_as_inputs write): a request may leave it out
    index_table: str | None = None  # inputs: the table `index_range` comes from (lookups.py;
    # a request that sends it, an optional input, replaces it: no range holds then)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.dims)}

    @property
    def shown(self) -> str:
        """Its dims as messages give them: `[-1, 4]`, or `any shape` where none is declared."""
        return str(list(self.dims)) if self.ranked else "any shape"

    def fits(self, shape: tuple[int, ...]) -> bool:
        """Whether a tensor of `shape` has the dims (-1: any size; none declared: any shape)."""
        return not self.ranked or (
            len(shape) == len(self.dims)
            and all(dim in (-1, size) for dim, size in zip(self.dims, shape, strict=True))
        )


@dataclass(frozen=True)
class TiedDim:
    """A dim the model names on several input axes (ONNX `dim_param`): one size, whatever it is
    (`input_ids` and `attention_mask` both [batch, seq])."""

    name: str
    axes: tuple[tuple[str, int], ...]  # (input, axis), in the model's order

    @property
    def spans_first_axis(self) -> bool:
        """Whether it sizes a first axis and a later one ([N, N]; [N, L] with [L, N]): a batch
        stacks requests along first axes, which would break it (every batch of two failed in
        the model, a 422), so such a model runs each request alone."""
        return any(axis == 0 for _, axis in self.axes) and any(axis > 0 for _, axis in self.axes)


@dataclass(frozen=True)
class SummedDim:
    """An input axis the model names as a sum (ONNX `dim_param` "past_sequence_length +
    sequence_length", as optimum exports a decoder's attention_mask): its size is that of the
    input axes its terms name, added up, plus `constant` ("past_sequence_length + 1")."""

    name: str
    place: tuple[str, int]  # (input, axis)
    terms: tuple[tuple[str, int], ...]  # (input, axis) where each term names a dim first
    constant: int = 0


@dataclass(frozen=True)
class Signature:
    """A model's inputs and outputs, whether its first axis is a batch axis, and the dims its
    inputs share (the batch axis aside) or add up."""

    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    batched: bool
    tied: tuple[TiedDim, ...] = ()
    summed: tuple[SummedDim, ...] = ()

    def input(self, name: str) -> TensorSpec | None:
        return next((spec for spec in self.inputs if spec.name == name), None)

    @functools.cached_property
    def required(self) -> tuple[TensorSpec, ...]:
        """The inputs every request sends (not optional): what example inputs are made of."""
        return tuple(spec for spec in self.inputs if not spec.optional)

    @functools.cached_property
    def whole(self) -> frozenset[str]:
        """Optional inputs of a batching model without its batch axis (a weight, a setting of
        fixed dims): a request sending one runs in a batch of its own, the tensor whole."""
        if not self.batched:
            return frozenset()
        return frozenset(s.name for s in self.inputs if s.optional and s.dims[:1] != (-1,))

    @functools.cached_property
    def bf16_inputs(self) -> frozenset[str]:
        """Inputs of BF16, whose arrays hold raw bits in uint16, as UINT16's hold numbers."""
        return frozenset(spec.name for spec in self.inputs if spec.datatype == "BF16")

    def fixed_first_dims(self) -> tuple[TensorSpec, ...]:
        """The tensors whose first dim is not dynamic, or not known to be (a required input of
        no declared shape): any one keeps the model from batching (optional inputs aside: one
        without the batch axis is sent whole, see `whole`)."""
        unranked = tuple(spec for spec in self.required if not spec.ranked)
        return unranked + tuple(
            spec
            for spec in self.required + self.outputs
            if spec.dims[:1] != (-1,) or spec.name in self.tied_first
        )

    @functools.cached_property
    def may_be_empty(self) -> frozenset[tuple[str, int]]:
        """Input axes a sum's terms name (`SummedDim`), where the model names them alike too:
        an optimum decoder's first step sends its past_key_values with a past of 0 tokens,
        which the shape profile (from 1) refused with a 400 on every backend."""
        terms = {place for summed in self.summed for place in summed.terms}
        tied = (tie.axes for tie in self.tied if terms.intersection(tie.axes))
        return frozenset(terms.union(*tied))

    @functools.cached_property
    def tied_first(self) -> dict[str, str]:
        """Inputs whose first dim is named on a later axis too (`x` [N, N]), with that name:
        they have no batch axis (ties hold first axes only where the model does not batch)."""
        return {
            name: tie.name
            for tie in self.tied
            if tie.spans_first_axis
            for name, axis in tie.axes
            if axis == 0
        }


class ComputeTimes(NamedTuple):
    """One model execution in Triton's three phases (ns): gathering the batch's inputs,
    running the model, handing each request its outputs."""

    input_ns: int
    infer_ns: int
    output_ns: int


@dataclass
class Context:
    """What a handler sees of its request: `state` carries data from preprocess to postprocess."""

    content_type: str
    options: Mapping[str, Any]
    root: Path
    state: dict[str, Any] = field(default_factory=dict)


class Backend(Protocol):
    """An inference engine holding one loaded model: runs one batch at a time per call.

    It trusts its inputs: the data plane checked them against `profile` (the shapes it was
    loaded for, each input's min and max per axis; None: any the signature allows). `buckets`:
    batch sizes it keeps state for (ONNX Runtime's CUDA sessions), warmed at start besides the
    preferred sizes; empty for most."""

    name: str
    buckets: tuple[int, ...]

    @property
    def profile(self) -> ShapeProfile | None: ...

    def infer(self, inputs: TensorDict) -> TensorDict: ...

    def close(self) -> None: ...
