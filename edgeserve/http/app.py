"""The ASGI app of one function: KServe v2 as Triton speaks it, `/invoke` and `/metrics`.

Inference requests take their own lean path (`inference.py`); everything else (health,
metadata, config, statistics, metrics, the OpenAPI document and its /docs page, and routing
errors) is a Starlette app. Status codes
follow Triton except where noted at the route.

Not served (Triton has them): response compression by Accept-Encoding (request bodies may be
gzip or deflate), raw binary requests (Inference-Header-Content-Length: 0). The trace and
logging extensions answer for what edgeserve does (`settings.py`): logging follows the
`edgeserve` loggers, tracing is off and cannot be turned on. The
classification extension is `dataplane.requests`'. System shared memory is served
(`sharedmemory.py`); the repository extension lists the one function and answers model control
as `repository.py` explains.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from edgeserve import __version__
from edgeserve.dataplane import DataPlane, ServedFunction, serving
from edgeserve.dataplane.metadata import server_metadata
from edgeserve.dataplane.settings import LogSettings
from edgeserve.errors import InvalidInput, ModelNotFound, Unauthorized, echo
from edgeserve.gpumetrics import GpuMetrics
from edgeserve.http.auth import Credentials, load_credentials
from edgeserve.http.cors import Cors, CorsPolicy, load_cors
from edgeserve.http.errors import ErrorMiddleware, error_response, routing_error_handler
from edgeserve.http.inference import InferenceRoutes, route_path
from edgeserve.http.openapi import DocsRoutes, openapi_document
from edgeserve.http.repository import RepositoryRoutes
from edgeserve.http.settings import SettingsRoutes
from edgeserve.http.sharedmemory import SharedMemoryRoutes
from edgeserve.http.timeouts import Timeouts
from edgeserve.sharedmemory import Regions


class FunctionApp:
    """The ASGI app: inference routes go straight to their handlers, the rest to Starlette."""

    cors: Cors | None = None  # CrossOriginApp's; the server's own error answers add its headers

    def __init__(
        self,
        inference: InferenceRoutes,
        rest: Starlette,
        timeouts: Timeouts,
        credentials: Credentials | None = None,
        log_settings: LogSettings | None = None,
    ) -> None:
        self.inference = inference
        self.rest = rest
        self.timeouts = timeouts
        self.credentials = credentials
        self.log_settings = log_settings or LogSettings()  # the gRPC front beside shares it

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):  # the lifespan
            await self.rest(scope, receive, send)
            return
        path = route_path(scope)
        refused = self._refusal(path, scope)
        if refused is not None:
            await _answer(refused, scope, receive, send)
            return
        app = self.inference.app_for(path)
        await (app or self.rest)(scope, receive, send)

    def _refusal(self, path: str, scope: Scope) -> Response | None:
        """The answer to a request refused before it is routed: no accepted credentials, or a
        WebSocket (edgeserve's server hands the app its handshake as an HTTP request; others
        as a WebSocket, which the app answers alike), after which the connection closes."""
        if self.credentials is not None:
            try:
                self.credentials.check(path, scope["headers"])
            except Unauthorized as refused:
                return error_response(refused)
        if scope["type"] == "websocket" or _asks_websocket(scope["headers"]):
            response = error_response(
                InvalidInput(
                    f"{echo(path)}: WebSocket is not served: this function speaks HTTP/1.1 "
                    f"({served_routes(self.inference.runtime.name)}). Hint: send a plain "
                    "HTTP request, without `Upgrade: websocket`"
                )
            )
            response.headers["connection"] = "close"  # no HTTP request follows a handshake
            return response
        return None

    def begin_drain(self) -> None:
        """The server's shutdown has started (SIGTERM): drain within timeouts.drain_s (drain.py).

        Readiness turns 503 and new requests are refused; requests already in flight go on
        (their items still reach the batcher) until the bound, when the rest is answered 503."""
        self.inference.runtime.begin_drain()
        self.inference.drain.begin(self.timeouts.drain_s)


class CrossOriginApp(FunctionApp):
    """The app behind `Cors` (http/cors.py): a class of its own, made only where origins are
    configured, so that a server without them runs FunctionApp's own call, no layer before it."""

    cors: Cors

    def __init__(self, policy: CorsPolicy, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.cors = Cors(super().__call__, policy)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.cors(scope, receive, send)


def served_routes(name: str) -> str:
    """The routes a client most likely meant, as errors name them (/docs lists them all)."""
    return (
        f"KServe v2 as Triton does: POST /v2/models/{name}/infer, GET /v2/models/{name}, "
        "/v2/health/ready; POST /invoke; GET /metrics, /docs"
    )


def _asks_websocket(headers: list[tuple[bytes, bytes]]) -> bool:
    """Whether a request's headers ask for a WebSocket; on every request, so a plain loop."""
    for name, value in headers:  # noqa: SIM110 (any(generator) costs twice as much)
        if name == b"upgrade" and b"websocket" in value.lower():
            return True
    return False


async def _answer(response: Response, scope: Scope, receive: Receive, send: Send) -> None:
    """`response`; to a WebSocket handshake, as ASGI's denial response where the server can
    send one (else a close, which uvicorn answers with a bare 403)."""
    if scope["type"] == "websocket":
        await receive()  # websocket.connect
        if "websocket.http.response" not in scope.get("extensions", {}):
            await send({"type": "websocket.close", "code": 1008})
            return
    await response(scope, receive, send)


def create_app(
    runtime: ServedFunction,
    *,
    max_body_bytes: int | None = None,
    timeouts: Timeouts | None = None,
    regions: Regions | None = None,
    log_settings: LogSettings | None = None,
) -> FunctionApp:
    """The app serving `runtime`; its lifespan starts the runtime and stops it (draining).

    Defaults: the manifest's [resources] max_body_mb and timeouts; shared-memory regions of
    this process alone (processes serving one socket share `Regions(store=folder)`); log
    settings that this process's `edgeserve` loggers follow (a front of several refuses)."""
    resources = runtime.manifest.resources
    limit = max_body_bytes or int(resources.max_body_mb * 2**20)
    timeouts = timeouts or Timeouts.from_resources(resources)
    regions = regions or Regions()
    log_settings = log_settings or LogSettings()
    endpoints = _Endpoints(runtime, regions, limit, log_settings)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with serving(runtime, timeouts.drain_s):
            yield

    rest = Starlette(
        routes=endpoints.routes(),
        middleware=[Middleware(ErrorMiddleware)],
        exception_handlers={HTTPException: routing_error_handler(served_routes(runtime.name))},
        lifespan=lifespan,
    )
    rest.router.redirect_slashes = False  # Triton answers 404; a redirect would echo the Host
    credentials = load_credentials(runtime.manifest.auth, os.environ)
    parts = (InferenceRoutes(runtime, limit, regions), rest, timeouts, credentials)
    policy = load_cors(runtime.manifest.cors, os.environ)
    if policy is None:
        return FunctionApp(*parts, log_settings=log_settings)
    return CrossOriginApp(policy, *parts, log_settings=log_settings)


class _Endpoints:
    def __init__(
        self, runtime: ServedFunction, regions: Regions, limit: int, logs: LogSettings
    ) -> None:
        self.runtime = runtime
        self.plane = DataPlane(runtime)
        self.regions = regions
        self.limit = limit  # the body limit, which the control routes hold to as well
        self.logs = logs
        self.gpus = GpuMetrics()

    def routes(self) -> list[Route]:
        model = "/v2/models/{model}"
        routes = [
            Route("/v2/health/live", self.live),
            Route("/v2/health/ready", self.ready),
            Route("/v2", self.server_metadata),
            Route("/v2/models/stats", self.stats),
            Route("/metrics", self.metrics),
            *RepositoryRoutes(self.runtime, self.limit).routes(),
            *SharedMemoryRoutes(self.regions, "system", self.limit).routes(),
            *SharedMemoryRoutes(self.regions, "cuda", self.limit).routes(),
            *DocsRoutes(self._document()).routes(),
            *SettingsRoutes(self.plane, self.logs, self.limit).routes(model),
        ]
        for base in (model, model + "/versions/{version}"):
            routes += [
                Route(base, self.model_metadata),
                Route(base + "/ready", self.model_ready),
                Route(base + "/config", self.model_config),
                Route(base + "/stats", self.stats),
            ]
        return routes

    def _document(self) -> dict[str, Any]:
        runtime = self.runtime
        samples = runtime.root / "samples"
        return openapi_document(
            runtime.name,
            runtime.model_version,
            runtime.signature,
            runtime.manifest,
            samples if samples.is_dir() else None,
        )

    async def live(self, request: Request) -> Response:
        return Response()

    async def ready(self, request: Request) -> Response:
        """200 (empty, as Triton's) when whole; 200 with what is away while part serves."""
        self.plane.check_ready()
        if degraded := self.runtime.degraded:
            return JSONResponse({"ready": True, "degraded": degraded})
        return Response()

    async def server_metadata(self, request: Request) -> Response:
        return JSONResponse(server_metadata(__version__))

    async def model_metadata(self, request: Request) -> Response:
        self._check_model(request)
        return JSONResponse(self.plane.model_metadata())

    async def model_ready(self, request: Request) -> Response:
        """A model or version not served is not ready: 400, as Triton answers (it was 404)."""
        try:
            self._check_model(request)
        except ModelNotFound as missing:
            raise InvalidInput(missing.message) from None
        return await self.ready(request)

    async def model_config(self, request: Request) -> Response:
        self._check_model(request)
        return JSONResponse(self.plane.model_config())

    async def stats(self, request: Request) -> Response:
        if "model" in request.path_params:
            self._check_model(request)
        return JSONResponse({"model_stats": [self.runtime.stats.triton_stats()]})

    async def metrics(self, request: Request) -> Response:
        text = generate_latest(self.runtime.stats.registry) + self.gpus.text().encode()
        return Response(text, media_type=CONTENT_TYPE_LATEST)

    def _check_model(self, request: Request) -> None:
        params = request.path_params
        self.plane.check_model(params["model"], params.get("version"))
