"""The KServe v2 inference codec with Triton's binary tensor extension, as pure functions.

A body is binary only when `Inference-Header-Content-Length` says so (tritonclient sends no
Content-Type): the JSON header comes first, then each binary tensor's bytes in header order.
Inputs carry `parameters.binary_data_size`; outputs ask for binary with `parameters.binary_data`,
or all at once with the request's `parameters.binary_data_output`. Numbers are little-endian,
row-major; a BYTES element is a 4-byte little-endian length and its bytes; BF16 (raw bits in
uint16, see datatypes.py) travels only in binary. BYTES elements decode to `bytes` objects.

A decoded body is the data plane's `InferRequest`; the data plane's `OutputTensor`s become the
response body. Nothing here checks a request against the model: the data plane does.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from edgeserve import values
from edgeserve.dataplane import raw
from edgeserve.dataplane.checks import check_declared
from edgeserve.dataplane.regions import ReadSlice, region_tensor
from edgeserve.dataplane.requests import (
    MAX_TENSORS,
    InferRequest,
    OutputTensor,
    RequestedOutput,
    classification,
    shared_memory_slice,
)
from edgeserve.datatypes import Datatype
from edgeserve.errors import MISSING, InvalidInput, echo, echo_json
from edgeserve.http.framing import JSON_HEADER, json_length, read_json
from edgeserve.types import Signature, TensorDict

HEADER_LENGTH = "inference-header-content-length"
_NONE: frozenset[str] = frozenset()


def decode_request(
    body: bytes,
    header_length: str | None,
    read_slice: ReadSlice | None = None,
    signature: Signature | None = None,
) -> InferRequest:
    """Parse a v2 request body; `header_length` is the Inference-Header-Content-Length value.
    Inputs naming a shared-memory region are read through `read_slice` (None: not served); a
    datatype other than `signature`'s is refused before the data is read."""
    json_end = json_length(body, header_length)
    text = body[:json_end]
    where = "request body" if header_length is None else JSON_HEADER
    header = _mapping(read_json(text, where), where)
    parameters = _parameters(header.get("parameters", {}), "request `parameters`")
    binary = memoryview(body)[json_end:]
    inputs: TensorDict = {}
    bf16 = []  # raw bits in uint16, as UINT16 numbers are: the data plane tells them apart
    offset = 0
    for index, entry in enumerate(_inputs(header)):
        entry, name = _named(entry, "inputs", index)
        array, offset = _decode_input(name, entry, binary, offset, read_slice, signature)
        if name in inputs:
            raise InvalidInput(f"tensor `{echo(name)}`: given twice in `inputs`")
        inputs[name] = array
        if entry["datatype"] == "BF16":
            bf16.append(name)
    if offset != len(binary):
        raise InvalidInput(
            f"binary data: the inputs' binary_data_size add up to {offset} bytes, "
            f"but {len(binary)} bytes follow the JSON header"
        )
    request_id = header.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise InvalidInput(f"request `id`: expected a string, got {echo_json(request_id)}")
    outputs = _requested_outputs(header, parameters)
    values.check_keys(text, _keys(header), "request body", header)
    return InferRequest(
        id=request_id,
        parameters=parameters,
        inputs=inputs,
        outputs=outputs,
        binary_output=_flag(parameters, "binary_data_output", False, "request `parameters`"),
        bf16=frozenset(bf16) if bf16 else _NONE,
    )


def _keys(header: dict[str, Any]) -> int:
    """The keys of a decoded request's objects where v2 has them (the request, each input and
    requested output, and their parameters), for `values.check_keys`."""
    count = len(header) + len(header.get("parameters") or ())
    for entry in itertools.chain(header["inputs"], header.get("outputs") or ()):
        count += len(entry) + len(entry.get("parameters") or ())
    return count


def _mapping(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InvalidInput(f"{what}: expected a JSON object, got {echo_json(value)}")
    return value


def _named(value: Any, key: str, index: int) -> tuple[dict[str, Any], str]:
    """Item `index` of the request's `key` list (`inputs`, `outputs`): an object with a string
    `name`, and that name. Its place is written out only for a message."""
    entry = value if isinstance(value, dict) else _mapping(value, f"request `{key}[{index}]`")
    name = entry.get("name", MISSING)
    if not isinstance(name, str):
        raise InvalidInput(
            f"request `{key}[{index}]`: expected a string `name`, got {echo_json(name)}"
        )
    return entry, name


def _parameters(value: Any, what: str) -> dict[str, Any]:
    """A `parameters` object: each value a string, number or boolean (the protocol's
    `$parameter`; Triton refuses others too)."""
    parameters = _mapping(value, what)
    for key, item in parameters.items():
        if not isinstance(item, str | int | float | bool):
            raise InvalidInput(
                f"{what}: `{echo(key)}`: expected a string, number or boolean, "
                f"got {echo_json(item)}"
            )
    return parameters


def _list(value: Any, what: str) -> list[Any]:
    if not isinstance(value, list):
        raise InvalidInput(f"{what}: expected a JSON list, got {echo_json(value)}")
    return value


_V2_KEYS = frozenset({"id", "parameters", "inputs", "outputs"})


def _inputs(header: Mapping[str, Any]) -> list[Any]:
    """The request's `inputs`. A body of tensors by name (`{"x": [[...]]}`, the sample `init`
    writes) is an /invoke request: it was answered "got nothing (the key is missing)" alone,
    which left the newcomer who posted the sample here to guess what to send."""
    if header and not _V2_KEYS & header.keys():
        keys = ", ".join(f"`{echo(str(key))}`" for key in list(header)[:3])
        raise InvalidInput(
            f"request `inputs`: expected a JSON list of tensors, got nothing (the key is "
            f"missing; the body holds {keys}, tensors by name as /invoke takes them). Hint: POST "
            "this body to /invoke, or send KServe v2's "
            '{"inputs": [{"name": ..., "shape": [...], "datatype": ..., "data": [...]}]}'
        )
    return _tensors(header.get("inputs", MISSING), "request `inputs`")


def _tensors(value: Any, what: str) -> list[Any]:
    entries = _list(value, what)
    if len(entries) > MAX_TENSORS:
        raise InvalidInput(
            f"{what}: {len(entries)} tensors; expected at most {MAX_TENSORS} (a model has fewer)"
        )
    return entries


def _decode_input(
    name: str,
    entry: dict[str, Any],
    binary: memoryview,
    offset: int,
    read_slice: ReadSlice | None,
    signature: Signature | None,
) -> tuple[np.ndarray, int]:
    where = f"tensor `{echo(name)}`"
    datatype = raw.datatype(where, entry.get("datatype", MISSING))
    shape = values.to_shape(entry.get("shape", MISSING), where)
    if signature is not None:
        check_declared(signature, name, datatype, shape)
    parameters = _parameters(entry.get("parameters", {}), f"{where}: `parameters`")
    place = shared_memory_slice(where, parameters)
    if place is not None:
        if "data" in entry or "binary_data_size" in parameters:
            raise InvalidInput(f"{where}: names a shared memory region and also carries data")
        if read_slice is None:
            raise InvalidInput(f"{where}: shared memory is not served on this route")
        return region_tensor(read_slice, where, datatype, shape, place), offset
    size = parameters.get("binary_data_size")
    if size is None:
        if "data" not in entry:
            raise InvalidInput(f"{where}: has neither `data` nor parameters.binary_data_size")
        return _from_json(where, datatype, shape, entry["data"]), offset
    if "data" in entry:
        raise InvalidInput(f"{where}: has both `data` and parameters.binary_data_size")
    if not values.is_count(size):
        raise InvalidInput(
            f"{where}: parameters.binary_data_size: expected a non-negative integer "
            f"byte count, got {echo_json(size)}"
        )
    if offset + size > len(binary):
        raise InvalidInput(
            f"{where}: binary_data_size {size} runs past the body "
            f"({len(binary) - offset} binary bytes left)"
        )
    chunk = binary[offset : offset + size]
    return raw.from_raw(where, datatype, shape, chunk), offset + size


def _from_json(where: str, datatype: Datatype, shape: tuple[int, ...], data: Any) -> np.ndarray:
    """Flat or nested row-major JSON data, checked against the shape's element count."""
    typed = f"{where}: {datatype.name} {list(shape)}"
    array = values.to_array(data, datatype, typed, max_depth=len(shape))
    if array.size != math.prod(shape):
        raise InvalidInput(f"{typed}: expected {math.prod(shape)} elements, got {array.size}")
    return array.reshape(shape)


def _requested_outputs(
    header: dict[str, Any], parameters: Mapping[str, Any]
) -> tuple[RequestedOutput, ...] | None:
    entries = header.get("outputs")
    if entries is None or entries == []:
        return None
    default = _flag(parameters, "binary_data_output", False, "request `parameters`")
    outputs: list[RequestedOutput] = []
    named: set[str] = set()  # a set: 30,000 names compared pairwise held a front for 10 s
    for index, entry in enumerate(_tensors(entries, "request `outputs`")):
        entry, name = _named(entry, "outputs", index)
        where = f"output `{echo(name)}`"
        params = _parameters(entry.get("parameters", {}), f"{where}: `parameters`")
        if name in named:
            raise InvalidInput(f"{where}: requested twice in `outputs`")
        named.add(name)
        place = shared_memory_slice(where, params)
        binary = _flag(params, "binary_data", default, f"{where}: `parameters`")
        outputs.append(RequestedOutput(name, binary, place, classification(where, params)))
    return tuple(outputs)


def _flag(parameters: Mapping[str, Any], key: str, default: bool, where: str) -> bool:
    """A boolean parameter; any other JSON type is refused rather than read as truthy."""
    value = parameters.get(key, default)
    if not isinstance(value, bool):
        raise InvalidInput(f"{where}: {key}: expected true or false, got {echo_json(value)}")
    return value


def encode_response(
    model_name: str, model_version: str, request_id: str | None, outputs: Sequence[OutputTensor]
) -> tuple[bytes, int | None]:
    """The response body, and the JSON header's length when binary tensors follow it."""
    header: dict[str, Any] = {"model_name": model_name, "model_version": model_version}
    if request_id is not None:
        header["id"] = request_id
    entries = []
    chunks: list[bytes] = []
    for output in outputs:
        entry: dict[str, Any] = {
            "name": output.name,
            "datatype": output.datatype,
            "shape": list(output.data.shape),
        }
        if output.binary and output.place is None:
            chunk = raw.tensor_bytes(output.data, output.datatype)
            entry["parameters"] = {"binary_data_size": len(chunk)}
            chunks.append(chunk)
        elif output.place is None:
            entry["data"] = _to_json(output)
        # an output in shared memory is in its region already: shape and datatype, as Triton
        entries.append(entry)
    header["outputs"] = entries
    encoded = values.to_json(header)
    if not chunks:
        return encoded, None
    return b"".join([encoded, *chunks]), len(encoded)


def _to_json(output: OutputTensor) -> Any:
    """A flat list: numbers as a contiguous array orjson writes directly (floats that are not
    finite as Triton writes them, `NaN`, `Infinity` and `-Infinity`: `values.to_json`), BYTES
    as strings."""
    flat = output.data.reshape(-1)
    if output.datatype != "BYTES":
        return np.ascontiguousarray(flat)
    try:
        return [item.decode("utf-8") if isinstance(item, bytes) else str(item) for item in flat]
    except UnicodeDecodeError:
        raise InvalidInput(
            f"output `{output.name}`: holds bytes that are not UTF-8, which JSON cannot carry; "
            "ask for it with parameters.binary_data = true"
        ) from None
