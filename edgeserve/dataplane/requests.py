"""A request and its answer as the data plane sees them, whatever the transport.

A front (HTTP v2 JSON or binary, gRPC, a Lambda event, another process) decodes its bytes
into an `InferRequest`; the data plane checks what it asks for against the model, runs it, and
hands back `OutputTensor`s for the front to encode. `place` is where a shared-memory client
keeps a tensor (Triton's system shared-memory extension); None: it travels in the message.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgeserve.datatypes import DATATYPES, from_numpy
from edgeserve.errors import InvalidInput, did_you_mean, echo, echo_json
from edgeserve.sharedmemory import Slice
from edgeserve.types import Signature, TensorDict

MAX_TENSORS = 4096
"""The most inputs, and outputs, a request may name (no model has as many): a million tiny
inputs in a 56 MB body took 9 s to decode and check, and 100 MB of memory."""


@dataclass(frozen=True)
class RequestedOutput:
    name: str
    binary: bool
    place: Slice | None = None  # written to shared memory, not sent
    classes: int | None = None  # the classification extension: the top N, as BYTES


@dataclass(frozen=True)
class InferRequest:
    """A decoded request; `outputs` is None when the client asked for all of them."""

    id: str | None
    parameters: Mapping[str, Any]
    inputs: TensorDict
    outputs: tuple[RequestedOutput, ...] | None
    binary_output: bool
    bf16: frozenset[str] = frozenset()  # inputs declared BF16: uint16 arrays, as UINT16's are


@dataclass(frozen=True)
class OutputTensor:
    name: str
    data: np.ndarray
    datatype: str
    binary: bool
    place: Slice | None = None


@dataclass(frozen=True)
class Parameters:
    """The request parameters the data plane acts on (Triton's names and units)."""

    timeout_s: float | None = None  # `timeout`, in microseconds: may shorten timeout_ms
    priority: int = 0  # `priority`: 0 is the default level; there are no other levels

    @classmethod
    def of(cls, parameters: Mapping[str, Any]) -> Parameters:
        """The parameters of a request; a bad value is the client's error (400)."""
        timeout, priority = parameters.get("timeout"), parameters.get("priority")
        if timeout is None and priority is None:  # most requests: no object made for them
            return _DEFAULTS
        return cls(_timeout_s(timeout), _priority(priority))


_DEFAULTS = Parameters()


def _timeout_s(value: Any) -> float | None:
    """µs as seconds; None (the function's timeout_ms) for none or 0, Triton's "no timeout"
    (tritonclient sends a 0 it is given)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidInput(
            f"parameters.timeout: expected a non-negative integer of microseconds (0: none), "
            f"got {_integer_as_sent(value)}"
        )
    return value / 1e6 if value else None


def _priority(value: Any) -> int:
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidInput(
            "parameters.priority: expected a non-negative integer (0: the default), "
            f"got {_integer_as_sent(value)}"
        )
    return value


def _integer_as_sent(value: Any) -> str:
    """A value refused where an integer belongs, as the client would recognise it: orjson
    reads an integer past 64 bits as a float, so 18446744073709551616 was echoed back as
    1.8446744073709552e+19."""
    if isinstance(value, float) and value.is_integer() and not -(2**63) <= value < 2**64:
        return "a number past 64 bits"
    return echo_json(value)


def shared_memory_slice(where: str, parameters: Mapping[str, Any]) -> Slice | None:
    """The region, offset and byte size a tensor's parameters name, or None (no region)."""
    region = parameters.get("shared_memory_region")
    if region is None:
        return None
    if not isinstance(region, str):
        raise InvalidInput(
            f"{where}: shared_memory_region must be a string, got {echo_json(region)}"
        )
    if "shared_memory_byte_size" not in parameters:
        raise InvalidInput(f"{where}: names shared_memory_region without shared_memory_byte_size")
    counts = []
    for key, default in (("shared_memory_offset", 0), ("shared_memory_byte_size", None)):
        value = parameters.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InvalidInput(
                f"{where}: {key} must be a non-negative integer, got {_integer_as_sent(value)}"
            )
        counts.append(value)
    return Slice(region, counts[0], counts[1])


def classification(where: str, parameters: Mapping[str, Any]) -> int | None:
    """The classification extension's count: the top N classes of the output, as BYTES."""
    count = parameters.get("classification")
    if count is None:
        return None
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise InvalidInput(
            f"{where}: parameters.classification: expected a count of classes >= 1, "
            f"got {_integer_as_sent(count)}"
        )
    return count


def check_outputs(request: InferRequest, signature: Signature) -> None:
    """Refuse, before running the model, outputs it lacks and BF16 outputs asked for as JSON."""
    if not request.outputs:  # all of them, as the request's binary_data_output says
        for every in signature.outputs:
            if every.datatype == "BF16" and not request.binary_output:
                raise _bf16_as_json(every.name)
        return
    specs = {spec.name: spec for spec in signature.outputs}
    for output in request.outputs:
        spec = specs.get(output.name)
        if spec is None:
            raise InvalidInput(
                f"output `{echo(output.name)}`: the model has no such output; "
                f"its outputs are {sorted(specs)}{did_you_mean(output.name, specs)}"
            )
        if output.classes is not None:
            _check_classification(output, spec.datatype)
        elif spec.datatype == "BF16" and not output.binary and output.place is None:
            raise _bf16_as_json(output.name)


def check_bf16(request: InferRequest, signature: Signature) -> None:
    """Hold the inputs a client declared BF16 to the model's BF16 inputs, and back: both travel
    as uint16 arrays, which the door cannot tell apart. UINT16 data sent to a BF16 input was
    run as bf16 bits, and BF16 sent to another input was refused as "UINT16"."""
    wanted = signature.bf16_inputs
    if not (request.bf16 or wanted) or request.bf16 == wanted:
        return
    for name in (request.bf16 ^ wanted) & request.inputs.keys():
        spec, array = signature.input(name), request.inputs[name]
        if spec is not None:  # an unknown input: the door names it
            sent = "BF16" if name in request.bf16 else from_numpy(array.dtype).name
            raise InvalidInput(
                f"tensor `{echo(name)}`: expected {list(spec.dims)} {spec.datatype}, "
                f"got {list(array.shape)} {sent}"
            )


CLASSIFIABLE = frozenset(DATATYPES) - {"BOOL", "BYTES", "BF16"}
"""Outputs the classification extension ranks: numbers numpy compares."""


def _check_classification(output: RequestedOutput, datatype: str) -> None:
    if datatype not in CLASSIFIABLE:
        raise InvalidInput(
            f"output `{output.name}`: parameters.classification: the output is {datatype}; "
            "classes are ranked from a numeric output"
        )
    if output.place is not None:
        raise InvalidInput(
            f"output `{output.name}`: parameters.classification: not written to shared memory; "
            "leave out shared_memory_region for it"
        )


def _bf16_as_json(name: str) -> InvalidInput:
    return InvalidInput(
        f"output `{name}`: BF16 travels only as binary data; "
        "ask for it with parameters.binary_data = true"
    )


def response_outputs(
    request: InferRequest, results: TensorDict, signature: Signature
) -> list[OutputTensor]:
    """The tensors to send, in the order asked (all outputs in model order when none were named)."""
    if request.outputs is None:
        binary = request.binary_output
        return [
            OutputTensor(
                spec.name,
                results[spec.name],
                spec.datatype or from_numpy(results[spec.name].dtype).name,
                binary,
            )
            for spec in signature.outputs
            if spec.name in results
        ]
    datatypes = {spec.name: spec.datatype for spec in signature.outputs}
    wanted = request.outputs
    if any(o.classes is not None for o in wanted):
        results = _with_classes(wanted, results, signature)
        datatypes |= {o.name: "BYTES" for o in wanted if o.classes is not None}
    return [
        OutputTensor(
            o.name,
            results[o.name],
            datatypes.get(o.name) or from_numpy(results[o.name].dtype).name,
            o.binary,
            o.place,
        )
        for o in wanted
    ]


def _with_classes(
    wanted: tuple[RequestedOutput, ...], results: TensorDict, signature: Signature
) -> TensorDict:
    """The outputs asked for as classes replaced by their top N, as Triton's classification
    extension answers: per row of a batched model, `value:index[:label]` from the highest
    value down (ties: the lower index first); at most as many as the row has values."""
    labels = {spec.name: spec.labels for spec in signature.outputs}
    ranked = dict(results)
    for output in wanted:
        if output.classes is not None:
            values = results[output.name]
            rows = values.reshape(len(values), -1) if signature.batched else values.reshape(1, -1)
            top = [_top(row, output.classes, labels[output.name]) for row in rows]
            ranked[output.name] = np.array(top if signature.batched else top[0], dtype=object)
    return ranked


def _top(row: np.ndarray, count: int, labels: tuple[str, ...]) -> list[bytes]:
    float_values = row.dtype.kind == "f"
    found = []
    for index in _ranked(row)[:count].tolist():
        value = row[index]
        text = f"{value:f}" if float_values else str(int(value))  # as C++'s std::to_string
        label = f":{labels[index]}" if index < len(labels) and labels[index] else ""
        found.append(f"{text}:{index}{label}".encode())
    return found


def _ranked(row: np.ndarray) -> np.ndarray:
    """Indices from the highest value down, ties by the lower index, NaN last (Triton's order
    for NaN is undefined; first, it would crowd out every class)."""
    if row.dtype.kind == "f" and np.isnan(row).any():
        kept, missing = np.flatnonzero(~np.isnan(row)), np.flatnonzero(np.isnan(row))
        return np.concatenate([kept[_descending(row[kept])], missing])
    return _descending(row)


def _descending(row: np.ndarray) -> np.ndarray:
    width = len(row)
    return (width - 1 - np.argsort(row[::-1], kind="stable"))[::-1]
