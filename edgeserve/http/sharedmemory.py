"""Triton's shared-memory extensions over HTTP: register, unregister, status, per kind.

    POST /v2/systemsharedmemory/region/{name}/register   {"key", "offset", "byte_size"}
    POST /v2/systemsharedmemory[/region/{name}]/unregister
    GET  /v2/systemsharedmemory[/region/{name}]/status    [{"name", "key", "offset", "byte_size"}]

Answers as Triton's: a bad registration is 400 with what was wrong, status of an unknown
region is 404, unregistering an unknown region succeeds. Unlike Triton, only a client on this
machine (a loopback address, after uvicorn's trusted proxy headers) may use these routes
(403 otherwise): shared memory is for local clients, and a remote one could otherwise map any
object in /dev/shm and read it back through an identity-like model. The regions live in
`edgeserve.sharedmemory.Regions`, which the v2 infer route reads inputs from and writes
outputs to. `/v2/cudasharedmemory/...` has the same routes; without CUDA region support its
register answers 400 (its status lists none, its unregister succeeds: perf_analyzer and
tritonclient clean up both kinds).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from edgeserve.dataplane.requests import OutputTensor, RequestedOutput
from edgeserve.errors import Forbidden, PayloadTooLarge
from edgeserve.http import v2
from edgeserve.http.body import json_object
from edgeserve.sharedmemory import Regions, Slice


class SharedMemoryRoutes:
    """The register, unregister and status routes of one kind of region ("system", "cuda")."""

    def __init__(self, regions: Regions, kind: str, limit: int) -> None:
        self.regions, self.kind, self.limit = regions, kind, limit

    def routes(self) -> list[Route]:
        prefix = f"/v2/{self.kind}sharedmemory"
        region = prefix + "/region/{name}"
        return [
            Route(region + "/register", self.register, methods=["POST"]),
            Route(prefix + "/unregister", self.unregister, methods=["POST"]),
            Route(region + "/unregister", self.unregister, methods=["POST"]),
            Route(prefix + "/status", self.status),
            Route(region + "/status", self.status),
        ]

    async def register(self, request: Request) -> Response:
        _check_caller(request)
        body = await json_object(request, self.limit)
        self.regions.register(self.kind, request.path_params["name"], body)
        return Response()

    async def unregister(self, request: Request) -> Response:
        _check_caller(request)
        self.regions.unregister(self.kind, request.path_params.get("name"))
        return Response()

    async def status(self, request: Request) -> Response:
        _check_caller(request)
        return JSONResponse(self.regions.status(self.kind, request.path_params.get("name")))


@dataclass
class ClientRegions:
    """The regions as one infer request may use them: only a client on this machine may, and
    its inputs there may add up to `limit` bytes, as its body may (they are copied in)."""

    regions: Regions
    client: str
    limit: int
    taken: int = 0

    def read(self, where: str, place: Slice) -> memoryview:
        """An input's bytes (v2.ReadSlice)."""
        check_local(self.client)
        self.taken += place.byte_size
        if self.taken > self.limit:
            raise PayloadTooLarge(
                f"{where}: the request's inputs in shared memory add up to {self.taken} bytes, "
                f"over the limit of {self.limit} bytes that a request's inputs may hold (in its "
                "body or in shared memory). Hint: raise [resources] max_body_mb in function.toml"
            )
        return self.regions.read(where, place)

    def check_outputs(self, wanted: Iterable[RequestedOutput]) -> None:
        """Refuse, before running, outputs asked into a region that cannot take them."""
        for output in wanted:
            if output.place is not None:
                check_local(self.client)
                self.regions.check(f"output `{output.name}`", output.place)

    def write_outputs(self, outputs: Iterable[OutputTensor]) -> None:
        for output in outputs:
            if output.place is not None:
                data = v2.tensor_bytes(output.data, output.datatype)
                self.regions.write(f"output `{output.name}`", output.place, data)


def _check_caller(request: Request) -> None:
    check_local(request.client.host if request.client else "")


def check_local(host: str) -> None:
    """Refuse (403) shared memory to a client that is not on a loopback address."""
    try:
        local = ipaddress.ip_address(host).is_loopback
    except ValueError:
        local = False
    if not local:
        raise Forbidden(
            f"system shared memory is for clients on this machine; {host or 'a client'} is not "
            "on a loopback address. Hint: send the tensors in the request body instead"
        )
