"""What every front calls: a `ServedFunction` (the seam to a runtime) behind a `DataPlane`."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from edgeserve.dataplane import metadata
from edgeserve.dataplane.requests import (
    InferRequest,
    OutputTensor,
    Parameters,
    check_bf16,
    check_outputs,
    response_outputs,
)
from edgeserve.errors import InvalidInput, ModelNotFound, Unavailable, echo
from edgeserve.manifest import Manifest
from edgeserve.stats import ModelStats
from edgeserve.types import Signature, TensorDict


class ServedFunction(Protocol):
    """What a front needs of a runtime: edgeserve.runtime.Runtime, or a proxy that forwards to
    an inference process. Fronts use only this, never the runtime's insides."""

    @property
    def ready(self) -> bool: ...
    @property
    def degraded(self) -> str | None:
        """Ready, but serving with part of it away (what, in words); None when whole."""

    @property
    def name(self) -> str: ...
    @property
    def version(self) -> str: ...
    @property
    def model_version(self) -> str: ...
    @property
    def manifest(self) -> Manifest: ...
    @property
    def signature(self) -> Signature: ...
    @property
    def backend_name(self) -> str: ...
    @property
    def stats(self) -> ModelStats: ...
    @property
    def root(self) -> Path: ...

    async def start(self) -> None: ...
    def begin_drain(self) -> None: ...
    async def stop(self, drain_timeout_s: float = ...) -> None: ...
    async def admit(self, arrived: float) -> None:
        """Return once a request may be read; Unavailable when it would be refused anyway."""

    async def infer(
        self, inputs: TensorDict, timeout_s: float | None = None, *, arrived: float | None = None
    ) -> TensorDict: ...
    async def invoke(
        self, payload: Any, content_type: str, *, arrived: float | None = None
    ) -> Any: ...


class DataPlane:
    """Protocol-neutral inference and model information over one function."""

    def __init__(self, function: ServedFunction) -> None:
        self.function = function

    async def infer(self, request: InferRequest, *, arrived: float) -> list[OutputTensor]:
        """Check what the request asks of the model, run it, select the outputs it asked for.

        `arrived` (time.monotonic()) is when it reached the front: its deadline counts from
        there."""
        function = self.function
        check_outputs(request, function.signature)
        check_bf16(request, function.signature)
        parameters = Parameters.of(request.parameters)
        results = await function.infer(request.inputs, parameters.timeout_s, arrived=arrived)
        return response_outputs(request, results, function.signature)

    def check_ready(self) -> None:
        """503 while loading or draining (Triton says 400; 503 is what probes and LBs expect)."""
        if not self.function.ready:
            raise Unavailable(
                f"`{self.function.name}` is not ready (loading, warming up or draining)"
            )

    def model_metadata(self) -> dict[str, Any]:
        f = self.function
        return metadata.model_metadata(f.name, f.model_version, f.backend_name, f.signature)

    def model_config(self) -> dict[str, Any]:
        f = self.function
        return metadata.model_config(f.name, f.backend_name, f.manifest, f.signature)

    def check_model(self, model: str, version: str | None) -> None:
        """Unknown model: 400; unknown version: 404, on every route, in Triton's words.

        Triton's lookup (FindModelIdentifier) answers an unknown name INVALID_ARG "Request for
        unknown model: 'x' is not found" for infer, metadata, config and statistics alike (its
        clients match that text), and a missing version NOT_FOUND. Edgeserve answered metadata
        of an unknown model 404 and infer 400. A version
        is the integer model version or, beside it, the function's own ("1.2.0"); as in Triton,
        which reads the digits as a number, "01" is version 1.
        """
        f = self.function
        if model != f.name:
            raise InvalidInput(
                f"Request for unknown model: '{echo(model)}' is not found; this server serves "
                f"`{f.name}`"
            )
        if version is not None and not {version, _number(version)} & {f.model_version, f.version}:
            raise ModelNotFound(
                f"Request for unknown model: '{f.name}' version {echo(version)} is not found; "
                f"it serves version `{f.model_version}` (function version `{f.version}`)"
            )


def _number(version: str) -> str:
    """A version of digits as the number they write ("007" -> "7"); any other as it is."""
    if version.isascii() and version.isdigit():
        return version.lstrip("0") or "0"  # not int(): Python refuses 4301 digits and more
    return version
