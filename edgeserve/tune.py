"""`edgeserve tune SRC`: sweep the batching settings against a latency budget and keep the best.

Model Analyzer's method in short windows: every candidate (max_batch_size, preferred sizes,
max_queue_delay_ms, instances and, when asked, the inference processes per device) is built
from a scratch copy of the function into a scratch bundle (never the bundle cache, whose other
bundles two dozen candidates would evict) and measured by `edgeserve bench` at one closed-loop
concurrency; the candidate with the most items/s whose p99 stays within the budget (and that
failed no request) wins, and its settings are written into the function's manifest: only those
keys change ([batching], and [resources] processes_per_device), the rest of the file is kept as
written. Processes per device are worth a sweep on a GPU: two served a light model up to 1.6x
one under heavy load and a heavy one 0.84-0.91x, which `auto` cannot know before loading it.
"""

from __future__ import annotations

import itertools
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import tomlkit
from tomlkit.items import Array, Item, Table

from edgeserve.builder import plan_build, write_bundle
from edgeserve.dryrun import not_a_batch_axis
from edgeserve.errors import ConfigError, EdgeserveError
from edgeserve.manifest import MANIFEST_NAME, PerDeviceKind, load_manifest
from edgeserve.server import plan_layout
from edgeserve.signature import unbatchable

if TYPE_CHECKING:
    from rich.table import Table as RichTable

    from edgeserve.bench import LevelResult

PREFERRED_MODES = ("none", "pow2")


@dataclass(frozen=True)
class Candidate:
    """One setting of the sweep; max_batch_size 0: the model cannot batch, so only instances
    (and processes per device) are set, and no batch size is ever written for it."""

    max_batch_size: int
    preferred_batch_sizes: tuple[int, ...]
    max_queue_delay_ms: float
    instances: int
    processes_per_device: int | None = None  # None: the manifest's, not swept

    def settings(self) -> dict[str, Any]:
        """The [batching] keys."""
        if not self.max_batch_size:
            return {"instances": self.instances}
        return {
            "max_batch_size": self.max_batch_size,
            "preferred_batch_sizes": list(self.preferred_batch_sizes),
            "max_queue_delay_ms": self.max_queue_delay_ms,
            "instances": self.instances,
        }

    def sections(self, current: object = "auto", kind: str = "cpu") -> dict[str, dict[str, Any]]:
        """Every manifest key the candidate sets, by section. Its processes per device were
        measured on one `kind` of device: where the `current` setting counts by kind, the
        other kind's count stays (a sweep on a laptop must not undo a function's { gpu = 2 })."""
        sections = {"batching": self.settings()}
        count = self.processes_per_device
        if count is not None:
            value = (
                {**current.model_dump(), kind: count}
                if isinstance(current, PerDeviceKind)
                else count
            )
            sections["resources"] = {"processes_per_device": value}
        return sections

    def describe(self) -> str:
        return ", ".join(f"{k}={v}" for keys in self.sections().values() for k, v in keys.items())


@dataclass(frozen=True)
class Trial:
    """What one candidate measured (p99 in ms; errors: failed requests, or -1: it did not serve;
    failure: why, in the words the server or the build gave)."""

    candidate: Candidate
    items_per_s: float
    p99_ms: float
    errors: int
    failure: str = ""
    kind: str = "cpu"  # the kind of device inference ran on ("gpu", "cpu")


@dataclass(frozen=True)
class TuneResult:
    trials: tuple[Trial, ...]
    best: Trial | None
    budget_ms: float
    written: Path | None


Measure = Callable[[Path, int, float], Trial]
"""Measures a candidate's bundle folder at a concurrency, in windows of so many seconds."""


def candidates(
    max_batch: Sequence[int],
    delays_ms: Sequence[float],
    instances: Sequence[int],
    preferred: Sequence[str] = PREFERRED_MODES,
    per_device: Sequence[int | None] = (None,),
    batched: bool = True,
) -> list[Candidate]:
    """The grid; `preferred` modes: "none" (batches close at max_batch_size) or "pow2";
    `per_device`: inference processes per device (None: the manifest's); not `batched`: the
    model cannot batch, so instances and processes alone are swept."""
    unknown = set(preferred) - set(PREFERRED_MODES)
    if (
        unknown
        or not all(max_batch)
        or min(max_batch, default=0) < 1
        or min(instances, default=0) < 1
        or any(count is not None and count < 1 for count in per_device)
    ):
        raise ConfigError(
            f"tune grid: expected max_batch >= 1, instances >= 1, processes per device >= 1 "
            f"and preferred in {PREFERRED_MODES}, got {list(max_batch)}, {list(instances)}, "
            f"{list(per_device)}, {list(preferred)}"
        )
    if not batched:
        max_batch, preferred, delays_ms = [0], ["none"], [0.0]
    grid = []
    product = itertools.product(max_batch, preferred, delays_ms, instances, per_device)
    for size, mode, delay, count, processes in product:
        sizes = (
            tuple(2**k for k in range(1, size.bit_length()) if 2**k <= size)
            if mode == "pow2"
            else ()
        )
        grid.append(Candidate(size, sizes, float(delay), count, processes))
    return list(dict.fromkeys(grid))  # pow2 of max_batch 1 equals none


def unbatchable_model(source: Path) -> str:
    """What keeps the function's model from batching ("x [1, 16]: no dynamic first dim", or
    what a run showed of first dims all dynamic but no batch axis), or "". Without the run,
    tune measured such a model batched (each answer wrong, or failed) and wrote a
    max_batch_size that build then refused."""
    signature = plan_build(source).signature
    model = source / load_manifest(source).model.path
    return unbatchable(signature) or not_a_batch_axis(model, signature)


def choose(trials: Sequence[Trial], budget_ms: float) -> Trial | None:
    """Most items/s among the trials within the budget with no failed request; then lower p99."""
    fit = [t for t in trials if t.errors == 0 and t.p99_ms <= budget_ms]
    return max(fit, key=lambda t: (t.items_per_s, -t.p99_ms), default=None)


def update_sections(text: str, sections: Mapping[str, Mapping[str, Any]]) -> str:
    """The manifest text with these keys set ({section: {key: value}}); everything else
    (comments, layout, multi-line arrays, other keys and sections) is kept as written (tomlkit
    edits TOML round-trip)."""
    document = tomlkit.parse(text)
    for section, settings in sections.items():
        table = document.get(section)
        if table is None:
            table = tomlkit.table()
            document.add(section, table)
        last = list(table)[-1] if table else None
        for key, value in settings.items():
            if key in table:
                table[key] = _like(table[key], value)
            elif last is not None and isinstance(table, Table):
                # `add` would append after the blank lines and comments that precede the next
                # section header: insert right after the table's last key instead
                table.value._insert_after(last, key, _item(value))
                last = key
            else:
                table[key] = _item(value)
                last = key
    return tomlkit.dumps(document)


def _like(old: Item, value: Any) -> Item:
    """`value` as a TOML item wearing `old`'s inline comment and multi-line layout."""
    new = _item(value)
    new.trivia.comment_ws, new.trivia.comment = old.trivia.comment_ws, old.trivia.comment
    if isinstance(old, Array) and isinstance(new, Array) and "\n" in old.as_string():
        new.multiline(True)
    return new


def _item(value: Any) -> Item:
    """A TOML item; a mapping inline, as { gpu = 2 } is written (not a [section.key] table)."""
    if not isinstance(value, Mapping):
        return tomlkit.item(value)
    inline = tomlkit.inline_table()
    inline.update(value)
    return inline


def tune(
    source: Path,
    *,
    budget_ms: float,
    grid: Sequence[Candidate],
    concurrency: int = 8,
    window_s: float = 1.0,
    write: bool = True,
    measure: Measure | None = None,
    on_trial: Callable[[int, Candidate], None] | None = None,
) -> TuneResult:
    """Measure every candidate, choose, and (with `write`) update `source`'s manifest.

    `on_trial(index, candidate)` is told as each trial starts (the CLI's progress display).
    """
    if budget_ms <= 0 or concurrency < 1 or not grid:
        raise ConfigError("tune: expected a latency budget > 0 ms, concurrency >= 1, candidates")
    manifest_path = source / MANIFEST_NAME
    current = load_manifest(source).resources.processes_per_device  # a broken one fails here
    run = measure or _bench
    trials = []
    for index, candidate in enumerate(grid):
        if on_trial is not None:
            on_trial(index, candidate)
        trials.append(_trial(source, candidate, concurrency, window_s, run))
    best = choose(trials, budget_ms)
    written = None
    if best is not None and write:
        text = manifest_path.read_text(encoding="utf-8")
        sections = best.candidate.sections(current, best.kind)
        manifest_path.write_text(update_sections(text, sections), encoding="utf-8")
        written = manifest_path
    return TuneResult(tuple(trials), best, budget_ms, written)


def _trial(
    source: Path, candidate: Candidate, concurrency: int, window_s: float, run: Measure
) -> Trial:
    """Serve a scratch copy of the function with the candidate's settings and measure it.

    Its bundle is built beside the copy, not in the bundle cache: a sweep's two dozen
    candidates would evict the user's own bundles there, and none is of use after the sweep.
    """
    with tempfile.TemporaryDirectory(prefix="edgeserve-tune-") as scratch:
        folder = Path(scratch) / source.resolve().name
        shutil.copytree(source, folder, ignore=shutil.ignore_patterns("build", "dist", ".*"))
        manifest = folder / MANIFEST_NAME
        text = update_sections(manifest.read_text(encoding="utf-8"), candidate.sections())
        manifest.write_text(text, encoding="utf-8")
        try:
            bundle = write_bundle(plan_build(folder), Path(scratch) / "bundle")
            trial = run(bundle.root, concurrency, window_s)
            kind = plan_layout(bundle, None, None).kind
        except EdgeserveError as exc:
            return Trial(candidate, 0.0, float("inf"), -1, exc.message)
    return Trial(candidate, trial.items_per_s, trial.p99_ms, trial.errors, trial.failure, kind)


def _bench(bundle: Path, concurrency: int, window_s: float) -> Trial:
    from edgeserve.bench import bench

    report = bench(str(bundle), concurrency=(concurrency,), window_s=window_s, max_windows=3)
    result = report.results[0]
    client = result.client
    placeholder = Candidate(0, (), 0.0, 0)  # _trial puts the real candidate in
    p99_ms = client.latency_percentiles[99] * 1000
    # the level's items/s: /invoke samples leave the client no row count, the server has it
    return Trial(placeholder, result.items_per_s, p99_ms, client.errors, _reason(result))


def _reason(result: LevelResult) -> str:
    if not result.client.errors:
        return ""
    total = result.client.errors + result.client.requests
    return f"{result.client.errors} of {total} requests failed: {result.first_failure}"


def failure_reason(result: TuneResult) -> str:
    """Why no candidate won: every one failed (say why), or none kept p99 within the budget."""
    failed = [trial for trial in result.trials if trial.errors]
    if len(failed) == len(result.trials):
        return f"tune: every candidate failed; the first: {failed[0].failure}"
    return (
        f"tune: no candidate kept p99 within {result.budget_ms:g} ms without failures; "
        "raise --latency-budget-ms or lower --concurrency"
    )


def render_table(result: TuneResult, concurrency: int) -> RichTable:
    """The trials as a rich table, the chosen one marked (as bench.render_table does levels)."""
    from rich import box
    from rich.table import Table as RichTable
    from rich.text import Text

    title = f"edgeserve tune: c={concurrency}, p99 budget {result.budget_ms:g} ms"
    # no rules between columns, no padding at the edges: every header whole on 80 columns
    table = RichTable(title=title, box=box.SIMPLE_HEAD, collapse_padding=True, pad_edge=False)
    swept = any(trial.candidate.processes_per_device for trial in result.trials)
    columns = ["max_batch", "preferred", "delay ms", "instances"]
    columns += ["procs"] if swept else []  # inference processes per device
    for column in (*columns, "items/s", "p99 ms", ""):  # headers whole on 80 columns
        table.add_column(column, justify="right", min_width=len(column))
    for trial in result.trials:
        c = trial.candidate
        over = "over" if trial.p99_ms > result.budget_ms else ""
        mark = "chosen" if trial is result.best else over
        batches = c.max_batch_size > 0  # else the model cannot batch: no size, no delay
        cells = [str(c.max_batch_size) if batches else "-",
                 ",".join(map(str, c.preferred_batch_sizes)) or "-",
                 f"{c.max_queue_delay_ms:g}" if batches else "-", str(c.instances)]  # fmt: skip
        cells += [str(c.processes_per_device or "-")] if swept else []
        table.add_row(
            *cells, f"{trial.items_per_s:.0f}", f"{trial.p99_ms:.1f}",
            Text("failed") if trial.errors else Text(mark, style="green" if mark else ""),
        )  # fmt: skip
    return table
