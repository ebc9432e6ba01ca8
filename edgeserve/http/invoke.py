"""The `/invoke` codec: a request body becomes the handler's payload, its result a response body.

In: JSON (`application/json`, `*+json`), msgpack (`application/msgpack`, `application/x-msgpack`),
and raw bytes for everything else (images, `application/octet-stream`, unknown types); a form
upload stands for its one file (`forms.py`). In msgpack
a numpy array may travel as plain lists or as ext type `NDARRAY_EXT`: the packed triple
`[dtype.str, shape, raw bytes]` (see `pack_array`), in either byte order (read as the same values).
Map keys must be strings (msgpack's strict_map_key), as in JSON.
Out: msgpack when `Accept` asks for it (with a q of at least JSON's), else JSON; numpy arrays
and scalars become Python values (a rank-0 array a number, as in msgpack). Floats that are not
finite are JSON's `NaN`, `Infinity` and `-Infinity`, as v2 JSON writes them (`values.to_json`).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np

from edgeserve import datatypes, values
from edgeserve.errors import HandlerError, InvalidInput, echo, echo_json, echo_repr

NDARRAY_EXT = 1
MSGPACK_TYPES = ("application/msgpack", "application/x-msgpack")
JSON_TYPE = "application/json"


def media_type(header: str | None) -> str:
    """`type/subtype` of a Content-Type header, lower case, without parameters."""
    return (header or "").split(";", 1)[0].strip().lower()


def decode_payload(body: bytes, content_type: str) -> Any:
    """The handler's payload for a body of this media type."""
    if content_type == JSON_TYPE or content_type.endswith("+json"):
        return values.from_json(body, "request body", unique=True)
    if content_type in MSGPACK_TYPES:
        return _MsgpackBody().decode(body)
    return body


class _MsgpackBody:
    """One msgpack body's decoding. msgpack reads an array ext before the map it is a value
    of, so an ext that does not fit is held (`_Refused`) until that map is read, then refused
    naming its key: the input it was sent for, as the JSON and binary routes name it."""

    def __init__(self) -> None:
        self.refused: list[_Refused] = []

    def decode(self, body: bytes) -> Any:
        try:
            found = msgpack.unpackb(
                body, ext_hook=self._ext, raw=False, object_pairs_hook=self._map
            )
        except (ValueError, TypeError, msgpack.UnpackException) as exc:
            raise InvalidInput(f"request body: not valid msgpack: {_reason(exc)}") from None
        if self.refused:  # an array that is no map's value: the body itself, a list's item
            raise InvalidInput(f"request body: {self.refused[0].message}")
        return found

    def _ext(self, code: int, data: bytes) -> Any:
        try:
            return _unpack_ext(code, data)
        except InvalidInput as exc:
            self.refused.append(_Refused(exc.message))
            return self.refused[-1]

    def _map(self, pairs: list[tuple[Any, Any]]) -> dict[Any, Any]:
        if self.refused:  # most bodies: no ext refused, nothing to look for
            for key, value in pairs:
                if (held := _held(value)) is not None:
                    refused, at = held
                    item = f", item {at}" if at else ""
                    raise InvalidInput(f"tensor `{echo(str(key))}`{item}: {refused.message}")
        return _unique_keys(pairs)


def _held(value: Any) -> tuple[_Refused, str] | None:
    """The refused ext in `value` (itself, or in its nested lists) and its index there."""
    if isinstance(value, _Refused):
        return value, ""
    if isinstance(value, list):
        for index, item in enumerate(value):
            if (held := _held(item)) is not None:
                return held[0], f"[{index}]{held[1]}"
    return None


@dataclass(frozen=True)
class _Refused:
    """What was wrong with an array ext, said once its place is known."""

    message: str


def _unique_keys(pairs: list[tuple[Any, Any]]) -> dict[Any, Any]:
    """A msgpack map as a dict, refused where it gives a key twice: readers differ on which
    one counts, as for JSON (jsonkeys.py)."""
    found = dict(pairs)
    if len(found) < len(pairs):
        key, times = next((k, n) for k, n in Counter(k for k, _ in pairs).items() if n > 1)
        raise InvalidInput(
            f"request body: msgpack map key {echo_json(key)} is given {times} times; expected "
            "each key once in a map"
        )
    return found


def pack_array(array: np.ndarray) -> msgpack.ExtType:
    """A numpy array as the msgpack ext `/invoke` reads back (for clients)."""
    contiguous = np.ascontiguousarray(array)
    triple = msgpack.packb([contiguous.dtype.str, list(contiguous.shape), contiguous.tobytes()])
    return msgpack.ExtType(NDARRAY_EXT, triple)


def _unpack_ext(code: int, data: bytes) -> Any:
    """The numpy array of an NDARRAY_EXT (other ext types are the handler's), in native byte
    order; InvalidInput naming what does not fit (`_MsgpackBody` says where it was sent)."""
    if code < 0:  # -1 (a timestamp) msgpack reads itself; the rest it reserves, undefined
        raise InvalidInput(f"msgpack ext {code}: a type msgpack reserves; expected ext 0 to 127")
    if code != NDARRAY_EXT:
        return msgpack.ExtType(code, data)
    where = f"msgpack ext {NDARRAY_EXT} (a numpy array as [dtype, shape, bytes])"
    try:
        fields = msgpack.unpackb(data)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise InvalidInput(f"{where}: its data is not valid msgpack: {_reason(exc)}") from None
    if not (isinstance(fields, list) and len(fields) == 3):
        found = f"a list of {len(fields)}" if isinstance(fields, list) else echo_json(fields)
        raise InvalidInput(f"{where}: expected a list of 3 (dtype, shape, bytes), got {found}")
    name, shape, raw = fields
    if not isinstance(name, str):
        raise InvalidInput(
            f"{where}: dtype, its first item: expected a string such as '<f4', got "
            f"{echo_json(name)}"
        )
    if not isinstance(raw, bytes):
        raise InvalidInput(
            f"{where}: data, its third item: expected bytes (a msgpack bin), got {_kind(raw)}"
        )
    dims = values.to_shape(shape, where)
    dtype = _dtype(name, where)
    needed = math.prod(dims) * dtype.itemsize
    if len(raw) != needed:
        raise InvalidInput(
            f"{where}: {dtype.str} {list(dims)} needs {needed} bytes, its data has {len(raw)}"
        )
    if dtype.kind == "b":
        return values.read_bools(raw).reshape(dims)
    if dtype.kind == "U":
        _check_code_points(raw, dtype, where)
    array = np.frombuffer(raw, dtype=dtype).reshape(dims)
    return array if dtype.isnative else array.astype(dtype.newbyteorder("="))


def _dtype(name: str, where: str) -> np.dtype:
    """The numpy dtype `name` spells, if a v2 datatype has it: in either byte order, as the
    array carries its own (numpy on a big-endian machine writes '>f4'), which v2's binary
    tensors do not (always little-endian)."""
    try:
        dtype = np.dtype(name)
        datatypes.from_numpy(dtype.newbyteorder("="))
        if dtype.kind == "O" or not dtype.itemsize:  # no bytes to read them from
            raise ValueError(dtype.str)
    except (TypeError, ValueError, DeprecationWarning):
        raise InvalidInput(
            f"{where}: dtype {echo_repr(name)} has no KServe v2 datatype; expected one of "
            f"{', '.join(_DTYPE_NAMES)}, or text as '<U<n>' or '|S<n>' (either byte order: "
            "'>f4' is float32 too)"
        ) from None
    return dtype


LAST_CODE_POINT = 0x10FFFF


def _check_code_points(raw: bytes, dtype: np.dtype, where: str) -> None:
    """numpy holds text as 4-byte code points and takes any 32-bit value for one: a value past
    Unicode's last broke making the element a str (SystemError, answered 500)."""
    codes = np.frombuffer(raw, np.dtype(np.uint32).newbyteorder(dtype.byteorder))
    if codes.size and codes.max() > LAST_CODE_POINT:
        at = int(np.argmax(codes > LAST_CODE_POINT))
        raise InvalidInput(
            f"{where}: text of dtype {dtype.str!r}: element {at // (dtype.itemsize // 4)} holds "
            f"{int(codes[at]):#x}, past Unicode's last code point ({LAST_CODE_POINT:#x})"
        )


_DTYPE_NAMES = [
    repr(d.numpy.str) for d in datatypes.DATATYPES.values() if d.name not in ("BYTES", "BF16")
]  # BF16 travels as its raw bits, '<u2'; BYTES as text


def _kind(value: Any) -> str:
    """A client's value by its kind where its text would say less (a str of 48 digits)."""
    return "a string" if isinstance(value, str) else echo_json(value)


_MAP_KEY = re.compile(r"(\w+) is not allowed for map key")
_KINDS = {"NoneType": "nil", "bool": "a boolean", "int": "an integer", "float": "a float"}
_KINDS |= {"list": "an array", "dict": "a map", "Timestamp": "a timestamp", "ExtType": "an ext"}


_TOO_LONG = re.compile(r"\d+ exceeds max_(\w+)_len")
_LONG_KINDS = {"map": "a map", "array": "an array", "str": "a str", "bin": "a bin", "ext": "an ext"}
_CUT_SHORT = "the data ends before its value does (cut short, or empty?)"


def _reason(exc: Exception) -> str:
    """What msgpack found wrong, in the words of its format rather than of its Python reader
    (some of its errors carry no message; some name a Python type, or an argument of its
    reader: max_array_len, which it sets to the bytes left)."""
    if isinstance(exc, msgpack.StackError):
        return "nested deeper than msgpack allows"
    if isinstance(exc, msgpack.ExtraData):
        extra = len(exc.extra)
        return f"{extra} byte{'s' * (extra > 1)} after its first value; expected one value"
    if isinstance(exc, msgpack.FormatError):
        return "malformed data: a byte that starts no msgpack type (such as 0xc1)"
    if isinstance(exc, UnicodeDecodeError):
        return f"a str is not UTF-8 ({exc.reason} at its byte {exc.start}); send bytes as bin"
    if key := _MAP_KEY.match(str(exc)):
        return f"a map key is {_KINDS.get(key[1], key[1])}; expected str keys (names)"
    if long := _TOO_LONG.match(str(exc)):
        return f"{_LONG_KINDS.get(long[1], long[1])} is longer than the bytes left: {_CUT_SHORT}"
    if str(exc) == "Unpack failed: incomplete input":
        return _CUT_SHORT
    return str(exc) or f"malformed data ({type(exc).__name__})"


def encode_result(result: Any, accept: str | None) -> tuple[bytes, str]:
    """The response body and its media type, chosen by the Accept header.

    A result that JSON or msgpack cannot carry is the handler's bug (HandlerError, 500)."""
    weights = _weights(accept)
    try:
        for msgpack_type in MSGPACK_TYPES:
            wanted = weights.get(msgpack_type, 0.0)
            if wanted > 0 and all(wanted >= weights.get(t, 0.0) for t in _COVER_JSON):
                return msgpack.packb(result, default=_builtin), msgpack_type
        return values.to_json(result, default=_json_builtin), JSON_TYPE
    except (TypeError, ValueError) as exc:
        raise HandlerError(
            f"handler.postprocess returned {type(result).__name__} holding what a response "
            f"cannot carry ({exc}); expected JSON-like values: dict, list, str, numbers, "
            "np.ndarray"
        ) from None


_COVER_JSON = (JSON_TYPE, "application/*", "*/*")


def _weights(accept: str | None) -> dict[str, float]:
    """Each media type of an Accept header with its q (1 unless given): msgpack only when it is
    asked for and wanted at least as much as JSON, so `application/msgpack;q=0` means JSON."""
    weights: dict[str, float] = {}
    for item in (accept or "").lower().split(","):
        kind, *params = (part.strip() for part in item.split(";"))
        q = 1.0
        for param in params:
            name, _, value = param.partition("=")
            if name.strip() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
        weights[kind] = max(weights.get(kind, 0.0), q)
    return weights


def _json_builtin(value: Any) -> Any:
    """orjson writes only C-contiguous numeric arrays itself: others (an output cut on a padded
    axis) would go through `tolist`, and float32 values would print as float64 ones
    (0.1428571492433548 for 0.14285715)."""
    if isinstance(value, np.ndarray) and value.ndim == 0:  # ascontiguousarray: 1-d, a list
        return value.item()
    if isinstance(value, np.ndarray) and value.dtype.kind in "biuf":
        return np.ascontiguousarray(value)
    return _builtin(value)


def _builtin(value: Any) -> Any:
    """What orjson and msgpack can't write themselves: numpy values, and bytes in JSON."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, bytes):
        return value.decode("utf-8")
    raise TypeError(f"cannot encode a {type(value).__name__} in a response")
