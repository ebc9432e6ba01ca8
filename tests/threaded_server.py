"""A real uvicorn serving an app on 127.0.0.1, port 0, in a thread: bounded start and stop."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

import uvicorn
from starlette.types import ASGIApp


@contextmanager
def serving(app: ASGIApp, timeout_s: float = 30.0, **config: Any) -> Iterator[str]:
    """Serve `app` (lifespan included) and yield its base URL; shut it down on exit.
    `config`: more uvicorn settings (root_path, ...)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on", **config))
    thread = threading.Thread(target=_run, args=(server, sock), daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            sock.close()
            raise RuntimeError(f"uvicorn did not start within {timeout_s}s (its log says why)")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=timeout_s)
        sock.close()
        if thread.is_alive():
            raise RuntimeError(f"uvicorn did not stop within {timeout_s}s")


def _run(server: uvicorn.Server, sock: socket.socket) -> None:
    """uvicorn exits the process (SystemExit) when startup fails: here, only the thread ends."""
    with suppress(SystemExit):
        server.run(sockets=[sock])
