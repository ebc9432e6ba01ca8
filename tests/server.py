"""Run `edgeserve serve` for real: a subprocess on 127.0.0.1, port 0, bounded waits, SIGTERM."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

LISTENING = re.compile(r"(?:Uvicorn running on|serving on) (https?://[\d.]+:\d+)")


class Server:
    """A running `edgeserve serve` process and everything it printed so far."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.process = process
        self.lines: queue.Queue[str] = queue.Queue()
        self.output: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.output.append(line)
            self.lines.put(line)

    def wait_for_url(self, timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.2)
            except queue.Empty:
                if self.process.poll() is not None:
                    break
                continue
            if match := LISTENING.search(line):
                return match.group(1)
        raise RuntimeError("server did not start:\n" + "".join(self.output))


def wait_ready(url: str, timeout_s: float = 60.0, **client: Any) -> None:
    """Poll readiness; `client` goes to httpx (verify= for TLS, headers= for auth)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/v2/health/ready", timeout=2, **client).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"{url} not ready after {timeout_s}s")


@contextmanager
def running(
    path: Path,
    *args: str,
    timeout_s: float = 90.0,
    env: dict[str, str] | None = None,
    client: dict[str, Any] | None = None,
) -> Iterator[tuple[str, Server]]:
    """`edgeserve serve PATH ARGS` on 127.0.0.1:0, ready; yields (URL, server); SIGTERM stops it."""
    command = [
        sys.executable,
        "-m",
        "edgeserve",
        "serve",
        str(path),
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        *args,
    ]
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
    )
    server = Server(process)
    try:
        url = server.wait_for_url(timeout_s)
        wait_ready(url, timeout_s, **(client or {}))
        yield url, server
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


@contextmanager
def served(
    path: Path, *args: str, timeout_s: float = 90.0, env: dict[str, str] | None = None
) -> Iterator[str]:
    """Serve a function source folder or bundle; yield its base URL."""
    with running(path, *args, timeout_s=timeout_s, env=env) as (url, _):
        yield url
