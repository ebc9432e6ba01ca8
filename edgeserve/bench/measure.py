"""How numbers are produced, as pure functions: windows, the stability rule, percentiles.

The rules are perf_analyzer's so figures compare: a request counts in the window its response
ends in; a load level is stable when the last 3 windows agree within 10% on throughput and on
average latency (and none is empty); percentiles are nearest-rank on the sorted latencies.
One addition: under Poisson arrivals the throughput test allows for the arrivals' own noise.
"""

from __future__ import annotations

import functools
import itertools
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

    @functools.cached_property
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
    """Nearest rank on a sorted sequence, perf_analyzer's index: round(p/100 * (n - 1)),
    rounding halves up as C++ does (Python's round() would round them to even)."""
    if not sorted_values:
        return math.nan
    index = math.floor(p / 100 * (len(sorted_values) - 1) + 0.5)
    return sorted_values[index]


class WindowLog:
    """Cuts a growing list of records, appended as responses end, into consecutive windows.

    Records arrive in completion order on one event loop, so a window is simply what was
    appended since the previous cut; a record ending at or after the cut waits for the next.
    """

    def __init__(self, records: list[Record], start: float) -> None:
        self._records = records
        self._consumed = 0
        self._start = start
        self.windows: list[Window] = []

    def merge(self, records: Sequence[Record]) -> None:
        """Add records from other load processes, keeping the uncut ones in completion order."""
        self._records.extend(records)
        tail = sorted(self._records[self._consumed :], key=lambda record: record.ended)
        self._records[self._consumed :] = tail

    def cut(self, end: float) -> Window:
        fresh = self._records[self._consumed :]
        inside = tuple(itertools.takewhile(lambda record: record.ended < end, fresh))
        self._consumed += len(inside)
        window = Window(self._start, end, inside)
        self._start = end
        self.windows.append(window)
        return window


def _within(values: Sequence[float], tolerance: float) -> bool:
    low, high = min(values), max(values)
    return low > 0 and high / low <= 1 + tolerance


def is_stable(
    windows: Sequence[Window],
    count: int = STABILITY_WINDOWS,
    tolerance: float = STABILITY_TOLERANCE,
    poisson: bool = False,
) -> bool:
    """The last `count` windows agree within `tolerance` on throughput and mean latency.

    Under Poisson arrivals a window's request count itself varies by 1/sqrt(n), so `poisson`
    widens the throughput test by three such deviations of the smallest window.
    """
    if len(windows) < count:
        return False
    last = windows[-count:]
    smallest = min(len(w.successes) for w in last)
    if smallest == 0:
        return False
    noise = 3 / math.sqrt(smallest) if poisson else 0.0
    return _within([w.throughput for w in last], tolerance + noise) and _within(
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
    uncounted: int = 0  # ok requests whose rows only the server counts (/invoke's)


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
        uncounted=sum(record.items == 0 for record in ok),
    )


@dataclass(frozen=True)
class ServerSummary:
    """Server-side figures over the measured windows: counts, and each phase's mean duration
    (seconds) per queued item, as the server counts them (a request, or one of its parts)."""

    requests: int
    inferences: int
    executions: int
    phases: dict[str, float]

    @property
    def mean_batch(self) -> float:
        return self.inferences / self.executions if self.executions else math.nan


def _model_stats(stats: Mapping[str, Any]) -> Mapping[str, Any]:
    return stats["model_stats"][0]


def server_delta(before: Mapping[str, Any], after: Mapping[str, Any]) -> ServerSummary:
    """Subtract two `/v2/models/{m}/stats` answers (Triton's statistics schema)."""
    old, new = _model_stats(before), _model_stats(after)

    def delta(phase: str, key: str) -> int:
        absent = {"count": 0, "ns": 0}
        return int(
            new["inference_stats"].get(phase, absent)[key]
            - old["inference_stats"].get(phase, absent)[key]
        )

    phases = {}
    for phase in SERVER_PHASES:
        count = delta(phase, "count")
        phases[phase] = delta(phase, "ns") / count / 1e9 if count else math.nan
    return ServerSummary(
        requests=delta("success", "count"),
        inferences=new["inference_count"] - old["inference_count"],
        executions=new["execution_count"] - old["execution_count"],
        phases=phases,
    )
