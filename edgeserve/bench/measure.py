"""How numbers are produced, as pure functions: windows, the stability rule, percentiles.

The rules are perf_analyzer's so figures compare: a request counts in the window its response
ends in; a load level is stable when the last 3 windows agree within 10% on throughput and on
average latency (and none is empty); percentiles are nearest-rank on the sorted latencies.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

PERCENTILES = (50, 90, 95, 99)
STABILITY_WINDOWS = 3
STABILITY_TOLERANCE = 0.10
LATE_SEND_S = 0.002
"""An open-loop send more than this behind its schedule counts as late."""
LATE_WARN_FRACTION = 0.01
"""perf_analyzer warns when more than 1% of the sends were late: the client could not keep up."""

SERVER_PHASES = ("queue", "compute_input", "compute_infer", "compute_output")


@dataclass(frozen=True)
class Record:
    """One request as the client saw it (monotonic seconds)."""

    scheduled: float
    sent: float
    ended: float
    ok: bool
    items: int

    @property
    def latency(self) -> float:
        return self.ended - self.sent


@dataclass(frozen=True)
class Window:
    """The requests whose response ended inside [start, end)."""

    start: float
    end: float
    records: tuple[Record, ...]

    @property
    def duration(self) -> float:
        return self.end - self.start

    @property
    def successes(self) -> list[Record]:
        return [record for record in self.records if record.ok]

    @property
    def throughput(self) -> float:
        """Successful requests per second."""
        return len(self.successes) / self.duration if self.duration > 0 else 0.0

    @property
    def mean_latency(self) -> float:
        latencies = [record.latency for record in self.successes]
        return sum(latencies) / len(latencies) if latencies else 0.0


def percentile(sorted_values: Sequence[float], p: float) -> float:
    """Nearest rank on a sorted sequence, perf_analyzer's index: round(p/100 * (n - 1))."""
    if not sorted_values:
        return math.nan
    index = round(p / 100 * (len(sorted_values) - 1))
    return sorted_values[index]


def split_windows(records: Sequence[Record], boundaries: Sequence[float]) -> list[Window]:
    """Cut records into windows between consecutive boundaries by the time they ended."""
    windows = []
    for start, end in zip(boundaries, boundaries[1:], strict=False):
        inside = tuple(r for r in records if start <= r.ended < end)
        windows.append(Window(start, end, inside))
    return windows


def _within(values: Sequence[float], tolerance: float) -> bool:
    low, high = min(values), max(values)
    return low > 0 and high / low <= 1 + tolerance


def is_stable(
    windows: Sequence[Window],
    count: int = STABILITY_WINDOWS,
    tolerance: float = STABILITY_TOLERANCE,
) -> bool:
    """The last `count` windows agree within `tolerance` on throughput and mean latency."""
    if len(windows) < count:
        return False
    last = windows[-count:]
    return _within([w.throughput for w in last], tolerance) and _within(
        [w.mean_latency for w in last], tolerance
    )


@dataclass(frozen=True)
class ClientSummary:
    """The merged client-side figures of the measured windows (latencies in seconds)."""

    requests: int
    errors: int
    items: int
    duration_s: float
    throughput: float
    items_per_s: float
    latency_mean: float
    latency_std: float
    latency_percentiles: dict[int, float]
    late_fraction: float
    send_lag_p99: float


def summarize(windows: Sequence[Window]) -> ClientSummary:
    """Merge windows into one summary (perf_analyzer reports the merge of the stable ones)."""
    records = [record for window in windows for record in window.records]
    ok = [record for record in records if record.ok]
    latencies = sorted(record.latency for record in ok)
    lags = sorted(record.sent - record.scheduled for record in records)
    duration = sum(window.duration for window in windows)
    mean = sum(latencies) / len(latencies) if latencies else math.nan
    variance = sum((x - mean) ** 2 for x in latencies) / len(latencies) if latencies else math.nan
    items = sum(record.items for record in ok)
    return ClientSummary(
        requests=len(ok),
        errors=len(records) - len(ok),
        items=items,
        duration_s=duration,
        throughput=len(ok) / duration if duration > 0 else 0.0,
        items_per_s=items / duration if duration > 0 else 0.0,
        latency_mean=mean,
        latency_std=math.sqrt(variance),
        latency_percentiles={p: percentile(latencies, p) for p in PERCENTILES},
        late_fraction=sum(lag > LATE_SEND_S for lag in lags) / len(lags) if lags else 0.0,
        send_lag_p99=percentile(lags, 99) if lags else 0.0,
    )


@dataclass(frozen=True)
class ServerSummary:
    """Per-request server-side averages over the measured windows (seconds)."""

    requests: int
    inferences: int
    executions: int
    phases: dict[str, float]

    @property
    def mean_batch(self) -> float:
        return self.inferences / self.executions if self.executions else math.nan


def _model_stats(stats: Mapping[str, Any]) -> Mapping[str, Any]:
    return stats["model_stats"][0]  # type: ignore[no-any-return]


def server_delta(before: Mapping[str, Any], after: Mapping[str, Any]) -> ServerSummary:
    """Subtract two `/v2/models/{m}/stats` answers (Triton's statistics schema)."""
    old, new = _model_stats(before), _model_stats(after)
    phases = {}
    for phase in SERVER_PHASES:
        count = new["inference_stats"][phase]["count"] - old["inference_stats"][phase]["count"]
        ns = new["inference_stats"][phase]["ns"] - old["inference_stats"][phase]["ns"]
        phases[phase] = ns / count / 1e9 if count else math.nan
    return ServerSummary(
        requests=new["inference_stats"]["success"]["count"]
        - old["inference_stats"]["success"]["count"],
        inferences=new["inference_count"] - old["inference_count"],
        executions=new["execution_count"] - old["execution_count"],
        phases=phases,
    )
