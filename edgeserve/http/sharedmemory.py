"""Triton's system shared-memory extension over HTTP: register, unregister, status.

    POST /v2/systemsharedmemory/region/{name}/register   {"key", "offset", "byte_size"}
    POST /v2/systemsharedmemory[/region/{name}]/unregister
    GET  /v2/systemsharedmemory[/region/{name}]/status    [{"name", "key", "offset", "byte_size"}]

Answers as Triton's: a bad registration is 400 with what was wrong, status of an unknown
region is 404, unregistering an unknown region succeeds. The regions live in
`edgeserve.sharedmemory.Regions`, which the v2 infer route reads inputs from and writes
outputs to.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from edgeserve.errors import InvalidInput
from edgeserve.http.body import json_object
from edgeserve.sharedmemory import Regions, SystemRegion

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
        self.regions.unregister(SystemRegion.kind, request.path_params.get("name"))
        return Response()

    async def status(self, request: Request) -> Response:
        return JSONResponse(self.regions.status(SystemRegion.kind, request.path_params.get("name")))
