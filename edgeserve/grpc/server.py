"""gRPC beside uvicorn: one `grpc.aio` server on the same event loop as the HTTP app, serving the
same function (`serving()` entered for as long as it serves), the same shared-memory registry,
credentials and TLS files, and draining with it on SIGTERM.

Messages may be as large as the request-size limit ([resources] max_body_mb; gRPC's own default
of 4 MB would refuse a plain image batch). The port is bound with SO_REUSEPORT (gRPC's default
on Linux), so that every front process of `serve --workers N` listens on it and the kernel
spreads connections between them.
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import AsyncExitStack
from pathlib import Path

import grpc

from edgeserve.dataplane import ServedFunction, serving
from edgeserve.dataplane.settings import LogSettings
from edgeserve.errors import ConfigError
from edgeserve.grpc.service import IN_FLIGHT, InferenceService
from edgeserve.http.app import FunctionApp
from edgeserve.http.auth import Credentials
from edgeserve.http.drain import Drain
from edgeserve.http.server import BACKSTOP_S
from edgeserve.http.tls import TlsFiles
from edgeserve.sharedmemory import Regions

log = logging.getLogger("edgeserve")


class GrpcServer:
    """The gRPC front of one function: `start`, `begin_drain` at SIGTERM, `stop`."""

    def __init__(
        self,
        function: ServedFunction,
        address: str,
        *,
        regions: Regions,
        limit: int,
        drain_s: float,
        credentials: Credentials | None = None,
        tls: TlsFiles | None = None,
        logs: LogSettings | None = None,
    ) -> None:
        self.drain = Drain()
        self.service = InferenceService(function, regions, limit, credentials, self.drain, logs)
        self.function = function
        self.address, self.limit, self.drain_s, self.tls = address, limit, drain_s, tls
        self.port: int | None = None
        self._server: grpc.aio.Server | None = None
        self._stack = AsyncExitStack()
        self._stopping: asyncio.Future[None] | None = None

    async def start(self) -> None:
        """Listen and serve (the function started, or kept started, meanwhile)."""
        await self._stack.enter_async_context(serving(self.function, self.drain_s))
        server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", self.limit),
                ("grpc.max_send_message_length", -1),
                ("grpc.so_reuseport", 1),
                ("grpc.max_concurrent_streams", IN_FLIGHT),  # calls a connection holds open
                # ... and no more: with grpc-core's overload protection on, a grpcio client
                # past IN_FLIGHT calls on one channel had some refused (RST_STREAM 7,
                # UNAVAILABLE) where it queues them without
                ("grpc.http.overload_protection", 0),
            ]
        )
        server.add_generic_rpc_handlers((self.service.handler(),))
        try:
            self.port = self._bind(server)
        except RuntimeError as exc:  # grpc says only "Failed to bind to address"
            raise ConfigError(f"gRPC: cannot listen on {self.address}: {exc}") from None
        await server.start()
        self._server = server
        scheme = "grpcs" if self.tls else "grpc"
        host = self.address.rpartition(":")[0]
        log.info("gRPC serving on %s://%s:%d (KServe v2, as Triton)", scheme, host, self.port)

    def _bind(self, server: grpc.aio.Server) -> int:
        if self.tls is None:
            return server.add_insecure_port(self.address)
        pair = (Path(self.tls.keyfile).read_bytes(), Path(self.tls.certfile).read_bytes())
        ca = Path(self.tls.ca_certs).read_bytes() if self.tls.ca_certs else None
        credentials = grpc.ssl_server_credentials(
            [pair], root_certificates=ca, require_client_auth=ca is not None
        )
        return server.add_secure_port(self.address, credentials)

    def begin_drain(self) -> None:
        """Refuse new calls; those in flight have until the drain bound, where what is left is
        answered UNAVAILABLE (http/drain.py's `Drain`, as HTTP answers 503); gRPC's own grace
        is a backstop past it."""
        if self._server is not None and self._stopping is None:
            self.drain.begin(self.drain_s)
            grace = self.drain_s + BACKSTOP_S
            self._stopping = asyncio.ensure_future(self._server.stop(grace))

    async def stop(self) -> None:
        """Once every call has been answered (or cut at the bound): leave `serving()`."""
        self.begin_drain()
        if self._stopping is not None:
            await self._stopping
        await self._stack.aclose()


def beside(app: FunctionApp, address: str, tls: TlsFiles | None = None) -> GrpcServer:
    """The gRPC front serving what `app` serves, with its registry, limit, credentials, drain
    bound and log settings."""
    routes = app.inference
    return GrpcServer(
        routes.runtime,
        address,
        regions=routes.regions,
        limit=routes.limit,
        drain_s=app.timeouts.drain_s,
        credentials=app.credentials,
        tls=tls,
        logs=app.log_settings,
    )
