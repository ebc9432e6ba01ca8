"""Serve a function over HTTP with uvicorn: the same app and runtime as every target uses."""

from __future__ import annotations

import errno
import logging
import os
import socket
import time
from collections.abc import Mapping
from pathlib import Path

from edgeserve.backends import as_reached, choose, probe
from edgeserve.bundle import Bundle, is_function_source
from edgeserve.errors import ConfigError
from edgeserve.http.app import FunctionApp, create_app
from edgeserve.http.auth import load_credentials
from edgeserve.http.cors import load_cors
from edgeserve.http.server import Companion, DrainingServer, uvicorn_config
from edgeserve.http.timeouts import Timeouts
from edgeserve.http.tls import TlsFiles
from edgeserve.logformat import configure_logging
from edgeserve.runtime import Runtime
from edgeserve.workers import (
    Layout,
    choose_layout,
    serve_workers,
    usable_cores,
    workers_setting,
)

log = logging.getLogger("edgeserve")


def serve(
    path: Path,
    *,
    host: str = "127.0.0.1",
    port: int | None = None,
    backend: str | None = None,
    log_level: str = "info",
    fd: int | None = None,
    tls: TlsFiles | None = None,
    timeouts: Mapping[str, float | None] | None = None,
    workers: str | None = None,
    grpc_port: int | None = None,
) -> int:
    """Open (or build) the bundle at `path`, load it once, and serve until SIGTERM/SIGINT;
    the exit status.

    `port` None: the manifest's [resources] port; `grpc_port` None: its [resources] grpc_port
    (None there too: no gRPC). A port already taken is refused before the model loads
    (loading may take a minute; the mistake should cost a second). `timeouts` override the
    manifest's (`Timeouts` field names; None keeps the manifest's). `workers`
    (else EDGESERVE_WORKERS, else the manifest's [resources] workers) picks the process
    layout: one process, or front processes and an inference process (edgeserve.workers).
    """
    configure_logging(log_level, os.environ)
    started = time.perf_counter()
    bundle = _open(path, backend)
    resources = bundle.manifest.resources
    port = resources.port if port is None else port
    grpc_port = resources.grpc_port if grpc_port is None else grpc_port
    if fd is None:
        check_port(host, port)
    if grpc_port is not None:
        check_grpc_port(host, grpc_port, None if fd is not None else port)
    load_credentials(bundle.manifest.auth, os.environ)  # a missing token fails before loading
    load_cors(bundle.manifest.cors, os.environ)  # ... and so does a bad origin
    limits = Timeouts.from_resources(bundle.manifest.resources, **(timeouts or {}))
    layout = plan_layout(bundle, workers, backend)
    log.info("process layout: %s", layout.reason)
    if not layout.single and fd is None:
        return serve_workers(
            bundle,
            host=host,
            port=port,
            layout=layout,
            backend=backend,
            log_level=log_level,
            timeouts=dict(timeouts or {}),
            drain_s=limits.drain_s,
            tls=tls,
            grpc_port=grpc_port,
        )
    app = _load(bundle, backend, started, limits)
    settings = tls.uvicorn_options() if tls else {}
    config = uvicorn_config(app, host=host, port=port, fd=fd, log_level=log_level, **settings)
    DrainingServer(config, grpc_beside(app, host, grpc_port, tls)).run()
    return 0


def grpc_beside(
    app: FunctionApp, host: str, port: int | None, tls: TlsFiles | None
) -> list[Companion]:
    """The gRPC front beside uvicorn, where a port is asked for (grpcio imported only then)."""
    if port is None:
        return []
    from edgeserve.grpc import address
    from edgeserve.grpc.server import beside

    return [beside(app, address(host, port), tls)]


def check_grpc_port(host: str, grpc_port: int, http_port: int | None) -> None:
    """Refuse gRPC on the HTTP port (`http_port` None: a socket handed over, whose port is its
    own), on a port taken, or without grpcio, before the model loads."""
    from edgeserve.grpc import check_installed

    check_installed()
    if grpc_port and grpc_port == http_port:
        raise ConfigError(
            f"gRPC port {grpc_port} is the HTTP port too (--port, else [resources] port): gRPC "
            "needs a port of its own. Hint: pass another --grpc-port (Triton's is 8001), or 0 "
            "for any free one"
        )
    check_port(host, grpc_port)


def check_port(host: str, port: int) -> None:
    """Refuse a port that another process listens on, or a host that is not this machine's."""
    if not 0 <= port <= 65535:
        raise ConfigError(f"port {port}: expected 1-65535, or 0 for any free port")
    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise ConfigError(_bind_error(host, port, exc)) from None


def _bind_error(host: str, port: int, exc: OSError) -> str:
    if exc.errno == errno.EADDRINUSE:
        return (
            f"port {port} on {host} is already in use by another process. "
            "Hint: stop it, pass another --port, or --port 0 for any free port"
        )
    if exc.errno == errno.EACCES:
        return f"port {port} on {host}: permission denied (ports below 1024 need root)"
    return f"cannot listen on {host}:{port}: {exc.strerror} (--host must be this machine's)"


def load_app(path: Path, backend: str | None = None) -> FunctionApp:
    """Open (or build) the bundle at `path` and load it: the app every server of it runs."""
    started = time.perf_counter()
    return _load(_open(path, backend), backend, started)


def plan_layout(bundle: Bundle, workers: str | None, backend: str | None) -> Layout:
    """The processes `serve` would start for `bundle` on this machine (workers.layout)."""
    resources = bundle.manifest.resources
    platform = probe()
    choice = choose(platform, prefer=bundle.planned_backends(), override=backend)
    return choose_layout(
        workers_setting(workers, resources.workers),
        as_reached(platform, choice),
        usable_cores(),
        resources.devices,
        resources.processes_per_device,
    )


def _load(
    bundle: Bundle, backend: str | None, started: float, timeouts: Timeouts | None = None
) -> FunctionApp:
    runtime = Runtime.load(bundle, backend=backend)
    runtime.timings["open_s"] = time.perf_counter() - started - runtime.timings["load_s"]
    return create_app(runtime, timeouts=timeouts)


def _open(path: Path, backend: str | None) -> Bundle:
    """The bundle at `path`, built first when it is a function source (for `backend` alone
    where one is forced). Building needs the onnx package; serving a built bundle (on a device,
    in an image) must not, hence the late import."""
    if not is_function_source(path):
        return Bundle.open(path)
    from edgeserve.builder import open_or_build

    return open_or_build(path, backend=backend)
