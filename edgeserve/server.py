"""Serve a function over HTTP with uvicorn: the same app and runtime as every target uses."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import uvicorn

from edgeserve.bundle import open_or_build
from edgeserve.http.app import FunctionApp, create_app
from edgeserve.runtime import Runtime

log = logging.getLogger("edgeserve")

GRACEFUL_SHUTDOWN_S = 30.0
"""SIGTERM: stop accepting, let in-flight requests finish for at most this long, then exit."""


def serve(
    path: Path,
    *,
    host: str = "127.0.0.1",
    port: int = 8080,
    backend: str | None = None,
    log_level: str = "info",
    fd: int | None = None,
) -> None:
    """Open (or build) the bundle at `path`, load it once, and serve until SIGTERM/SIGINT."""
    logging.basicConfig(level=log_level.upper(), format="%(levelname)s: %(message)s")
    app = load_app(path, backend=backend)
    uvicorn.run(
        app,
        host=host,
        port=port,
        fd=fd,
        log_level=log_level,
        timeout_graceful_shutdown=int(GRACEFUL_SHUTDOWN_S),
        access_log=False,
    )


def load_app(path: Path, backend: str | None = None) -> FunctionApp:
    """Open (or build) the bundle at `path` and load it: the app every server of it runs."""
    started = time.perf_counter()
    bundle = open_or_build(path)
    runtime = Runtime.load(bundle, backend=backend)
    runtime.timings["open_s"] = time.perf_counter() - started - runtime.timings["load_s"]
    return create_app(runtime, max_body_bytes=int(bundle.manifest.resources.max_body_mb * 2**20))
