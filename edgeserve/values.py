"""Tensor data that arrives as nested lists (v2 JSON, `/invoke` JSON or msgpack) made a typed array.

Every protocol refuses the same values, the way KServe v2 and Triton do: a number tensor takes
numbers only (no null, no strings, no booleans), an integer tensor takes integers only (never a
fraction silently truncated) that fit its datatype, a BOOL tensor takes booleans only, a BYTES
tensor strings (or msgpack bytes). Nesting is walked without recursion and may go no deeper
than the tensor has dims, so a body nested a thousand deep is an error message, not a crash.
NaN and infinity are floats like any other (binary tensors carry them too): read from JSON as
the tokens `NaN`, `Infinity` and `-Infinity` (`from_json`), and written so (`to_json`).
"""

from __future__ import annotations

import itertools
import json
import math
import re
from collections.abc import Callable
from typing import Any

import msgpack
import numpy as np
import orjson

from edgeserve.datatypes import DATATYPES, Datatype, bf16_from_values
from edgeserve.errors import InvalidInput, echo_json, echo_json_text, echo_repr
from edgeserve.jsonkeys import check_keys, count_keys
from edgeserve.types import TensorSpec

MAX_ELEMENTS = 2**48
"""The most elements a client's shape may describe, zero dims aside (numpy refuses shapes whose
product overflows its index type even when a zero dim makes the tensor empty)."""

MAX_RANK = 32
"""The most dims a client's shape may have (numpy's own limit is 32 or 64 by version)."""

_NON_FINITE = re.compile(rb"NaN|Infinity")
_BOM = b"\xef\xbb\xbf"
_ACCEPTED: dict[str, tuple[frozenset[type], str]] = {
    "b": (frozenset({bool}), "booleans"),
    "i": (frozenset({int}), "integers"),
    "u": (frozenset({int}), "integers"),
    "f": (frozenset({int, float}), "numbers"),
    "O": (frozenset({str, bytes}), "strings"),
}
_FOUND = {
    type(None): "null",
    bool: "booleans",
    int: "integers",
    float: "fractions",
    str: "strings",
    bytes: "bytes",
    dict: "objects",
    list: "lists where values belong (the nesting is ragged)",
    msgpack.Timestamp: "msgpack timestamps",
    np.ndarray: "numpy arrays (msgpack ext 1) where values belong",
}
_SHOWN_EXTS = 4


def from_json(data: bytes, where: str, *, unique: bool = False) -> Any:
    """A JSON document, or a 400 saying why not; JSON is UTF-8 text (RFC 8259), and a body that
    is not is more likely another encoding, or msgpack sent as JSON, than a typo. `NaN`,
    `Infinity` and `-Infinity` are read as Triton reads them (and as Python's json writes them),
    though JSON has no such numbers: orjson refuses them, Python's json takes them. A leading
    UTF-8 byte order mark (Windows tools write one) is ignored, as RFC 8259 allows. `unique`:
    an object that gives a key twice is refused too (`check_keys`)."""
    value = _loads(data, where)
    if unique:
        check_keys(data, count_keys(value), where, value)
    return value


def _loads(data: bytes, where: str) -> Any:
    if data[:3] == _BOM:
        data = data[3:]
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        if _NON_FINITE.search(bytes(data)):
            return _with_non_finite(bytes(data), where)
        if "UTF-8" in str(exc):
            raise _not_utf8(where, bytes(data)) from None
        raise InvalidInput(f"{where}: not valid JSON: {exc}") from None


def _with_non_finite(data: bytes, where: str) -> Any:
    """A document orjson refused that holds `NaN` or `Infinity`, read by Python's json, whose
    error points at what is wrong (orjson's pointed at the first NaN, which is not: "line 1
    column 7" for any other mistake after it)."""
    try:
        value = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise _not_utf8(where, data) from None
    except json.JSONDecodeError as exc:
        raise InvalidInput(f"{where}: not valid JSON: {exc}") from None
    except ValueError:  # Python's int() of over 4300 digits
        raise InvalidInput(f"{where}: not valid JSON: an integer of over 4300 digits") from None
    except RecursionError:
        raise InvalidInput(f"{where}: not valid JSON: nested too deep to read") from None
    return _as_orjson_reads(value, where)


def _not_utf8(where: str, data: bytes) -> InvalidInput:
    """The refusal of a body that is not UTF-8, at its first byte that is not (it named none,
    and a stray byte deep in a large body is hard to find)."""
    try:
        data.decode("utf-8")
        at = ""
    except UnicodeDecodeError as exc:
        at = f": byte {exc.start} ({data[exc.start]:#04x}): {exc.reason}"
    return InvalidInput(
        f"{where}: not UTF-8 text, so not JSON{at} (another encoding, or msgpack sent with "
        "Content-Type application/json?)"
    )


def _as_orjson_reads(value: Any, where: str) -> Any:
    """A document Python's json read (it holds a non-finite number), refused where orjson
    would refuse it: Python's json also takes lone surrogates in strings and integers of any
    size, which broke what came after (encoding a BYTES item, a float of a timeout)."""
    try:
        orjson.dumps(value)
    except orjson.JSONEncodeError as exc:
        raise InvalidInput(f"{where}: not valid JSON: {exc}") from None
    return value


def to_json(value: Any, default: Callable[[Any], Any] | None = None) -> bytes:
    """`value` as JSON text, numpy arrays and scalars included, as orjson writes it (`default`:
    orjson's hook for what it cannot write), except floats that are not finite: written as
    Triton and Python's json write them, `NaN`, `Infinity` and `-Infinity` (what `from_json`,
    tritonclient and Python's json read back), where orjson writes null, which reads back as
    nothing, or as NaN for an infinity too."""
    encoded = orjson.dumps(value, default=default, option=orjson.OPT_SERIALIZE_NUMPY)
    if b"null" not in encoded:  # the common answer: nothing non-finite (orjson writes null)
        return encoded
    marked = _non_finite_marked(value)
    if marked is value:
        return encoded
    return orjson.dumps(marked, default=default, option=orjson.OPT_SERIALIZE_NUMPY)


def _non_finite_marked(value: Any) -> Any:
    """`value` with each float that is not finite, and each float array holding one, made an
    orjson.Fragment of its JSON text; `value` itself (no copy) when it holds none. Nesting is
    as deep as orjson wrote it (at most 255)."""
    if isinstance(value, float | np.floating):
        return value if math.isfinite(value) else orjson.Fragment(_token(float(value)))
    if isinstance(value, np.ndarray):
        if value.dtype.kind == "f" and not np.isfinite(value).all():
            return orjson.Fragment(_float_array_json(value))
        if value.dtype.kind == "O":  # written through `default` as lists: look inside
            as_lists = value.tolist()
            marked = _non_finite_marked(as_lists)
            return value if marked is as_lists else marked
        return value
    if isinstance(value, dict):
        items = {key: _non_finite_marked(item) for key, item in value.items()}
        return items if any(items[key] is not item for key, item in value.items()) else value
    if isinstance(value, list | tuple):
        marked_items = [_non_finite_marked(item) for item in value]
        changed = any(new is not old for new, old in zip(marked_items, value, strict=True))
        return marked_items if changed else value
    return value


_ORJSON_FLOATS = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))


def _token(value: float) -> bytes:
    """JSON text for a float that is not finite."""
    return b"NaN" if math.isnan(value) else (b"Infinity" if value > 0 else b"-Infinity")


def _float_array_json(array: np.ndarray) -> bytes:
    """A float array's JSON text as orjson writes it (float32 in its own shortest form, not as
    the float64 it widens to), each non-finite value's `null` made its token."""
    if array.dtype not in _ORJSON_FLOATS:  # orjson writes no other float arrays
        array = array.astype(np.float64)
    if array.ndim == 0:
        return _token(float(array))
    pieces = orjson.dumps(np.ascontiguousarray(array), option=orjson.OPT_SERIALIZE_NUMPY)
    parts = pieces.split(b"null")
    tokens = [_token(item) for item in array[~np.isfinite(array)].tolist()]
    joined = [parts[0]]
    for token, part in zip(tokens, parts[1:], strict=True):
        joined += [token, part]
    return b"".join(joined)


def to_array(data: Any, datatype: Datatype, where: str, max_depth: int) -> np.ndarray:
    """`data` (a value or nested lists of them, at most `max_depth` deep) as a `datatype` array
    shaped by its nesting; InvalidInput, prefixed with `where`, names what does not fit."""
    if datatype.name == "BF16":
        raise InvalidInput(f"{where}: BF16 travels only as binary data (binary_data_size)")
    flat, dims = _flatten(data, max_depth, where)
    accepted, wanted = _ACCEPTED[datatype.numpy.kind]
    found = set(map(type, flat))
    if float in found and datatype.numpy.kind in "iu":
        _check_integral_range(flat, datatype, where)
    if not found <= accepted:
        raise InvalidInput(f"{where}: expected {wanted}, found {_found(found - accepted, flat)}")
    if datatype.name == "BYTES":
        array = np.empty(len(flat), dtype=object)
        array[:] = [item.encode("utf-8") if isinstance(item, str) else item for item in flat]
        return array.reshape(dims)
    return _numbers(flat, datatype, where).reshape(dims)


def _found(kinds: set[type], flat: list[Any]) -> str:
    """The kinds of value a tensor cannot take, in JSON's or msgpack's words: an ext by its
    type code, which says what the client packed (a few codes, when many were sent)."""
    names = sorted(_FOUND.get(kind, kind.__name__) for kind in kinds - {msgpack.ExtType})
    if msgpack.ExtType in kinds:
        codes = sorted({item.code for item in flat if isinstance(item, msgpack.ExtType)})
        shown = ", ".join(map(str, codes[:_SHOWN_EXTS])) + (", …" if codes[_SHOWN_EXTS:] else "")
        names.append(f"msgpack exts of type {shown}")
    return ", ".join(names)


def spec_array(spec: TensorSpec, value: Any) -> np.ndarray:
    """An `/invoke` value: a numpy array (msgpack ext) as sent, nested lists typed as the spec's
    (BF16: numbers, made the nearest bf16's raw bits)."""
    if isinstance(value, np.ndarray):
        return value
    where = f"tensor `{spec.name}`: {spec.datatype} {spec.shown}"
    depth = len(spec.dims) if spec.ranked else MAX_RANK  # no declared shape: any rank
    if spec.datatype == "BF16":  # numbers, as /invoke answers them, rounded to bf16's bits
        numbers = to_array(value, DATATYPES["FP32"], where, max_depth=depth)
        return bf16_from_values(numbers)
    return to_array(value, DATATYPES[spec.datatype], where, max_depth=depth)


def to_shape(value: Any, where: str) -> tuple[int, ...]:
    """A shape a client sent (v2 `shape`, a msgpack array's dims): non-negative ints whose
    product a tensor can hold; InvalidInput, prefixed with `where`, otherwise."""
    if not isinstance(value, list) or not _counts(value):
        value = _past_64_bits(value)  # a JSON parser reads such an integer as a float
        if not isinstance(value, list) or not _counts(value):
            found = echo_json_text(value) if isinstance(value, list) else echo_json(value)
            raise InvalidInput(f"{where}: `shape` must be a list of non-negative ints, got {found}")
    if len(value) > MAX_RANK:
        raise InvalidInput(f"{where}: `shape` has {len(value)} dims; expected at most {MAX_RANK}")
    if math.prod(filter(None, value)) > MAX_ELEMENTS:  # zero dims aside
        raise InvalidInput(
            f"{where}: shape {echo_repr(value)} describes more elements than a tensor can hold "
            f"(its non-zero dims multiply past 2**48)"
        )
    return tuple(value)


def _past_64_bits(value: Any) -> Any:
    """A shape with its dims too large for 64 bits, which JSON parsers read as floats
    (2**64 as 1.8446744073709552e+19), written as the integers they were; else as it is."""
    if not isinstance(value, list):
        return value
    whole = [v for v in value if isinstance(v, float) and v.is_integer() and abs(v) >= 2**63]
    return [int(v) if v in whole else v for v in value] if whole else value


def read_bools(data: bytes | memoryview) -> np.ndarray:
    """BOOL data that arrives as bytes (binary tensors, shared memory, msgpack arrays) as a bool
    array, any byte but 0 read as true, as C++ and Triton's backends read a bool: numpy views a
    byte of 2 as a bool that prints True but sums as 2, and perf_analyzer's random data (its
    default) fills BOOL tensors with random bytes. Zero-copy when every byte is 0 or 1 (one
    pass: numpy's max); else one copy, made of 0s and 1s."""
    raw = np.frombuffer(data, np.uint8)
    if raw.size and raw.max() > 1:
        return raw != 0
    return raw.view(np.bool_)


def is_count(value: Any) -> bool:
    """A non-negative JSON integer (a bool is not one)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _counts(values: list[Any]) -> bool:
    """Whether every value is a count; plain ints are checked without a Python call each (a
    shape is read for every tensor of every request)."""
    if set(map(type, values)) <= _INT:
        return not values or min(values) >= 0
    return all(map(is_count, values))


_INT = {int}


def _flatten(data: Any, max_depth: int, where: str) -> tuple[list[Any], tuple[int, ...]]:
    """The leaves in row-major order and the dims of a rectangular nesting, level by level (a
    rank-0 tensor's one value may come in a list of one, as v2 sends it)."""
    if not isinstance(data, list):
        return [data], ()
    flat, dims = data, [len(data)]
    while flat and isinstance(flat[0], list):
        if len(dims) >= max(max_depth, 1):
            raise InvalidInput(f"{where}: `data` is nested deeper than {_deepest(max_depth)}")
        width = len(flat[0])
        if any(not isinstance(row, list) or len(row) != width for row in flat):
            raise InvalidInput(
                f"{where}: `data` is ragged: lists at depth {len(dims)} differ in length "
                "or mix lists with values"
            )
        flat = list(itertools.chain.from_iterable(flat))
        dims.append(width)
    return flat, tuple(dims)


def _deepest(max_depth: int) -> str:
    """How deep a tensor's data may nest, in words: those of its rank, or of the limit on
    ranks where it has none declared (a count of dims it does not have misled)."""
    if max_depth == 0:
        return "a rank-0 tensor's data (one value, or a list of one)"
    if max_depth >= MAX_RANK:
        return f"{MAX_RANK} lists, the most dims a tensor may have"
    return f"the tensor's {max_depth} dims"


def _check_integral_range(flat: list[Any], datatype: Datatype, where: str) -> None:
    """A whole number too large for int64 arrives from a JSON parser as a float: it is out of
    range, not a fraction."""
    info = np.iinfo(datatype.numpy)
    for item in flat:
        if isinstance(item, float) and item.is_integer() and not info.min <= item <= info.max:
            raise InvalidInput(
                f"{where}: a value ({item:.0f}) is out of the range of {datatype.name} "
                f"({info.min} .. {info.max})"
            )


def _numbers(flat: list[Any], datatype: Datatype, where: str) -> np.ndarray:
    """Integers out of the datatype's range and floats that overflow it are refused."""
    try:
        with np.errstate(over="raise"):
            if datatype.numpy.kind == "f":
                return np.array(flat, dtype=np.float64).astype(datatype.numpy)
            return np.array(flat, dtype=datatype.numpy)
    except (OverflowError, FloatingPointError):
        info = np.iinfo(datatype.numpy) if datatype.numpy.kind in "iu" else np.finfo(datatype.numpy)
        raise InvalidInput(
            f"{where}: a value is out of the range of {datatype.name} ({info.min} .. {info.max})"
        ) from None
