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

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from edgeserve.dataplane.regions import check_local
from edgeserve.http.body import json_object
from edgeserve.sharedmemory import Regions


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
        self._check_caller(request)
        body = await json_object(request, self.limit)
        self.regions.register(self.kind, request.path_params["name"], body)
        return Response()

    async def unregister(self, request: Request) -> Response:
        self._check_caller(request)
        self.regions.unregister(self.kind, request.path_params.get("name"))
        return Response()

    async def status(self, request: Request) -> Response:
        self._check_caller(request)
        return JSONResponse(self.regions.status(self.kind, request.path_params.get("name")))

    def _check_caller(self, request: Request) -> None:
        check_local(request.client.host if request.client else "", kind=self.kind)
