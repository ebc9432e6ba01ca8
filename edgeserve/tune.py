"""`edgeserve tune SRC`: sweep the batching settings against a latency budget and keep the best.

Model Analyzer's method in short windows: every candidate (max_batch_size, preferred sizes,
max_queue_delay_ms, instances) is served from a scratch copy of the function and measured by
`edgeserve bench` at one closed-loop concurrency; the candidate with the most items/s whose p99
stays within the budget (and that failed no request) wins, and its settings are written into the
function's manifest: only the [batching] keys change, the rest of the file is kept as written.
"""

from __future__ import annotations

import itertools
import re
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgeserve.errors import ConfigError, EdgeserveError
from edgeserve.manifest import MANIFEST_NAME, load_manifest

PREFERRED_MODES = ("none", "pow2")


@dataclass(frozen=True)
class Candidate:
    max_batch_size: int
    preferred_batch_sizes: tuple[int, ...]
    max_queue_delay_ms: float
    instances: int

    def settings(self) -> dict[str, Any]:
        return {
            "max_batch_size": self.max_batch_size,
            "preferred_batch_sizes": list(self.preferred_batch_sizes),
            "max_queue_delay_ms": self.max_queue_delay_ms,
            "instances": self.instances,
        }


@dataclass(frozen=True)
class Trial:
    """What one candidate measured (p99 in ms; errors: failed requests, or -1: it did not serve)."""

    candidate: Candidate
    items_per_s: float
    p99_ms: float
    errors: int


@dataclass(frozen=True)
class TuneResult:
    trials: tuple[Trial, ...]
    best: Trial | None
    budget_ms: float
    written: Path | None


Measure = Callable[[Path, int, float], Trial]


def candidates(
    max_batch: Sequence[int],
    delays_ms: Sequence[float],
    instances: Sequence[int],
    preferred: Sequence[str] = PREFERRED_MODES,
) -> list[Candidate]:
    """The grid; `preferred` modes: "none" (batches close at max_batch_size) or "pow2"."""
    unknown = set(preferred) - set(PREFERRED_MODES)
    if (
        unknown
        or not all(max_batch)
        or min(max_batch, default=0) < 1
        or min(instances, default=0) < 1
    ):
        raise ConfigError(
            f"tune grid: expected max_batch >= 1, instances >= 1 and preferred in "
            f"{PREFERRED_MODES}, got {list(max_batch)}, {list(instances)}, {list(preferred)}"
        )
    grid = []
    for size, mode, delay, count in itertools.product(max_batch, preferred, delays_ms, instances):
        sizes = (
            tuple(2**k for k in range(1, size.bit_length()) if 2**k <= size)
            if mode == "pow2"
            else ()
        )
        grid.append(Candidate(size, sizes, float(delay), count))
    return list(dict.fromkeys(grid))  # pow2 of max_batch 1 equals none


def choose(trials: Sequence[Trial], budget_ms: float) -> Trial | None:
    """Most items/s among the trials within the budget with no failed request; then lower p99."""
    fit = [t for t in trials if t.errors == 0 and t.p99_ms <= budget_ms]
    return max(fit, key=lambda t: (t.items_per_s, -t.p99_ms), default=None)


def update_batching(text: str, settings: Mapping[str, Any]) -> str:
    """The manifest text with these [batching] keys set (replaced in place, or added)."""
    lines = text.splitlines()
    header = next((i for i, line in enumerate(lines) if line.strip() == "[batching]"), None)
    if header is None:
        lines += ["", "[batching]"]
        header = len(lines) - 1
    end = next(
        (i for i in range(header + 1, len(lines)) if lines[i].lstrip().startswith("[")), len(lines)
    )
    missing = dict(settings)
    for i in range(header + 1, end):
        key = re.match(r"\s*([A-Za-z_]+)\s*=", lines[i])
        if key and key.group(1) in missing:
            lines[i] = f"{key.group(1)} = {_toml(missing.pop(key.group(1)))}"
    while end > header + 1 and not lines[end - 1].strip():
        end -= 1
    lines[end:end] = [f"{key} = {_toml(value)}" for key, value in missing.items()]
    return "\n".join(lines) + "\n"


def _toml(value: Any) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(_toml(item) for item in value) + "]"
    if isinstance(value, float):
        return f"{value:g}" if value != int(value) else f"{value:.1f}"
    return str(value)


def tune(
    source: Path,
    *,
    budget_ms: float,
    grid: Sequence[Candidate],
    concurrency: int = 8,
    window_s: float = 1.0,
    write: bool = True,
    measure: Measure | None = None,
) -> TuneResult:
    """Measure every candidate, choose, and (with `write`) update `source`'s manifest."""
    if budget_ms <= 0 or concurrency < 1 or not grid:
        raise ConfigError("tune: expected a latency budget > 0 ms, concurrency >= 1, candidates")
    manifest_path = source / MANIFEST_NAME
    load_manifest(source)  # a broken manifest fails here, before any measuring
    run = measure or _bench
    trials = tuple(_trial(source, candidate, concurrency, window_s, run) for candidate in grid)
    best = choose(trials, budget_ms)
    written = None
    if best is not None and write:
        text = manifest_path.read_text(encoding="utf-8")
        manifest_path.write_text(update_batching(text, best.candidate.settings()), encoding="utf-8")
        written = manifest_path
    return TuneResult(trials, best, budget_ms, written)


def _trial(
    source: Path, candidate: Candidate, concurrency: int, window_s: float, run: Measure
) -> Trial:
    """Serve a scratch copy of the function with the candidate's settings and measure it."""
    with tempfile.TemporaryDirectory(prefix="edgeserve-tune-") as scratch:
        folder = Path(scratch) / source.resolve().name
        shutil.copytree(source, folder, ignore=shutil.ignore_patterns("build", "dist", ".*"))
        manifest = folder / MANIFEST_NAME
        text = update_batching(manifest.read_text(encoding="utf-8"), candidate.settings())
        manifest.write_text(text, encoding="utf-8")
        try:
            load_manifest(folder)
            trial = run(folder, concurrency, window_s)
        except EdgeserveError:
            return Trial(candidate, 0.0, float("inf"), -1)
    return Trial(candidate, trial.items_per_s, trial.p99_ms, trial.errors)


def _bench(folder: Path, concurrency: int, window_s: float) -> Trial:
    from edgeserve.bench import bench

    report = bench(str(folder), concurrency=(concurrency,), window_s=window_s, max_windows=3)
    client = report.results[0].client
    placeholder = Candidate(0, (), 0.0, 0)  # _trial puts the real candidate in
    return Trial(
        placeholder, client.items_per_s, client.latency_percentiles[99] * 1000, client.errors
    )
