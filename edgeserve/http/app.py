"""The Starlette app of one function: KServe v2 as Triton speaks it, `/invoke` and `/metrics`.

Status codes follow Triton except where noted at the route. A request that waits for inference
watches its connection: when the client hangs up, the waiting inference is cancelled, so the
batcher drops its items before they run.

Not served (Triton has them): response compression by Accept-Encoding (request bodies may be
gzip or deflate), raw binary requests (Inference-Header-Content-Length: 0), classification,
shared memory, the repository, trace and logging extensions.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from typing import Any, Protocol, TypeVar

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from edgeserve import __version__
from edgeserve.errors import InvalidInput, ModelNotFound, Unavailable
from edgeserve.http import invoke, metadata, v2
from edgeserve.http.body import read_body
from edgeserve.http.errors import ErrorMiddleware, http_exception_handler
from edgeserve.manifest import Manifest
from edgeserve.stats import ModelStats
from edgeserve.types import Signature, TensorDict

T = TypeVar("T")
DRAIN_TIMEOUT_S = 30.0


class ServedFunction(Protocol):
    """What the HTTP layer needs of a runtime (edgeserve.runtime.Runtime is the real one)."""

    ready: bool

    @property
    def name(self) -> str: ...
    @property
    def version(self) -> str: ...
    @property
    def manifest(self) -> Manifest: ...
    @property
    def signature(self) -> Signature: ...
    @property
    def backend_name(self) -> str: ...
    @property
    def stats(self) -> ModelStats: ...

    async def start(self) -> None: ...
    async def stop(self, drain_timeout_s: float = ...) -> None: ...
    async def infer(self, inputs: TensorDict, timeout_s: float | None = None) -> TensorDict: ...
    async def invoke(self, payload: Any, content_type: str) -> Any: ...


def create_app(runtime: ServedFunction, *, max_body_bytes: int | None = None) -> Starlette:
    """The app serving `runtime`; its lifespan starts the runtime and stops it (draining)."""
    limit = max_body_bytes or int(runtime.manifest.resources.max_body_mb * 2**20)
    endpoints = _Endpoints(runtime, limit)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await runtime.start()
        try:
            yield
        finally:
            await runtime.stop(DRAIN_TIMEOUT_S)

    return Starlette(
        routes=endpoints.routes(),
        middleware=[Middleware(ErrorMiddleware)],
        exception_handlers={HTTPException: http_exception_handler},
        lifespan=lifespan,
    )


class _Endpoints:
    def __init__(self, runtime: ServedFunction, limit: int) -> None:
        self.runtime = runtime
        self.limit = limit

    def routes(self) -> list[Route]:
        model = "/v2/models/{model}"
        routes = [
            Route("/v2/health/live", self.live),
            Route("/v2/health/ready", self.ready),
            Route("/v2", self.server_metadata),
            Route("/v2/models/stats", self.stats),
            Route("/invoke", self.invoke, methods=["POST"]),
            Route("/metrics", self.metrics),
        ]
        for base in (model, model + "/versions/{version}"):
            routes += [
                Route(base, self.model_metadata),
                Route(base + "/ready", self.model_ready),
                Route(base + "/config", self.model_config),
                Route(base + "/stats", self.stats),
                Route(base + "/infer", self.infer, methods=["POST"]),
            ]
        return routes

    async def live(self, request: Request) -> Response:
        return Response()

    async def ready(self, request: Request) -> Response:
        """503 while loading or draining (Triton says 400; 503 is what probes and LBs expect)."""
        if not self.runtime.ready:
            raise Unavailable(
                f"`{self.runtime.name}` is not ready (loading, warming up or draining)"
            )
        return Response()

    async def server_metadata(self, request: Request) -> Response:
        return JSONResponse(metadata.server_metadata(__version__))

    async def model_metadata(self, request: Request) -> Response:
        self._check_model(request)
        runtime = self.runtime
        return JSONResponse(
            metadata.model_metadata(
                runtime.name, runtime.version, runtime.backend_name, runtime.signature
            )
        )

    async def model_ready(self, request: Request) -> Response:
        self._check_model(request)
        return await self.ready(request)

    async def model_config(self, request: Request) -> Response:
        self._check_model(request)
        runtime = self.runtime
        return JSONResponse(
            metadata.model_config(
                runtime.name, runtime.backend_name, runtime.manifest, runtime.signature
            )
        )

    async def stats(self, request: Request) -> Response:
        if "model" in request.path_params:
            self._check_model(request)
        return JSONResponse({"model_stats": [self.runtime.stats.triton_stats()]})

    async def metrics(self, request: Request) -> Response:
        return Response(
            generate_latest(self.runtime.stats.registry), media_type=CONTENT_TYPE_LATEST
        )

    async def infer(self, request: Request) -> Response:
        runtime = self.runtime
        self._check_model(request, infer=True)
        body = await read_body(request, self.limit)
        decoded = v2.decode_request(body, request.headers.get(v2.HEADER_LENGTH))
        v2.check_outputs(decoded, runtime.signature)
        timeout_s = v2.request_timeout_s(decoded)
        results = await _unless_disconnected(request, runtime.infer(decoded.inputs, timeout_s))
        outputs = v2.response_outputs(decoded, results, runtime.signature)
        content, header_length = v2.encode_response(
            runtime.name, runtime.version, decoded.id, outputs
        )
        if header_length is None:
            return Response(content, media_type="application/json")
        headers = {v2.HEADER_LENGTH: str(header_length)}
        return Response(content, media_type="application/octet-stream", headers=headers)

    async def invoke(self, request: Request) -> Response:
        body = await read_body(request, self.limit)
        content_type = invoke.media_type(request.headers.get("content-type"))
        payload = invoke.decode_payload(body, content_type)
        result = await _unless_disconnected(request, self.runtime.invoke(payload, content_type))
        content, media_type = invoke.encode_result(result, request.headers.get("accept"))
        return Response(content, media_type=media_type)

    def _check_model(self, request: Request, *, infer: bool = False) -> None:
        """Unknown model: 404, but 400 on infer; unknown version: 404 everywhere.

        These are Triton's answers (its infer path reports an unknown model as INVALID_ARG), kept
        so that clients and retry policies written against Triton see the same codes.
        """
        name, version = self.runtime.name, self.runtime.version
        model = request.path_params["model"]
        if model != name:
            error = InvalidInput if infer else ModelNotFound
            raise error(f"unknown model `{model}`: this server serves `{name}`")
        wanted = request.path_params.get("version")
        if wanted is not None and wanted != version:
            raise ModelNotFound(
                f"model `{name}` has no version `{wanted}`; it serves version `{version}`"
            )


async def _unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Await `work`; if the client hangs up first, cancel it and raise ClientDisconnect."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnect(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    if task.cancelled():
        raise ClientDisconnect()
    return task.result()


async def _disconnect(request: Request) -> None:
    """Returns when the client disconnects (the body has been read, so nothing else arrives)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
