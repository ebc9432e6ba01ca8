"""The checks at the door: a request's tensors held, once, to the model and its shape profile.

Every front's request passes here before it reaches the batcher: the names, each tensor's
datatype and dims against the signature, the rows on the batch axis, and every other axis
within what the backend was loaded for (`Backend.profile`: min and max per axis). A request
that can never run is refused alone, with a 400 naming the tensor, the axis and the allowed
range. What passes cannot fail the batch it joins (a batch pads only up to its largest member,
which is within the profile), so the batcher and the backends trust their inputs.
"""

from __future__ import annotations

import difflib
import heapq
import operator
import sys
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from edgeserve import datatypes
from edgeserve.backends import BY_NAME
from edgeserve.errors import InvalidInput, echo, echo_json
from edgeserve.shapes import UNBOUNDED, ShapeProfile, ShapeRange
from edgeserve.types import Signature, SummedDim, TensorDict, TensorSpec, TiedDim


class InputChecks:
    """The door of one loaded model. `batching`: the first axis holds rows the batcher may
    split and stack (its range is the batcher's business: a large request is split)."""

    def __init__(
        self,
        signature: Signature,
        profile: ShapeProfile | None,
        batching: bool,
        int_range: tuple[str, tuple[int, int] | None] = ("", None),
        optional: bool = True,
    ) -> None:
        """`int_range`: the backend's name and the INT64 / UINT64 values it computes exactly
        (OpenVINO: int32's; None: all); `optional`: whether that backend takes the optional
        inputs a request sends (TensorRT holds them at the model's defaults)."""
        self.signature = signature
        self.batching = batching and signature.batched
        self.profile = profile or {}
        # what every request is held to, worked out once (this runs for every request)
        self._names = frozenset(spec.name for spec in signature.inputs)
        self._indexed = [spec for spec in signature.inputs if spec.index_range is not None]
        self._backend, self._int_range = int_range
        self._wide = [s.name for s in signature.inputs if s.datatype in ("INT64", "UINT64")]
        self._ranged = [
            (spec.name, self.profile[spec.name])
            for spec in signature.inputs
            if spec.name in self.profile
        ]
        self._whole = signature.whole
        self._fixed = (
            frozenset() if optional else frozenset(s.name for s in signature.inputs if s.optional)
        )
        self._fits = [
            _Fits.of(spec, self.profile.get(spec.name), self._first(spec.name))
            for spec in signature.inputs
        ]
        # most requests send the required inputs alone: only those are looked at then (an
        # older export may list hundreds of weights as optional inputs)
        self._required = frozenset(spec.name for spec in signature.required)
        self._required_fits = [fits for fits in self._fits if fits.name in self._required]

    @classmethod
    def for_backend(
        cls, signature: Signature, profile: ShapeProfile | None, batching: bool, backend: str
    ) -> InputChecks:
        """The door of a model loaded on `backend` (its name; "?": not known yet), holding
        inputs to what that backend computes exactly and takes."""
        table = BY_NAME.get(backend)
        int_range = (backend, table.int_range if table else None)
        optional = table.optional_inputs if table else True
        return cls(signature, profile, batching, int_range, optional)

    def _first(self, name: str) -> int:
        """The first axis the shape profile bounds: 1 past a batch axis, else 0."""
        return 1 if self.batching and name not in self._whole else 0

    def __call__(self, inputs: TensorDict) -> TensorDict:
        """The inputs, in the model's order, BYTES as object arrays; InvalidInput if they do
        not fit. An optional input left out stays out (the model's default holds)."""
        names = inputs.keys()
        if names != self._names and not self._required <= names <= self._names:
            check_names(self.signature, inputs)  # refuses, saying which are missing or unknown
        if self._fixed:
            self._check_sendable(inputs)
        checked = {}
        for fits in self._required_fits if len(names) == len(self._required) else self._fits:
            array = inputs.get(fits.name)
            if array is None:  # an optional input not sent
                continue
            if not fits(array):  # something to convert, or to refuse: the checks one by one
                return self._checked_one_by_one(inputs)
            checked[fits.name] = array
        self._check_values(checked)
        self._check_rows(checked)
        self._check_named_dims(checked)
        return checked

    def _check_named_dims(self, inputs: TensorDict) -> None:
        for tie in self.signature.tied:
            _check_tied(tie, inputs)
        for summed in self.signature.summed:
            _check_summed(summed, inputs)

    def _check_sendable(self, inputs: TensorDict) -> None:
        sent = sorted(self._fixed.intersection(inputs))
        if sent:
            raise InvalidInput(
                f"input `{sent[0]}` is optional, and the {self._backend} backend serving this "
                "model holds it at the model's default: it cannot be sent. Hint: leave it out, "
                'or serve the function with ONNX Runtime ([backend] prefer = ["onnxruntime"])'
            )

    def _check_values(self, inputs: TensorDict) -> None:
        for spec in self._indexed:
            if spec.name in inputs and spec.index_table not in inputs:
                _check_indices(spec, inputs[spec.name])
        if self._int_range is not None:
            for name in self._wide:
                if name in inputs:
                    self._check_int_range(name, inputs[name], *self._int_range)

    def _check_int_range(self, name: str, array: np.ndarray, low: int, high: int) -> None:
        """64-bit integers the backend would compute in 32 bits, answering wrong values."""
        if array.size == 0:
            return
        bad = [v for v in (int(array.min()), int(array.max())) if not low <= v <= high]
        if bad:
            raise InvalidInput(
                f"tensor `{name}`: value {bad[0]} is out of range: the {self._backend} backend "
                f"serving this model computes {array.dtype.name} in 32 bits, expected "
                f"{max(low, 0) if array.dtype.kind == 'u' else low}..{high}. "
                'Hint: serve it with ONNX Runtime ([backend] prefer = ["onnxruntime"])'
            )

    def _checked_one_by_one(self, inputs: TensorDict) -> TensorDict:
        checked = {
            spec.name: _checked(spec, inputs[spec.name])
            for spec in self.signature.inputs
            if spec.name in inputs
        }
        self._check_values(checked)
        self._check_rows(checked)
        self._check_named_dims(checked)
        for name, allowed in self._ranged:
            self._check_range(name, checked[name].shape, allowed)
        return checked

    def _check_rows(self, inputs: TensorDict) -> None:
        if not self.signature.batched:
            return
        rows = {n: array.shape[0] for n, array in inputs.items() if n not in self._whole}
        counts = list(rows.values())
        if counts and (min(counts) != max(counts) or (self.batching and not counts[0])):
            least = ", at least 1" if self.batching else ""
            raise InvalidInput(
                f"{_row_counts(rows)}: every input must have the same number of rows (axis 0, "
                f"the batch axis){least}"
            )

    def _check_range(self, name: str, shape: tuple[int, ...], allowed: ShapeRange) -> None:
        first = self._first(name)
        for axis in range(first, len(shape)):
            low, high = allowed.min[axis], allowed.max[axis]
            if shape[axis] < low or (high != UNBOUNDED and shape[axis] > high):
                top = "any" if high == UNBOUNDED else str(high)
                empty = shape[axis] == 0
                raise InvalidInput(
                    f"tensor `{name}`: shape {list(shape)} is outside the range this model was "
                    f"loaded for: axis {axis} is {shape[axis]}, allowed {low}..{top} "
                    f"(shapes {list(allowed.min)} .. {list(allowed.max)})"
                    + (f". {EMPTY_AXIS_HINT.format(name=name, axis=axis)}" if empty else "")
                )


EMPTY_AXIS_HINT = (
    "Hint: to serve an empty axis, set `min_dims` of input `{name}` in the manifest ([model."
    "inputs]): 0 on axis {axis}, -1 on the others"
)


@dataclass(frozen=True)
class _Fits:
    """One input's datatype and its size bounds per axis, from its dims and its profile range
    (axes from `first`): a tensor within them passes every check but the index and row ones,
    with no Python loop over its axes."""

    name: str
    dtype: np.dtype
    ndim: int  # -1: no tensor passes here (a profile of another rank: checked one by one)
    low: tuple[int, ...]
    high: tuple[int, ...]

    @classmethod
    def of(cls, spec: TensorSpec, allowed: ShapeRange | None, first: int) -> _Fits:
        dtype = datatypes.DATATYPES[spec.datatype].numpy
        if not spec.ranked:  # no declared shape: any rank, any dims
            return _AnyShape(spec.name, dtype, 0, (), ())
        ndim = len(spec.dims)
        low = [0 if dim == -1 else dim for dim in spec.dims]
        high = [sys.maxsize if dim == -1 else dim for dim in spec.dims]
        if allowed is not None and (len(allowed.min), len(allowed.max)) != (ndim, ndim):
            ndim = -1
        elif allowed is not None:
            for axis in range(first, ndim):
                low[axis] = max(low[axis], allowed.min[axis])
                if allowed.max[axis] != UNBOUNDED:
                    high[axis] = min(high[axis], allowed.max[axis])
        return cls(spec.name, dtype, ndim, tuple(low), tuple(high))

    def __call__(self, array: np.ndarray) -> bool:
        shape = array.shape
        return (
            array.dtype == self.dtype
            and len(shape) == self.ndim
            and all(map(operator.le, self.low, shape))
            and all(map(operator.le, shape, self.high))
        )


class _AnyShape(_Fits):
    """An input of no declared shape: its datatype is all there is to check."""

    def __call__(self, array: np.ndarray) -> bool:
        return array.dtype == self.dtype


def _row_counts(rows: dict[str, int]) -> str:
    """Inputs and their rows in words, inputs of the same count together: "inputs `ids`
    (1 row) and `mask`, `types` (2 rows)"."""
    names: dict[int, list[str]] = {}
    for name, count in rows.items():
        names.setdefault(count, []).append(f"`{name}`")
    groups = [
        f"{', '.join(n)} ({count} row{'' if count == 1 else 's'})" for count, n in names.items()
    ]
    listed = groups[0] if len(groups) == 1 else f"{', '.join(groups[:-1])} and {groups[-1]}"
    return f"input{'' if len(rows) == 1 else 's'} {listed}"


def _check_tied(tie: TiedDim, inputs: TensorDict) -> None:
    sizes = {(name, axis): inputs[name].shape[axis] for name, axis in tie.axes if name in inputs}
    if len(set(sizes.values())) > 1:
        found = ", ".join(f"`{name}` axis {axis}: {size}" for (name, axis), size in sizes.items())
        raise InvalidInput(
            f"inputs {found}: the model names these axes `{tie.name}`, one size: expected "
            "the same size on each"
        )


def _check_summed(summed: SummedDim, inputs: TensorDict) -> None:
    """A decoder's attention_mask as long as its past and new tokens together: otherwise the
    model failed with a 422 in its kernels' words ("Attempting to broadcast an axis by a
    dimension other than 1. 32 by 64")."""
    (name, axis), places = summed.place, (*summed.terms, summed.place)
    if not all(place in inputs for place, _ in places):
        return
    sizes = [inputs[term].shape[at] for term, at in summed.terms]
    expected, size = summed.constant + sum(sizes), inputs[name].shape[axis]
    if size != expected:
        added = [f"`{t}` axis {at} ({n})" for (t, at), n in zip(summed.terms, sizes, strict=True)]
        added += [str(summed.constant)] if summed.constant else []
        raise InvalidInput(
            f"input `{name}` axis {axis}: {size}: the model names it `{summed.name}`: expected "
            f"{expected}, {' + '.join(added)}"
        )


def check_names(signature: Signature, names: Iterable[object]) -> None:
    """Refuse a set of input names other than the model's: each required one, and optional ones
    if sent (names may be anything a client sent)."""
    required = {spec.name for spec in signature.required}
    optional = {spec.name for spec in signature.inputs} - required
    given = set(names)
    unknown = [name for name in given - required - optional if isinstance(name, str)]
    not_text = [name for name in given if not isinstance(name, str)]
    missing = list(required - given)
    if unknown or missing or not_text:
        also = f" (optional: {_first(list(optional))})" if optional else ""
        raise InvalidInput(
            f"inputs: expected {sorted(required)}{also}"
            + (f"; unknown {_first(unknown)}" if unknown else "")
            + (f"; missing {_first(missing)}" if missing else "")
            + (f"; keys that are not strings: {_not_text(not_text)}" if not_text else "")
            + _meant(unknown, [*missing, *(optional - given)])
        )


def _meant(unknown: list[str], names: list[str], shown: int = 3) -> str:
    """`; did you mean `input_ids` for `input_id`?` for unknown names close to one the model
    has and the request lacks (the first `shown` unknown ones: a request may send thousands)."""
    near = [
        f"`{close[0]}` for `{echo(name)}`"
        for name in heapq.nsmallest(shown, unknown)
        if (close := difflib.get_close_matches(name, names, n=1, cutoff=0.6))
    ]
    return f"; did you mean {', '.join(near)}?" if near else ""


def _first(names: list[str], shown: int = 10) -> str:
    """The first `shown` names in order: a request may carry thousands, the error stays
    readable (and a million are not sorted whole on the event loop: 1 s)."""
    first = [echo(name) for name in heapq.nsmallest(shown, names)]
    if len(names) <= shown:
        return str(first)
    return f"{first} and {len(names) - shown} more"


def _not_text(names: list[object], shown: int = 3) -> str:
    """Names a msgpack map gave as bytes (bin), in words, the first `shown` of them: the
    client sent a name the model has, perhaps, in the wrong msgpack type."""
    words = ", ".join(echo_json(name) for name in names[:shown])
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return f"{words}{more}; expected names as strings (msgpack str, not bin)"


def check_declared(
    signature: Signature, name: str, datatype: datatypes.Datatype, shape: tuple[int, ...]
) -> None:
    """A tensor's datatype as a request declares it, checked before its data is read: the
    door refuses any but the model's anyway (`_checked`), but a client that declared INT32 for
    an FP32 input was told "expected integers, found fractions", and fixed its data."""
    spec = signature.input(name)
    if spec is not None and datatype.numpy != datatypes.DATATYPES[spec.datatype].numpy:
        raise _unfit(spec, shape, datatype.name)


def _checked(spec: TensorSpec, array: np.ndarray) -> np.ndarray:
    """The tensor if it fits its spec (BYTES given as str or bytes arrays become objects)."""
    datatype = datatypes.DATATYPES[spec.datatype]
    text = spec.datatype == "BYTES" and array.dtype.kind in "SU"
    fits_dtype = array.dtype == datatype.numpy or text
    if not (fits_dtype and spec.fits(array.shape)):
        raise _unfit(spec, array.shape, _datatype_name(array.dtype))
    return array.astype(object) if text else array


def _unfit(spec: TensorSpec, shape: tuple[int, ...], datatype: str) -> InvalidInput:
    return InvalidInput(
        f"tensor `{spec.name}`: expected {spec.shown} {spec.datatype}, "
        f"got {list(shape)} {datatype}{_batch_hint(spec, shape)}"
    )


def _batch_hint(spec: TensorSpec, shape: tuple[int, ...]) -> str:
    """A hint where the shape is right but for the batch axis, the mistake of one row sent
    as it is (an image [224, 224, 3] to a model of [-1, 224, 224, 3])."""
    one_row = (1, *shape)
    if spec.fits(shape) or not spec.fits(one_row):
        return ""
    return (
        f". Hint: the first dim is the batch axis, which this tensor lacks: one row is "
        f"{list(one_row)} (in /invoke JSON, one more level of brackets)"
    )


def _check_indices(spec: TensorSpec, array: np.ndarray) -> None:
    """Values of an index input (token ids) within the rows of the table the model looks up:
    one min and one max; a float id counts as the Cast to an integer makes it (truncated),
    and NaN, which min and max carry, as none."""
    if spec.index_range is None or array.size == 0:
        return
    low, high = spec.index_range
    smallest, largest = array.min(), array.max()
    if array.dtype.kind == "f":
        smallest, largest = np.trunc(smallest), np.trunc(largest)
    if not (low <= smallest and largest <= high):
        raise _past_the_table(spec, array, low, high)


def _past_the_table(spec: TensorSpec, array: np.ndarray, low: int, high: int) -> InvalidInput:
    """The first id outside low..high, where it is and which table it misses."""
    ids = np.trunc(array) if array.dtype.kind == "f" else array
    outside = ~((ids >= low) & (ids <= high))  # NaN compares false: outside
    at = [int(i) for i in np.unravel_index(int(np.argmax(outside)), array.shape)]
    table = f"`{spec.index_table}`, " if spec.index_table else ""  # older bundles: no name
    return InvalidInput(
        f"tensor `{spec.name}`: value {array[tuple(at)].item()} at {at} is out of range: the "
        f"model looks it up in {table}a table of {high + 1} rows, so expected {low}..{high}"
    )


def _datatype_name(dtype: np.dtype) -> str:
    try:
        return datatypes.from_numpy(dtype).name
    except ValueError:
        return str(dtype)
