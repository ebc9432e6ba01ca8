"""A request and its answer as the data plane sees them, whatever the transport.

A front (HTTP v2 JSON or binary, a Lambda event, another process, gRPC later) decodes its bytes
into an `InferRequest`; the data plane checks what it asks for against the model, runs it, and
hands back `OutputTensor`s for the front to encode. `place` is where a shared-memory client
keeps a tensor (Triton's system shared-memory extension); None: it travels in the message.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgeserve.datatypes import from_numpy
from edgeserve.errors import InvalidInput
from edgeserve.sharedmemory import Slice
from edgeserve.types import Signature, TensorDict


@dataclass(frozen=True)
class RequestedOutput:
    name: str
    binary: bool
    place: Slice | None = None  # written to shared memory, not sent


@dataclass(frozen=True)
class InferRequest:
    """A decoded request; `outputs` is None when the client asked for all of them."""

    id: str | None
    parameters: Mapping[str, Any]
    inputs: TensorDict
    outputs: tuple[RequestedOutput, ...] | None
    binary_output: bool


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
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise InvalidInput(
            f"parameters.timeout: expected a positive integer of microseconds, got {value!r}"
        )
    return value / 1e6


def _priority(value: Any) -> int:
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidInput(
            f"parameters.priority: expected a non-negative integer (0: the default), got {value!r}"
        )
    return value


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
                f"output `{output.name}`: the model has no such output; "
                f"its outputs are {sorted(specs)}"
            )
        if spec.datatype == "BF16" and not output.binary and output.place is None:
            raise _bf16_as_json(output.name)


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
