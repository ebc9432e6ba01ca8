"""Serve a function over HTTP with uvicorn: the same app and runtime as every target uses."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import uvicorn

from edgeserve.bundle import Bundle, open_or_build
from edgeserve.hardware import probe
from edgeserve.http.app import FunctionApp, create_app
from edgeserve.runtime import Runtime
from edgeserve.workers import choose_layout, serve_workers, usable_cores, workers_setting

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
    workers: str | None = None,
) -> int:
    """Open (or build) the bundle at `path`, load it once, and serve until SIGTERM/SIGINT.

    `workers` (else EDGESERVE_WORKERS, else the manifest's [resources] workers) picks the
    process layout: one process, or front processes and an inference process (edgeserve.workers).
    """
    logging.basicConfig(level=log_level.upper(), format="%(levelname)s: %(message)s")
    started = time.perf_counter()
    bundle = open_or_build(path)
    manifest = bundle.manifest
    setting = workers_setting(workers, manifest.resources.workers)
    layout = choose_layout(setting, probe(), usable_cores())
    log.info("process layout: %s", layout.reason)
    if not layout.single and fd is None:
        return serve_workers(
            bundle.root,
            host=host,
            port=port,
            fronts=layout.fronts,
            backend=backend,
            log_level=log_level,
            drain_s=GRACEFUL_SHUTDOWN_S,
            max_batch_size=manifest.batching.max_batch_size,
        )
    app = app_for(bundle, backend, started)
    uvicorn.run(
        app,
        host=host,
        port=port,
        fd=fd,
        log_level=log_level,
        timeout_graceful_shutdown=int(GRACEFUL_SHUTDOWN_S),
        access_log=False,
    )
    return 0


def load_app(path: Path, backend: str | None = None) -> FunctionApp:
    """Open (or build) the bundle at `path` and load it: the app every server of it runs."""
    started = time.perf_counter()
    return app_for(open_or_build(path), backend, started)


def app_for(bundle: Bundle, backend: str | None, started: float) -> FunctionApp:
    """The app of one process serving `bundle` (loaded here; `started`: when opening began)."""
    runtime = Runtime.load(bundle, backend=backend)
    runtime.timings["open_s"] = time.perf_counter() - started - runtime.timings["load_s"]
    return create_app(runtime, max_body_bytes=int(bundle.manifest.resources.max_body_mb * 2**20))
