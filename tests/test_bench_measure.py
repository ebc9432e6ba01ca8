"""The bench's arithmetic, table-driven: percentiles, stability, windows, summaries, deltas."""

from __future__ import annotations

import math
import statistics
from collections import Counter

import pytest

from edgeserve.bench.loadgen import poisson_intervals
from edgeserve.bench.measure import (
    Record,
    ServerSummary,
    Window,
    WindowLog,
    is_stable,
    percentile,
    server_delta,
    summarize,
)

HUNDRED = [float(x) for x in range(1, 101)]


@pytest.mark.parametrize(
    ("values", "p", "expected"),
    [
        (HUNDRED, 50, 51.0),  # index round(49.5) = 50, halves up as in perf_analyzer
        (HUNDRED, 90, 90.0),  # index round(89.1) = 89
        (HUNDRED, 95, 95.0),  # index round(94.05) = 94
        (HUNDRED, 99, 99.0),  # index round(98.01) = 98
        ([1.0, 2.0, 3.0, 4.0], 50, 3.0),  # index round(1.5) = 2
        ([7.0], 99, 7.0),
        ([1.0, 2.0], 0, 1.0),
        ([1.0, 2.0], 100, 2.0),
    ],
)
def test_percentile_is_perf_analyzers_nearest_rank(
    values: list[float], p: int, expected: float
) -> None:
    assert percentile(values, p) == expected


def test_percentile_of_nothing_is_nan() -> None:
    assert math.isnan(percentile([], 99))


def _window(count: int, latency: float, start: float = 0.0, duration: float = 1.0) -> Window:
    """`count` successful requests of `latency` s, all ending inside [start, start+duration)."""
    ends = [start + duration * (i + 0.5) / max(count, 1) for i in range(count)]
    records = tuple(Record(end - latency, end - latency, end, True, 1) for end in ends)
    return Window(start, start + duration, records)


@pytest.mark.parametrize(
    ("shape", "poisson", "stable"),
    [
        ([(100, 0.010), (100, 0.010)], False, False),  # fewer than 3 windows
        ([(100, 0.010)] * 3, False, True),
        ([(100, 0.010), (105, 0.010), (109, 0.010)], False, True),  # 9% apart
        ([(100, 0.010), (100, 0.010), (112, 0.010)], False, False),  # throughput 12% apart
        ([(100, 0.010), (100, 0.0105), (100, 0.0112)], False, False),  # latency 12% apart
        ([(100, 0.010), (0, 0.010), (100, 0.010)], False, False),  # an empty window
        ([(10, 0.050), (100, 0.010), (100, 0.010), (100, 0.010)], False, True),  # last 3 only
        ([(100, 0.010), (100, 0.010), (100, 0.010), (10, 0.050)], False, False),
        ([(100, 0.010), (100, 0.010), (125, 0.010)], False, False),
        ([(100, 0.010), (100, 0.010), (125, 0.010)], True, True),  # Poisson noise: 3/sqrt(100)
        ([(100, 0.010), (100, 0.010), (150, 0.010)], True, False),
    ],
)
def test_stability_rule(shape: list[tuple[int, float]], poisson: bool, stable: bool) -> None:
    windows = [_window(n, lat, start=i) for i, (n, lat) in enumerate(shape)]
    assert is_stable(windows, poisson=poisson) is stable


def _rec(ended: float, ok: bool = True, latency: float = 0.01, lag: float = 0.0) -> Record:
    sent = ended - latency
    return Record(sent - lag, sent, ended, ok, 2)


def test_window_log_cuts_what_ended_since_the_last_cut() -> None:
    records: list[Record] = []
    log = WindowLog(records, start=10.0)
    records += [_rec(10.2), _rec(10.9)]
    first = log.cut(11.0)
    records += [_rec(11.5), _rec(12.0)]  # 12.0 ends at the cut: it belongs to the next window
    second = log.cut(12.0)
    records.append(_rec(12.5))
    third = log.cut(13.5)
    assert [r.ended for r in first.records] == [10.2, 10.9]
    assert [r.ended for r in second.records] == [11.5]
    assert [r.ended for r in third.records] == [12.0, 12.5]
    assert [(w.start, w.end) for w in log.windows] == [(10.0, 11.0), (11.0, 12.0), (12.0, 13.5)]
    assert third.throughput == pytest.approx(2 / 1.5)


def test_summarize_merges_windows() -> None:
    latencies = [0.001 * x for x in range(1, 11)]  # 1..10 ms
    records = tuple(_rec(1.0 + i * 0.1, latency=lat) for i, lat in enumerate(latencies))
    failed = (_rec(1.95, ok=False), _rec(1.96, lag=0.005))
    summary = summarize([Window(1.0, 2.0, records[:5]), Window(2.0, 3.0, records[5:] + failed)])
    assert summary.requests == 11
    assert summary.errors == 1
    assert summary.items == 22
    assert summary.duration_s == 2.0
    assert summary.throughput == 5.5
    assert summary.items_per_s == 11.0
    all_latencies = sorted([*latencies, 0.01])
    assert summary.latency_mean == pytest.approx(statistics.fmean(all_latencies))
    assert summary.latency_std == pytest.approx(statistics.pstdev(all_latencies))
    assert summary.latency_percentiles == pytest.approx({50: 0.006, 90: 0.01, 95: 0.01, 99: 0.01})
    assert summary.late_fraction == pytest.approx(1 / 12)  # one send 5 ms behind schedule
    assert summary.send_lag_p99 == pytest.approx(0.005)


def _stats(count: int, inferences: int, executions: int, queue_ns: int, infer_ns: int) -> dict:
    """A `/v2/models/{m}/stats` answer in Triton's schema."""
    zero = {"count": 0, "ns": 0}
    return {
        "model_stats": [
            {
                "name": "m",
                "version": "1",
                "last_inference": 0,
                "inference_count": inferences,
                "execution_count": executions,
                "inference_stats": {
                    "success": {"count": count, "ns": count * 3_000_000},
                    "fail": zero,
                    "queue": {"count": count, "ns": queue_ns},
                    "compute_input": {"count": count, "ns": 0},
                    "compute_infer": {"count": count, "ns": infer_ns},
                    "compute_output": zero,
                    "cache_hit": zero,
                    "cache_miss": zero,
                },
                "batch_stats": [],
            }
        ]
    }


def test_server_delta_is_per_item_means_over_the_windows() -> None:
    before = _stats(100, 400, 50, 100_000_000, 200_000_000)
    after = _stats(300, 1200, 100, 300_000_000, 800_000_000)
    delta = server_delta(before, after)
    assert delta.requests == 200
    assert delta.inferences == 800
    assert delta.executions == 50
    assert delta.mean_batch == 16.0
    assert delta.phases["queue"] == pytest.approx(0.001)
    assert delta.phases["compute_infer"] == pytest.approx(0.003)
    assert delta.phases["compute_input"] == 0.0
    assert math.isnan(delta.phases["compute_output"])  # no counted output phase: unknown, not 0


def test_server_delta_with_nothing_executed() -> None:
    same = _stats(5, 5, 5, 10, 10)
    delta = server_delta(same, same)
    assert (delta.requests, delta.inferences, delta.executions) == (0, 0, 0)
    assert math.isnan(delta.mean_batch)
    assert isinstance(delta, ServerSummary)


def test_poisson_intervals_are_exponential_with_the_rate() -> None:
    gaps = [g for g, _ in zip(poisson_intervals(200.0, seed=7), range(40_000), strict=False)]
    mean = statistics.fmean(gaps)
    assert mean == pytest.approx(1 / 200, rel=0.02)
    assert statistics.pstdev(gaps) / mean == pytest.approx(1.0, rel=0.03)  # CV of an exponential
    # counts per 1 s bin: a Poisson process has variance == mean (dispersion index 1)
    bins = Counter(int(t) for t in _cumulative(gaps))
    counts = [bins[i] for i in range(int(sum(gaps)))]
    assert statistics.fmean(counts) == pytest.approx(200, rel=0.02)
    assert statistics.pvariance(counts) / statistics.fmean(counts) == pytest.approx(1.0, abs=0.35)


def test_poisson_intervals_repeat_with_the_seed() -> None:
    first = [g for g, _ in zip(poisson_intervals(50.0, seed=1), range(5), strict=False)]
    again = [g for g, _ in zip(poisson_intervals(50.0, seed=1), range(5), strict=False)]
    other = [g for g, _ in zip(poisson_intervals(50.0, seed=2), range(5), strict=False)]
    assert first == again
    assert first != other


def _cumulative(gaps: list[float]) -> list[float]:
    total, out = 0.0, []
    for gap in gaps:
        total += gap
        out.append(total)
    return out
