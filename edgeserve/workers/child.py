"""What a child process (a front or an inference process) is told, and how it starts."""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import json
import logging
import os
import shutil
import signal
import sys
from collections.abc import Callable, Coroutine
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from edgeserve.bundle import Bundle
from edgeserve.logformat import configure_logging

_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class ChildConfig:
    """What a child process is told on its command line."""

    bundle: str
    sockets_dir: str  # inference process i listens on `socket_path(i)` there once it is ready
    regions_dir: str  # shared-memory registrations, seen by every front (sharedmemory.Regions)
    board_fd: int
    fronts: int
    drain_s: float  # the drain bound ([resources] drain_timeout_s or serve's override)
    log_level: str
    devices: list[str] = field(default_factory=lambda: ["cpu"])  # per inference process
    cpu_threads: int = 0  # backend threads of one on the CPU, unless [backend] threads is set
    backend: str | None = None
    front: int = 0
    channel_fd: int = -1  # a front's end of its channel from the supervisor (handoff.py)
    instance: int = 0  # which inference process this one is (in an inference process)
    tls: dict[str, Any] | None = None  # edgeserve.http.tls.TlsFiles' fields
    timeouts: dict[str, float | None] = field(default_factory=dict)  # serve's overrides
    source: str | None = None  # the function folder a cached bundle came from (for messages)
    supervisor: int = 0  # its pid: a child that finds another parent is an orphan already
    grpc_address: str | None = None  # where every front serves gRPC too (SO_REUSEPORT)

    @property
    def instances(self) -> int:
        return len(self.devices)

    def socket_path(self, instance: int) -> str:
        return str(Path(self.sockets_dir) / f"inference-{instance}.sock")

    def open_bundle(self) -> Bundle:
        """The bundle, knowing its source folder: the handler's errors name the user's file."""
        return replace(
            Bundle.open(Path(self.bundle)), source=Path(self.source) if self.source else None
        )

    def argv(self, module: str) -> list[str]:
        return ["-m", module, json.dumps(asdict(self))]


def child_main(main: Callable[[ChildConfig], None]) -> None:
    """Entry point of a child: dies with its supervisor, logs like it, runs `main`, and once
    `main` has returned, exits at once, as multiprocessing ends its children: what a child
    holds lives in the kernel (memfds, sockets) or in the supervisor's folder, and Python's
    own teardown of a loaded backend took 0.1-0.2 s of the drain bound, freeing nothing."""
    parser = argparse.ArgumentParser()
    parser.add_argument("config")
    config = ChildConfig(**json.loads(parser.parse_args().config))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)  # a killed supervisor leaves no orphans
    if os.getppid() != config.supervisor:  # ... nor one killed before that line
        sys.exit(f"edgeserve: the supervisor (pid {config.supervisor}) is gone")
    configure_logging(config.log_level, os.environ)
    main(config)
    if os.getppid() != config.supervisor:  # killed (SIGKILL): its folder is the children's
        shutil.rmtree(config.sockets_dir, ignore_errors=True)  # to remove, the last one out
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # an exception above exits the usual way, with its traceback and status 1


def run_loop(work: Coroutine[Any, Any, None]) -> None:
    """Run `work` on the event loop uvicorn would choose (uvloop where installed)."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop comes with uvicorn[standard]
        asyncio.run(work)
        return
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(work)
