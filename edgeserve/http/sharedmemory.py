"""Triton's system shared-memory extension over HTTP: register, unregister, status.

    POST /v2/systemsharedmemory/region/{name}/register   {"key", "offset", "byte_size"}
    POST /v2/systemsharedmemory[/region/{name}]/unregister
    GET  /v2/systemsharedmemory[/region/{name}]/status    [{"name", "key", "offset", "byte_size"}]

Answers as Triton's: a bad registration is 400 with what was wrong, status of an unknown
region is 404, unregistering an unknown region succeeds. Unlike Triton, only a client on this
machine (a loopback address, after uvicorn's trusted proxy headers) may use these routes
(403 otherwise): shared memory is for local clients, and a remote one could otherwise map any
object in /dev/shm and read it back through an identity-like model. The regions live in
`edgeserve.sharedmemory.Regions`, which the v2 infer route reads inputs from and writes
outputs to.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from edgeserve.dataplane.requests import OutputTensor, RequestedOutput
from edgeserve.errors import Forbidden, InvalidInput
from edgeserve.http import v2
from edgeserve.http.body import json_object
from edgeserve.sharedmemory import Regions, Slice, SystemRegion

PREFIX = "/v2/systemsharedmemory"


class SystemSharedMemoryRoutes:
    """The routes that manage system shared-memory regions in `regions`."""

    def __init__(self, regions: Regions) -> None:
        self.regions = regions

    def routes(self) -> list[Route]:
        region = PREFIX + "/region/{name}"
        return [
            Route(region + "/register", self.register, methods=["POST"]),
            Route(PREFIX + "/unregister", self.unregister, methods=["POST"]),
            Route(region + "/unregister", self.unregister, methods=["POST"]),
            Route(PREFIX + "/status", self.status),
            Route(region + "/status", self.status),
        ]

    async def register(self, request: Request) -> Response:
        name = request.path_params["name"]
        check_local(request.client.host if request.client else "")
        body = await json_object(request)
        missing = sorted({"key", "byte_size"} - set(body))
        if missing:
            raise InvalidInput(
                f"system shared memory region `{name}`: the register request lacks {missing}; "
                'expected {"key": "/name", "offset": 0, "byte_size": N}'
            )
        region = SystemRegion.open(name, body["key"], body.get("offset", 0), body["byte_size"])
        self.regions.register(region)
        return Response()

    async def unregister(self, request: Request) -> Response:
        check_local(request.client.host if request.client else "")
        self.regions.unregister(SystemRegion.kind, request.path_params.get("name"))
        return Response()

    async def status(self, request: Request) -> Response:
        check_local(request.client.host if request.client else "")
        return JSONResponse(self.regions.status(SystemRegion.kind, request.path_params.get("name")))


@dataclass(frozen=True)
class ClientRegions:
    """The regions as one infer request may use them: only a client on this machine may."""

    regions: Regions
    client: str

    def read(self, where: str, place: Slice) -> memoryview:
        """An input's bytes (v2.ReadSlice)."""
        check_local(self.client)
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
