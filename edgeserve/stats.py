"""Per-model counters, read two ways: Triton's statistics extension and Prometheus text.

The batcher reports each batch (`batch_done`, its observer protocol); the runtime reports each
request (`request_done`) and each call of a handler hook (`handler_done`: what Triton has no
name for, and where a function with a handler may spend most of a request). Counters are
cumulative since start, as in Triton. A request refused at the door (503, queue full, its
body unread) is in neither `success` nor `fail`, as in Triton: its max_queue_size refusal is
the status that Enqueue hands back to the caller (core InferenceRequest::Run,
TRITONSERVER_ServerInferAsync), and no statistics are reported for it; nor is one whose body
could not be decoded (bad JSON, data that does not fill its shape), as Triton's HTTP frontend
reports none for a request it cannot parse. A request that reached the runtime and failed there
counts as a failure: an input outside the model's shapes, more rows than the queue can hold, a
queue full once its body was read, a timeout, a failed run (Triton's core counts its failures
before the backend too, since its failure reasons: OTHER, REJECTED).
Updates come from worker threads and the event loop, so one lock guards them; reading copies.

Prometheus names are Triton's (`nv_inference_count`, ...) so dashboards built for Triton work
unchanged. prometheus_client would append `_total` to anything typed `counter`, so the Triton
families are exposed untyped, exactly as named; `edgeserve_batch_size` is a real histogram.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import HistogramMetricFamily, Metric

from edgeserve.types import ComputeTimes

BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)


@dataclass
class Duration:
    """Triton's duration statistic: how many, and their summed nanoseconds."""

    count: int = 0
    ns: int = 0

    def add(self, count: int, ns: int) -> None:
        self.count += count
        self.ns += ns

    def to_json(self) -> dict[str, int]:
        return {"count": self.count, "ns": self.ns}


@dataclass
class Counters:
    """A copy of the counters at one instant (what `ModelStats.snapshot` returns)."""

    inference_count: int = 0
    execution_count: int = 0
    last_inference_ms: int = 0
    success: Duration = field(default_factory=Duration)
    fail: Duration = field(default_factory=Duration)
    queue: Duration = field(default_factory=Duration)
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)
    batches: dict[int, Phases] = field(default_factory=dict)
    hooks: dict[str, Duration] = field(default_factory=dict)  # handler hook -> its calls


HOOKS = ("preprocess", "postprocess")


@dataclass
class Phases:
    """The three compute phases of the executions of one batch size (Triton's batch_stats)."""

    input: Duration = field(default_factory=Duration)
    infer: Duration = field(default_factory=Duration)
    output: Duration = field(default_factory=Duration)

    def add(self, count: int, times: ComputeTimes) -> None:
        self.input.add(count, times.input_ns * count)
        self.infer.add(count, times.infer_ns * count)
        self.output.add(count, times.output_ns * count)

    def copy(self) -> Phases:
        return Phases(_copy(self.input), _copy(self.infer), _copy(self.output))


class ModelStats:
    """Counters for one model version; `registry` holds its Prometheus view."""

    def __init__(self, model: str, version: str) -> None:
        self.model = model
        self.version = version
        self._lock = threading.Lock()
        self._counters = Counters()
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Collector(self))

    def batch_done(
        self, size: int, queue_ns: Sequence[int], compute: ComputeTimes, ok: bool
    ) -> None:
        """One model execution of `size` rows, made of `len(queue_ns)` items (requests or parts).

        `queue_ns` holds each item's wait; each compute phase is attributed to every item of
        the execution, as Triton does, so the three phases always count alike (perf_analyzer
        refuses statistics where they do not). A failed batch counts no inferences.
        """
        with self._lock:
            counters = self._counters
            counters.queue.add(len(queue_ns), sum(queue_ns))
            if not ok:
                return
            counters.inference_count += size
            counters.execution_count += 1
            counters.last_inference_ms = time.time_ns() // 1_000_000
            items = len(queue_ns)
            counters.compute_input.add(items, compute.input_ns * items)
            counters.compute_infer.add(items, compute.infer_ns * items)
            counters.compute_output.add(items, compute.output_ns * items)
            phases = counters.batches.get(size)
            if phases is None:  # not setdefault: it would make a Phases every batch
                phases = counters.batches[size] = Phases()
            phases.add(1, compute)

    def request_started(self) -> None:
        """A request reached the runtime (counted only where requests in flight are shown)."""

    def request_done(self, ok: bool, duration_ns: int) -> None:
        """One request answered (`ok`) or failed, `duration_ns` after it arrived."""
        with self._lock:
            (self._counters.success if ok else self._counters.fail).add(1, duration_ns)

    def handler_done(self, hook: str, duration_ns: int) -> None:
        """One call of the handler's `hook` (HOOKS), `duration_ns` as the request waited for it."""
        with self._lock:
            self._counters.hooks.setdefault(hook, Duration()).add(1, duration_ns)

    def snapshot(self) -> Counters:
        with self._lock:
            counters = self._counters
            return Counters(
                counters.inference_count,
                counters.execution_count,
                counters.last_inference_ms,
                _copy(counters.success),
                _copy(counters.fail),
                _copy(counters.queue),
                _copy(counters.compute_input),
                _copy(counters.compute_infer),
                _copy(counters.compute_output),
                {size: phases.copy() for size, phases in counters.batches.items()},
                {hook: _copy(calls) for hook, calls in counters.hooks.items()},
            )

    def triton_stats(self) -> dict[str, Any]:
        """This model's entry of Triton's `model_stats` list (statistics extension)."""
        counters = self.snapshot()
        zero = Duration().to_json()
        return {
            "name": self.model,
            "version": self.version,
            "last_inference": counters.last_inference_ms,
            "inference_count": counters.inference_count,
            "execution_count": counters.execution_count,
            "inference_stats": {
                "success": counters.success.to_json(),
                "fail": counters.fail.to_json(),
                "queue": counters.queue.to_json(),
                "compute_input": counters.compute_input.to_json(),
                "compute_infer": counters.compute_infer.to_json(),
                "compute_output": counters.compute_output.to_json(),
                "cache_hit": zero,
                "cache_miss": zero,
            },
            "response_stats": {},
            "batch_stats": [
                {
                    "batch_size": size,
                    "compute_input": phases.input.to_json(),
                    "compute_infer": phases.infer.to_json(),
                    "compute_output": phases.output.to_json(),
                }
                for size, phases in sorted(counters.batches.items())
            ],
            "memory_usage": [],
        }


class _Collector:
    """Reads a ModelStats at scrape time: nothing is updated per request but the counters."""

    def __init__(self, stats: ModelStats) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        counters = self._stats.snapshot()
        labels = {"model": self._stats.model, "version": self._stats.version}
        untyped = (
            ("nv_inference_request_success", "successful requests", counters.success.count),
            ("nv_inference_request_failure", "failed requests", counters.fail.count),
            ("nv_inference_count", "inferences (batch rows) performed", counters.inference_count),
            ("nv_inference_exec_count", "model executions (batches)", counters.execution_count),
            (
                "nv_inference_request_duration_us",
                "cumulative request time",
                _us(counters.success.ns + counters.fail.ns),
            ),
            ("nv_inference_queue_duration_us", "cumulative queue time", _us(counters.queue.ns)),
            (
                "nv_inference_compute_input_duration_us",
                "cumulative time gathering batch inputs",
                _us(counters.compute_input.ns),
            ),
            (
                "nv_inference_compute_infer_duration_us",
                "cumulative compute time",
                _us(counters.compute_infer.ns),
            ),
            (
                "nv_inference_compute_output_duration_us",
                "cumulative time handing out outputs",
                _us(counters.compute_output.ns),
            ),
        )
        for name, doc, value in untyped:
            metric = Metric(name, f"Cumulative count of {doc} (Triton name)", "unknown")
            metric.add_sample(name, labels, value)
            yield metric
        yield _batch_histogram(counters, labels)
        yield from _hook_metrics(counters, labels)


def _hook_metrics(counters: Counters, labels: dict[str, str]) -> Iterator[Metric]:
    """Calls of each handler hook and their cumulative time, the thread hop included."""
    calls = Metric("edgeserve_handler_calls", "Cumulative calls of a handler hook", "unknown")
    spent = Metric(
        "edgeserve_handler_duration_us", "Cumulative time requests spent in a hook", "unknown"
    )
    for hook, duration in sorted(counters.hooks.items()):
        calls.add_sample("edgeserve_handler_calls", {**labels, "hook": hook}, duration.count)
        spent.add_sample(
            "edgeserve_handler_duration_us", {**labels, "hook": hook}, _us(duration.ns)
        )
    if counters.hooks:
        yield from (calls, spent)


def _batch_histogram(counters: Counters, labels: dict[str, str]) -> HistogramMetricFamily:
    executions = {size: phases.infer.count for size, phases in counters.batches.items()}
    buckets: list[tuple[str, float]] = []
    for bound in BATCH_SIZE_BUCKETS:
        buckets.append((str(bound), sum(n for size, n in executions.items() if size <= bound)))
    buckets.append(("+Inf", sum(executions.values())))
    histogram = HistogramMetricFamily(
        "edgeserve_batch_size", "Rows per model execution", labels=list(labels)
    )
    total_rows = sum(size * n for size, n in executions.items())
    histogram.add_metric(list(labels.values()), buckets, sum_value=total_rows)
    return histogram


def _copy(duration: Duration) -> Duration:
    return Duration(duration.count, duration.ns)


def _us(ns: int) -> float:
    return ns / 1000
