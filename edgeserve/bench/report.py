"""A bench's results, and their three forms: a rich table, JSON, and a throughput/p99 plot."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich import box
from rich.table import Table

from edgeserve.bench.fleet import SATURATED
from edgeserve.bench.measure import (
    LATE_WARN_FRACTION,
    PERCENTILES,
    SERVER_PHASES,
    STABILITY_TOLERANCE,
    STABILITY_WINDOWS,
    ServerSummary,
)
from edgeserve.bench.sweep import LevelResult
from edgeserve.errors import ConfigError

SERIES = (
    ("concurrency", "o-", "closed loop (concurrency)"),
    ("request_rate", "s--", "open loop (Poisson rate)"),
)


@dataclass(frozen=True)
class BenchReport:
    """Everything one `bench` run measured, level by level."""

    target: str
    url: str
    model: str
    protocol: str
    inputs: str
    window_s: float
    results: tuple[LevelResult, ...]

    @property
    def warnings(self) -> list[str]:
        """perf_analyzer's two warnings (an unstable level, a client that fell behind), and a
        load process that was itself the limit (failed requests are `failures`)."""
        notes = []
        for result in self.results:
            label = result.level.label
            if not result.stable and not result.all_failed:  # failures are said apart
                notes.append(
                    f"{label}: unstable after {result.windows} windows (figures of the last "
                    f"{STABILITY_WINDOWS}, whose throughput or mean latency differ by more than "
                    f"{STABILITY_TOLERANCE:.0%}). Hint: raise --max-windows, or --window-s on a "
                    "noisy machine"
                )
            if result.client.late_fraction > LATE_WARN_FRACTION:
                notes.append(
                    f"{label}: {result.client.late_fraction:.1%} of sends were late (send lag p99 "
                    f"{_ms(result.client.send_lag_p99)} ms): the client could not keep up"
                )
            if result.client_cpu >= SATURATED:
                notes.append(
                    f"{label}: a load process was busy {result.client_cpu:.0%} of a core: "
                    "the load generator, not the server, may be the limit (try --processes)"
                )
        return notes

    @property
    def failures(self) -> list[str]:
        """One line per level where a request failed, with what the first one got."""
        return [_failures(result) for result in self.results if result.client.errors]

    def to_json(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "url": self.url,
            "model": self.model,
            "protocol": self.protocol,
            "inputs": self.inputs,
            "window_s": self.window_s,
            "levels": [_level_json(result) for result in self.results],
            "warnings": self.warnings,
            "failures": self.failures,
        }


def _failures(result: LevelResult) -> str:
    client = result.client
    total = client.errors + client.requests
    first = f"; the first got {result.first_failure}" if result.first_failure else ""
    return f"{result.level.label}: {client.errors} of {total} requests failed{first}"


def _ms(seconds: float) -> float | None:
    return None if math.isnan(seconds) else round(seconds * 1e3, 3)


def _level_json(result: LevelResult) -> dict[str, Any]:
    client, server = result.client, result.server
    latency = {f"p{p}": _ms(client.latency_percentiles[p]) for p in PERCENTILES}
    return {
        "mode": result.level.mode,
        "value": result.level.value,
        "stable": result.stable,
        "windows": result.windows,
        "requests": client.requests,
        "errors": client.errors,
        "first_failure": result.first_failure,
        "items": client.items,
        "duration_s": round(client.duration_s, 3),
        "throughput_rps": round(client.throughput, 2),
        "items_per_s": round(result.items_per_s, 2),
        "latency_ms": {"avg": _ms(client.latency_mean), "std": _ms(client.latency_std), **latency},
        "late_fraction": round(client.late_fraction, 4),
        "send_lag_p99_ms": _ms(client.send_lag_p99),
        "client_cpu": round(result.client_cpu, 3),
        "server": None if server is None else _server_json(server),
    }


def _server_json(server: ServerSummary) -> dict[str, Any]:
    return {
        "requests": server.requests,
        "inferences": server.inferences,
        "executions": server.executions,
        "mean_batch": None if math.isnan(server.mean_batch) else round(server.mean_batch, 2),
        "ms": {phase: _ms(server.phases[phase]) for phase in SERVER_PHASES},
    }


def _cell(value: float | None, digits: int = 2) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.{digits}f}"


def render_table(report: BenchReport) -> Table:
    """One row per level: throughput, client latency percentiles, the server's split (ms).
    Failed requests and late sends are in `warnings`, printed under the table."""
    table = Table(
        title=f"edgeserve bench {report.model} ({report.protocol}, latencies in ms)",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        padding=(0, 0, 0, 1),  # one space between columns: twelve fit in 80 characters
    )
    for name in ("level", "ok", "req/s", "item/s", "p50", "p90", "p95", "p99"):
        table.add_column(name, justify="left" if name == "level" else "right")
    for name in ("queue", "infer", "batch"):
        table.add_column(name, justify="right")
    for result in report.results:
        table.add_row(*_row(result))
    return table


def _row(result: LevelResult) -> list[str]:
    client, server = result.client, result.server
    phases = server.phases if server else {}
    return [
        result.level.label,
        "yes" if result.stable else "[yellow]no[/]",
        _cell(client.throughput, 1),
        _cell(result.items_per_s, 1),
        *(_cell(client.latency_percentiles[p] * 1e3) for p in PERCENTILES),
        _cell(phases.get("queue", math.nan) * 1e3),
        _cell(phases.get("compute_infer", math.nan) * 1e3),
        _cell(server.mean_batch if server else None, 1),
    ]


def write_plot(report: BenchReport, path: Path) -> Path:
    """Throughput (x) against p99 latency (y), one annotated point per level."""
    try:
        import matplotlib
    except ImportError:
        raise ConfigError(
            "the bench plot needs matplotlib; Hint: pip install 'edgeserve[bench]'"
        ) from None

    matplotlib.use("Agg")
    from matplotlib import pyplot

    figure, axes = pyplot.subplots(figsize=(7, 4.5), dpi=120)
    for mode, marker, name in SERIES:
        points = _points([r for r in report.results if r.level.mode == mode])
        if points:
            axes.plot([x for _, x, _ in points], [y for *_, y in points], marker, label=name)
        for label, x, y in points:
            axes.annotate(label, (x, y), textcoords="offset points", xytext=(5, 5))
    axes.set_xlabel("throughput (requests/s)")
    axes.set_ylabel("p99 latency (ms)")
    axes.set_title(f"edgeserve bench: {report.model} ({report.protocol})")
    axes.grid(True, alpha=0.3)
    points = _points(list(report.results))
    # from zero, with room right and above for the labels of the outermost points
    axes.set_xlim(0, max((x for _, x, _ in points), default=0) * 1.2 or 1)
    axes.set_ylim(0, max((y for *_, y in points), default=0) * 1.25 or 1)
    axes.legend(loc="best")
    figure.tight_layout()
    figure.savefig(path)
    pyplot.close(figure)
    return path


def _points(results: list[LevelResult]) -> list[tuple[str, float, float]]:
    """(label, requests/s, p99 ms) of the levels that had successes to measure."""
    return [
        (r.level.label, r.client.throughput, r.client.latency_percentiles[99] * 1e3)
        for r in results
        if r.client.requests
    ]
