"""One load level at a time: run the load, cut windows until stable (or the cap), summarize."""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass
from typing import Any, Literal

from edgeserve.bench.loadgen import STOP_WAIT_S, Target, closed_loop, open_loop
from edgeserve.bench.measure import (
    STABILITY_WINDOWS,
    ClientSummary,
    ServerSummary,
    Window,
    WindowLog,
    is_stable,
    server_delta,
    summarize,
)
from edgeserve.bench.server import Control


@dataclass(frozen=True)
class Level:
    """A closed-loop concurrency or an open-loop (Poisson) request rate."""

    mode: Literal["concurrency", "request_rate"]
    value: float

    @property
    def label(self) -> str:
        if self.mode == "concurrency":
            return f"c={self.value:g}"
        return f"r={self.value:g}/s"


@dataclass(frozen=True)
class LevelResult:
    """What one level measured over its last (stable, or last-tried) windows."""

    level: Level
    stable: bool
    windows: int
    client: ClientSummary
    server: ServerSummary | None
    first_failure: str | None = None  # what the first failed request got ("HTTP 400: ...")

    @property
    def all_failed(self) -> bool:
        return self.client.errors > 0 and self.client.requests == 0

    @property
    def items_per_s(self) -> float:
        """Rows per second: counted by the client for v2 requests, by the server for /invoke
        (where the function's handler decides how many items a request becomes)."""
        if self.client.items or self.server is None or not self.client.duration_s:
            return self.client.items_per_s
        return self.server.inferences / self.client.duration_s


@dataclass(frozen=True)
class Settings:
    window_s: float = 2.0
    max_windows: int = 10
    seed: int = 0


async def measure_level(
    target: Target, control: Control, model: str, level: Level, settings: Settings
) -> LevelResult:
    """Load the server at `level` and cut windows until the stability rule holds."""
    target.records = []
    target.first_failure = None
    poisson = level.mode == "request_rate"
    stop = asyncio.Event()
    load = asyncio.create_task(_load(target, level, stop, settings.seed))
    start = time.monotonic()
    log = WindowLog(target.records, start)
    snapshots = [await control.stats(model)]
    while len(log.windows) < settings.max_windows and not load.done():
        await asyncio.sleep(start + settings.window_s * (len(log.windows) + 1) - time.monotonic())
        log.cut(time.monotonic())
        snapshots.append(await control.stats(model))
        if is_stable(log.windows, poisson=poisson) or _nothing_succeeded(log.windows):
            break
    stop.set()
    with contextlib.suppress(asyncio.TimeoutError):  # a hung server must not hang the bench
        await asyncio.wait_for(load, STOP_WAIT_S + settings.window_s)
    used = log.windows[-STABILITY_WINDOWS:]
    return LevelResult(
        level=level,
        stable=is_stable(log.windows, poisson=poisson),
        windows=len(log.windows),
        client=summarize(used),
        server=_server(snapshots[-len(used) - 1], snapshots[-1]),
        first_failure=target.first_failure,
    )


def _nothing_succeeded(windows: list[Window]) -> bool:
    """Every request so far failed: more windows would only repeat the failure."""
    return any(w.records for w in windows) and not any(w.successes for w in windows)


async def _load(target: Target, level: Level, stop: asyncio.Event, seed: int) -> None:
    if level.mode == "concurrency":
        await closed_loop(target, int(level.value), stop)
    else:
        await open_loop(target, level.value, stop, seed)


def _server(before: dict[str, Any] | None, after: dict[str, Any] | None) -> ServerSummary | None:
    if before is None or after is None:
        return None
    return server_delta(before, after)
