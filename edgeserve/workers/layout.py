"""The process layout: how many front processes, and what each child process is told.

`workers` counts front processes. 1 is today's single process (HTTP, handler and batcher on
one event loop, inference on its threads); N > 1 is N fronts sharing the listening socket and
one inference process owning the backend and the batcher. `auto` decides from the machine
(cores: this process's CPU affinity, cut to its cgroup's CPU quota):

- up to 2 usable cores: 1. Measured on 2 cores (docs/performance.md, "Process layout"): the
  fronts and the inference process then fight over the same two cores that inference itself
  wants, and every request pays the hand-off between processes on top.
- a GPU: cores - 2 fronts (up to 16): the inference process needs about one core to feed the
  GPU, one is left for the system and the load of the hand-offs; the fronts do the rest.
- CPU only: a quarter of the cores (at least 2): inference itself wants most cores.

`EDGESERVE_WORKERS` overrides the manifest's [resources] workers, and `serve --workers` both.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import json
import logging
import os
import signal
from collections.abc import Callable, Coroutine
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from edgeserve.bundle import Bundle
from edgeserve.errors import ConfigError
from edgeserve.hardware import Platform

ENV = "EDGESERVE_WORKERS"
MAX_AUTO_FRONTS = 16
_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class Layout:
    fronts: int
    reason: str

    @property
    def single(self) -> bool:
        return self.fronts == 1


def choose_layout(setting: int | str, platform: Platform, cores: int) -> Layout:
    """The number of fronts for `setting` (a count or "auto") on this machine, and why."""
    if setting != "auto":
        count = _count(setting)
        return Layout(count, f"workers = {count} (asked)")
    if cores <= 2:
        return Layout(1, f"auto: {cores} cores: one process (measured best on 2 cores)")
    if platform.gpus or platform.jetson:
        fronts = min(cores - 2, MAX_AUTO_FRONTS)
        return Layout(fronts, f"auto: {cores} cores and a GPU: {fronts} fronts")
    fronts = max(2, cores // 4)
    return Layout(fronts, f"auto: {cores} cores, no GPU: {fronts} fronts (a quarter)")


def workers_setting(cli: str | None, manifest: int | str) -> int | str:
    """`--workers`, else EDGESERVE_WORKERS, else the manifest's value."""
    return cli or os.environ.get(ENV) or manifest


def usable_cores(cgroup: Path = Path("/sys/fs/cgroup/cpu.max")) -> int:
    """Cores this process may use: its CPU affinity, cut to its cgroup's CPU quota (a container
    limited to 2 CPUs on a 64-core node sees 64 in its affinity)."""
    cores = len(os.sched_getaffinity(0))
    try:
        quota = quota_cores(cgroup.read_text())
    except OSError:
        return cores
    return min(cores, quota) if quota else cores


def quota_cores(cpu_max: str) -> int | None:
    """Whole cores of a cgroup v2 `cpu.max` ("200000 100000": 2; "max 100000": no limit)."""
    quota, _, period = cpu_max.strip().partition(" ")
    if quota == "max" or not period:
        return None
    return max(1, int(quota) // int(period))


def _count(setting: int | str) -> int:
    try:
        count = int(setting)
    except ValueError:
        count = 0
    if count < 1:
        raise ConfigError(
            f"workers: expected `auto` or a count >= 1, got {setting!r} "
            f"(from --workers, {ENV} or [resources] workers)"
        )
    return count


@dataclass(frozen=True)
class ChildConfig:
    """What a child process (a front or the inference process) is told on its command line."""

    bundle: str
    socket_path: str
    regions_dir: str  # shared-memory registrations, seen by every front (sharedmemory.Regions)
    board_fd: int
    fronts: int
    drain_s: float
    log_level: str
    backend: str | None = None
    front: int = 0
    host: str = "127.0.0.1"
    port: int = 0
    tls: dict[str, Any] | None = None  # edgeserve.http.tls.TlsFiles' fields
    timeouts: dict[str, float | None] = field(default_factory=dict)  # serve's overrides
    source: str | None = None  # the function folder a cached bundle came from (for messages)

    def open_bundle(self) -> Bundle:
        """The bundle, knowing its source folder: the handler's errors name the user's file."""
        return replace(
            Bundle.open(Path(self.bundle)), source=Path(self.source) if self.source else None
        )

    def argv(self, module: str) -> list[str]:
        return ["-m", module, json.dumps(asdict(self))]


def child_main(main: Callable[[ChildConfig], None]) -> None:
    """Entry point of a child: dies with its supervisor, logs like it, runs `main`."""
    parser = argparse.ArgumentParser()
    parser.add_argument("config")
    config = ChildConfig(**json.loads(parser.parse_args().config))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)  # a killed supervisor leaves no orphans
    logging.basicConfig(level=config.log_level.upper(), format="%(levelname)s: %(message)s")
    main(config)


def run_loop(work: Coroutine[Any, Any, None]) -> None:
    """Run `work` on the event loop uvicorn would choose (uvloop where installed)."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop comes with uvicorn[standard]
        asyncio.run(work)
        return
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(work)
