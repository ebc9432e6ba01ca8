"""One load level at a time: run the load, cut windows until stable (or the cap), summarize."""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass
from typing import Any, Literal

from edgeserve.bench.fleet import CpuMeter, Fleet, run_share, shares
from edgeserve.bench.loadgen import STOP_WAIT_S, Target
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
    client_cpu: float = 0.0  # the busiest load process, as a share of one core

    @property
    def all_failed(self) -> bool:
        return self.client.errors > 0 and self.client.requests == 0

    @property
    def items_per_s(self) -> float:
        """Rows per second: counted by the client for v2 requests, by the server where any
        request went to /invoke (whose handler decides how many items a request becomes; a
        mix, as init's two samples are, counted v2's rows alone: half the rate)."""
        if not self.client.uncounted or self.server is None or not self.client.duration_s:
            return self.client.items_per_s
        return self.server.inferences / self.client.duration_s


@dataclass(frozen=True)
class Settings:
    window_s: float = 2.0
    max_windows: int = 10
    seed: int = 0


async def measure_level(
    target: Target,
    control: Control,
    model: str,
    level: Level,
    settings: Settings,
    fleet: Fleet | None = None,
) -> LevelResult:
    """Load the server at `level` (from this process and the fleet's helpers, if any) and cut
    windows until the stability rule holds."""
    target.records = []
    target.first_failure = None
    poisson = level.mode == "request_rate"
    mine, *theirs = shares(level.mode, level.value, 1 + (fleet.size if fleet else 0), settings.seed)
    if fleet is not None:
        fleet.start(theirs)
    stop = asyncio.Event()
    load = asyncio.create_task(run_share(target, mine, stop))
    start = time.monotonic()
    log, meter, busiest = WindowLog(target.records, start), CpuMeter(), []
    snapshots = [await control.stats(model)]
    while len(log.windows) < settings.max_windows and not load.done():
        await asyncio.sleep(start + settings.window_s * (len(log.windows) + 1) - time.monotonic())
        end, cpu = time.monotonic(), [meter.read()]
        snapshots.append(await control.stats(model))
        if fleet is not None:
            records, helpers_cpu = await fleet.cut(end)
            log.merge(records)
            cpu += helpers_cpu
        log.cut(end)
        busiest.append(max(cpu))
        if is_stable(log.windows, poisson=poisson) or _nothing_succeeded(log.windows):
            break
    stop.set()
    if fleet is not None:
        await fleet.stop()
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
        client_cpu=max(busiest[-len(used) :], default=0.0),
    )


def _nothing_succeeded(windows: list[Window]) -> bool:
    """Every request so far failed: more windows would only repeat the failure."""
    return any(w.records for w in windows) and not any(w.successes for w in windows)


def _server(before: dict[str, Any] | None, after: dict[str, Any] | None) -> ServerSummary | None:
    if before is None or after is None:
        return None
    return server_delta(before, after)
