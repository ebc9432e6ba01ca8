"""Triton's raw tensor layout, one codec for every transport that carries it: HTTP's binary
extension, gRPC's `raw_input_contents` / `raw_output_contents`, and shared memory.

Numbers are little-endian, row-major; a BYTES element is a 4-byte little-endian length and its
bytes; BF16 is its raw bits (uint16, see datatypes.py). Decoded BYTES elements are `bytes`.
"""

from __future__ import annotations

import math
import struct
from typing import Any

import numpy as np

from edgeserve import values
from edgeserve.datatypes import DATATYPES, Datatype, bf16_bits
from edgeserve.errors import MISSING, InvalidInput, did_you_mean, echo_json


def datatype(where: str, value: Any) -> Datatype:
    """The v2 datatype a client named (a missing or unknown one is refused, listing them)."""
    found = DATATYPES.get(value) if isinstance(value, str) else None
    if found is None:
        what = (
            "`datatype` is missing" if value is MISSING else f"unknown datatype {echo_json(value)}"
        )
        close = did_you_mean(value, DATATYPES) if isinstance(value, str) else ""
        raise InvalidInput(f"{where}: {what}; expected one of {sorted(DATATYPES)}{close}")
    return found


def from_raw(
    where: str, datatype: Datatype, shape: tuple[int, ...], chunk: memoryview
) -> np.ndarray:
    """Zero-copy for numbers (read-only arrays over the chunk); BYTES elements are unframed."""
    count = math.prod(shape)
    if datatype.name == "BYTES":
        return _unframe_bytes(where, chunk, count).reshape(shape)
    check_size(where, datatype, shape, len(chunk))
    if datatype.name == "BOOL":
        return values.read_bools(chunk).reshape(shape)
    return np.frombuffer(chunk, dtype=datatype.numpy.newbyteorder("<")).reshape(shape)


def check_size(
    where: str, datatype: Datatype, shape: tuple[int, ...], size: int, sized_by: str = ""
) -> None:
    """`size` bytes hold the shape's elements; `sized_by` names who said `size`, where it is
    not the data itself (a shared-memory slice)."""
    needed = math.prod(shape) * datatype.size
    if size != needed:
        found = f"but {sized_by} is {size}" if sized_by else f"its data has {size}"
        raise InvalidInput(f"{where}: {datatype.name} {list(shape)} needs {needed} bytes, {found}")


def _unframe_bytes(where: str, chunk: memoryview, count: int) -> np.ndarray:
    """`count` BYTES elements, each its 4-byte length and its bytes, filling `chunk` exactly."""
    items: list[bytes] = []
    offset = 0
    while offset + 4 <= len(chunk) and len(items) < count:
        (length,) = struct.unpack_from("<I", chunk, offset)
        items.append(bytes(chunk[offset + 4 : offset + 4 + length]))
        offset += 4 + length
    if len(items) != count or offset != len(chunk):
        raise InvalidInput(
            f"{where}: BYTES binary data: expected {count} length-prefixed elements "
            f"filling {len(chunk)} bytes exactly; {_misframed(chunk, count)}"
        )
    array = np.empty(count, dtype=object)
    array[:] = items
    return array


def _misframed(chunk: memoryview, count: int) -> str:
    """Where BYTES framing goes wrong: the element whose length prefix or bytes run past the
    data, or the bytes left over after the last element."""
    offset = 0
    for element in range(count):
        if offset + 4 > len(chunk):
            left = len(chunk) - offset
            return f"element {element}'s 4-byte length prefix at byte {offset} has {left} bytes"
        (length,) = struct.unpack_from("<I", chunk, offset)
        if offset + 4 + length > len(chunk):
            left = len(chunk) - offset - 4
            return f"element {element} (at byte {offset}) declares {length} bytes; {left} remain"
        offset += 4 + length
    after = f"element {count - 1}" if count else "the start: the shape holds no elements"
    return f"{len(chunk) - offset} bytes follow {after}"


def tensor_bytes(array: np.ndarray, datatype: str) -> bytes:
    """A tensor in the raw layout: little-endian numbers, or BYTES elements each after a 4-byte
    length."""
    if datatype == "BYTES":
        parts = []
        for item in array.reshape(-1):
            raw = item if isinstance(item, bytes) else str(item).encode("utf-8")
            parts.append(struct.pack("<I", len(raw)))
            parts.append(raw)
        return b"".join(parts)
    if datatype == "BF16":  # raw bits: a conversion to uint16 would round the values
        array = bf16_bits(array)
    dtype = DATATYPES[datatype].numpy.newbyteorder("<")
    return np.ascontiguousarray(array, dtype=dtype).tobytes()
