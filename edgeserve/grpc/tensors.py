"""ModelInferRequest -> the data plane's `InferRequest`, and `OutputTensor`s -> ModelInferResponse,
as Triton's gRPC front reads and writes them: pure functions, nothing checked against the model
(the data plane does that).

An input's data is, in Triton's order: a shared-memory region its parameters name, else its
typed `contents` (the field of its datatype; FP16 and BF16 have none), else the next entry of
`raw_input_contents` (Triton's raw layout, `dataplane.raw`), which the inputs without either
take in turn. As Triton, a request that has raw contents may give no input typed `contents`:
an input carrying both shifted every later input onto its neighbour's raw entry, and the
error then named a tensor the client had sent right. Outputs always travel raw, one
`raw_output_contents` entry per output (an empty one for an output written to shared memory),
as Triton answers.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from edgeserve import values
from edgeserve.dataplane import InferRequest, OutputTensor, RequestedOutput, raw
from edgeserve.dataplane.checks import check_declared
from edgeserve.dataplane.regions import ReadSlice, region_tensor
from edgeserve.dataplane.requests import MAX_TENSORS, classification, shared_memory_slice
from edgeserve.datatypes import Datatype
from edgeserve.errors import MISSING, InvalidInput, echo
from edgeserve.grpc.messages import message
from edgeserve.types import Signature

CONTENTS = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}
"""The typed `contents` field of each datatype (FP16 and BF16 travel raw only)."""


def parameters(entries: Mapping[str, Any], where: str) -> dict[str, Any]:
    """A `map<string, InferParameter>` as the Python values the data plane reads."""
    found = {}
    for key, parameter in entries.items():
        choice = parameter.WhichOneof("parameter_choice")
        if choice is None:
            raise InvalidInput(
                f"{where}: `{echo(key)}` has no value; expected one of bool_param, int64_param, "
                "uint64_param, double_param, string_param"
            )
        found[key] = getattr(parameter, choice)
    return found


def decode_request(
    request: Any, read_slice: ReadSlice, signature: Signature | None = None
) -> InferRequest:
    """The data plane's request from a ModelInferRequest; InvalidInput if it is malformed (a
    datatype other than `signature`'s: before the data is read)."""
    if len(request.inputs) > MAX_TENSORS or len(request.outputs) > MAX_TENSORS:
        raise InvalidInput(
            f"request: {len(request.inputs)} inputs, {len(request.outputs)} outputs; expected at "
            f"most {MAX_TENSORS} of each (a model has fewer)"
        )
    raws = request.raw_input_contents
    inputs, bf16, taken = {}, [], 0
    for entry in request.inputs:
        where = f"tensor `{echo(entry.name)}`"
        datatype = raw.datatype(where, entry.datatype or MISSING)
        shape = values.to_shape(list(entry.shape), where)
        if signature is not None:
            check_declared(signature, entry.name, datatype, shape)
        params = parameters(entry.parameters, f"{where}: `parameters`")
        place = shared_memory_slice(where, params)
        typed = entry.HasField("contents")
        if typed and raws:
            raise InvalidInput(
                f"{where}: has typed `contents` in a request that also has raw_input_contents; "
                "expected every input's data in one of them, not both (as Triton). Hint: FP16 "
                "and BF16 travel raw only, so send every input raw beside them"
            )
        if place is not None:
            if typed:
                raise InvalidInput(f"{where}: names a shared memory region and also has `contents`")
            array = region_tensor(read_slice, where, datatype, shape, place)
        elif typed:
            array = _from_contents(where, datatype, shape, entry.contents)
        elif taken < len(raws):
            array = raw.from_raw(where, datatype, shape, memoryview(raws[taken]))
            taken += 1
        else:
            raise InvalidInput(
                f"{where}: has no data: expected `contents`, an entry of raw_input_contents "
                "(one per input, in the order of `inputs`), or a shared memory region"
            )
        if entry.name in inputs:
            raise InvalidInput(f"{where}: given twice in `inputs`")
        inputs[entry.name] = array
        if datatype.name == "BF16":
            bf16.append(entry.name)
    if taken != len(raws):
        raise InvalidInput(
            f"raw_input_contents holds {len(raws)} tensors, but {taken} inputs read their data "
            "from it; expected one for each input that has neither `contents` nor a shared "
            "memory region, in the order of `inputs`"
        )
    return InferRequest(
        id=request.id or None,
        parameters=parameters(request.parameters, "request `parameters`"),
        inputs=inputs,
        outputs=_requested_outputs(request.outputs),
        binary_output=True,  # raw: BF16 outputs travel too
        bf16=frozenset(bf16),
    )


def _from_contents(where: str, datatype: Datatype, shape: tuple[int, ...], contents: Any) -> Any:
    """A tensor from its typed `contents`: the one field of its datatype, as many elements as
    its shape holds, each within the datatype's range."""
    field = CONTENTS.get(datatype.name)
    sent = [descriptor.name for descriptor, _ in contents.ListFields()]
    if field is None or any(name != field for name in sent):
        expected = f"contents.{field}" if field else "raw_input_contents (it has no typed field)"
        found = ", ".join(f"contents.{name}" for name in sent) or "empty contents"
        raise InvalidInput(f"{where}: {datatype.name} data travels in {expected}; found {found}")
    items = getattr(contents, field)
    count = math.prod(shape)
    if len(items) != count:
        raise InvalidInput(
            f"{where}: {datatype.name} {list(shape)}: expected {count} elements in "
            f"contents.{field}, got {len(items)}"
        )
    if datatype.name == "BYTES":
        array = np.empty(count, dtype=object)
        array[:] = list(items)
        return array.reshape(shape)
    wide = np.array(items, dtype=np.result_type(datatype.numpy, _FIELD_DTYPES[field]))
    if datatype.numpy.kind in "iu" and wide.size:
        info = np.iinfo(datatype.numpy)
        if wide.min() < info.min or wide.max() > info.max:
            bad = wide.min() if wide.min() < info.min else wide.max()
            raise InvalidInput(
                f"{where}: value {bad} in contents.{field} is out of range for "
                f"{datatype.name} ({info.min}..{info.max})"
            )
    return wide.astype(datatype.numpy, copy=False).reshape(shape)


_FIELD_DTYPES = {
    "bool_contents": np.bool_,
    "int_contents": np.int32,
    "int64_contents": np.int64,
    "uint_contents": np.uint32,
    "uint64_contents": np.uint64,
    "fp32_contents": np.float32,
    "fp64_contents": np.float64,
}


def _requested_outputs(entries: Sequence[Any]) -> tuple[RequestedOutput, ...] | None:
    if not entries:
        return None
    outputs, named = [], set()
    for entry in entries:
        where = f"output `{echo(entry.name)}`"
        if entry.name in named:
            raise InvalidInput(f"{where}: requested twice in `outputs`")
        named.add(entry.name)
        params = parameters(entry.parameters, f"{where}: `parameters`")
        place = shared_memory_slice(where, params)
        outputs.append(RequestedOutput(entry.name, True, place, classification(where, params)))
    return tuple(outputs)


def encode_response(
    model_name: str, model_version: str, request_id: str | None, outputs: Sequence[OutputTensor]
) -> Any:
    """The ModelInferResponse: each output's name, datatype and shape, its data raw."""
    response = message("ModelInferResponse")(
        model_name=model_name, model_version=model_version, id=request_id or ""
    )
    for output in outputs:
        response.outputs.add(name=output.name, datatype=output.datatype, shape=output.data.shape)
        data = b"" if output.place else raw.tensor_bytes(output.data, output.datatype)
        response.raw_output_contents.append(data)
    return response
