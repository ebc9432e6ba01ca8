"""`edgeserve bench`: perf_analyzer-style measurements of a function, from Python or the CLI.

    report = bench("functions/ocr", concurrency=(1, 8))
    report = bench("http://127.0.0.1:8080", request_rate=(100, 200), model="ocr")

A path (source dir or bundle) is served as a subprocess for the bench's duration; a URL is used
as is. docs/bench.md says how the numbers are produced and what the load generator can reach.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgeserve.bench.fleet import Fleet
from edgeserve.bench.inputs import (
    Body,
    ModelInputs,
    encode_infer,
    has_samples,
    read_samples,
    synthesize,
)
from edgeserve.bench.loadgen import Request, Target, encode_request
from edgeserve.bench.measure import STABILITY_WINDOWS
from edgeserve.bench.report import BenchReport, render_table, write_plot
from edgeserve.bench.server import Control, Endpoint, serving
from edgeserve.bench.sweep import Level, LevelResult, Settings, measure_level
from edgeserve.errors import ConfigError

__all__ = ["BenchReport", "Level", "LevelResult", "bench", "render_table", "write_plot"]


def bench(
    target: str,
    concurrency: Sequence[int] = (),
    request_rate: Sequence[float] = (),
    *,
    window_s: float = 2.0,
    max_windows: int = 10,
    protocol: str = "binary",
    inputs: str | None = None,
    shapes: Mapping[str, tuple[int, ...]] | None = None,
    batch_size: int = 1,
    model: str | None = None,
    seed: int = 0,
    ready_timeout_s: float = 120.0,
    on_level: Callable[[Level], None] | None = None,
    processes: int = 1,
    headers: Sequence[tuple[str, str]] = (),
) -> BenchReport:
    """Measure `target` at each concurrency, then each request rate (concurrency 1 if neither).

    `inputs`: None = the function's samples/ when it has some, else random tensors; "random";
    or a folder of samples. `shapes` resolve dynamic dims (batch dim excluded). `on_level` is
    told each level as it starts (the CLI's progress display). A level where every request
    fails ends the sweep early: its `first_failure` says what the server answered.
    `processes`: load-generator processes sharing each level (edgeserve.bench.fleet).
    `headers` go with every request (a token for a function with auth on).
    """
    if protocol not in ("binary", "json"):
        raise ConfigError(f"--protocol {protocol!r}: expected binary or json")
    _check_settings(window_s, max_windows, batch_size, processes)
    levels = [Level("concurrency", c) for c in concurrency]
    levels += [Level("request_rate", r) for r in request_rate]
    if any(level.value <= 0 for level in levels):
        raise ConfigError(f"bench: concurrency and request rate must be positive, got {levels}")
    plan = _Plan(protocol, inputs, dict(shapes or {}), batch_size, model, processes, dict(headers))
    settings = Settings(window_s, max_windows, seed)
    return _run(
        _bench(
            target, levels or [Level("concurrency", 1)], plan, settings, ready_timeout_s, on_level
        )
    )


def _check_settings(window_s: float, max_windows: int, batch_size: int, processes: int) -> None:
    """Refuse a setting the sweep cannot use, naming it and its value."""
    wrong = [
        f"{name} = {value}: expected {expected}"
        for name, value, bad, expected in (
            ("window_s", window_s, window_s <= 0, "> 0 seconds"),
            (
                "max_windows",
                max_windows,
                max_windows < STABILITY_WINDOWS,
                f">= {STABILITY_WINDOWS} (a level is stable when its last "
                f"{STABILITY_WINDOWS} windows agree)",
            ),
            ("batch_size", batch_size, batch_size < 1, ">= 1"),
            ("processes", processes, processes < 1, ">= 1"),
        )
        if bad
    ]
    if wrong:
        raise ConfigError(f"bench: {'; '.join(wrong)}")


def _run(main: Coroutine[Any, Any, BenchReport]) -> BenchReport:
    """On uvloop where installed (uvicorn[standard] brings it): the client then costs less CPU."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is there wherever uvicorn[standard] is
        return asyncio.run(main)
    return uvloop.run(main)


@dataclass(frozen=True)
class _Plan:
    """What to send: resolved against the served model once it is up."""

    protocol: str
    inputs: str | None
    shapes: dict[str, tuple[int, ...]]
    batch_size: int
    model: str | None
    processes: int
    headers: dict[str, str]

    @property
    def binary(self) -> bool:
        return self.protocol == "binary"

    def samples_dir(self, endpoint: Endpoint) -> Path | None:
        """--inputs DIR; else, unless --inputs random, the served folder's samples/ if any."""
        if self.inputs not in (None, "random"):
            folder = Path(str(self.inputs))
            if not folder.is_dir():
                raise ConfigError(f"--inputs {folder}: not a folder (expected samples or 'random')")
            return folder
        samples = endpoint.root / "samples" if endpoint.root else None
        if self.inputs is None and samples and has_samples(samples):
            return samples
        return None

    def bodies(self, model: ModelInputs, endpoint: Endpoint) -> tuple[str, list[Body]]:
        samples = self.samples_dir(endpoint)
        if samples is not None:
            if self.shapes or self.batch_size != 1:  # they size random inputs alone
                raise ConfigError(
                    f"--shape and --batch-size size random inputs, but this bench sends the "
                    f"samples in {samples}. Hint: add --inputs random"
                )
            return str(samples), read_samples(samples, model, self.binary)
        tensors = synthesize(model, self.shapes, self.batch_size)
        datatypes = {name: datatype for name, datatype, _ in model.inputs}
        items = self.batch_size if model.batched else 1
        return "random", [encode_infer(model.name, tensors, datatypes, self.binary, items)]


async def _bench(
    target: str,
    levels: list[Level],
    plan: _Plan,
    settings: Settings,
    ready_timeout_s: float,
    on_level: Callable[[Level], None] | None,
) -> BenchReport:
    with serving(target, ready_timeout_s, plan.headers) as endpoint:
        control = Control(endpoint, plan.headers)
        try:
            name = await control.model_name(plan.model)
            model = ModelInputs.from_server(
                await control.metadata(name), await control.config(name)
            )
            source, bodies = plan.bodies(model, endpoint)
            host = f"{endpoint.host}:{endpoint.port}"
            requests = [
                Request(
                    encode_request(host, b.path, {**plan.headers, **b.headers}, b.body), b.items
                )
                for b in bodies
            ]
            load = Target(endpoint.host, endpoint.port, requests)
            fleet = None
            if plan.processes > 1:
                fleet = Fleet(endpoint.host, endpoint.port, requests, plan.processes - 1)
            results = []
            try:
                for level in levels:
                    if on_level is not None:
                        on_level(level)
                    results.append(await measure_level(load, control, name, level, settings, fleet))
                    if results[-1].all_failed:
                        break  # the next levels would send the same failing requests
            finally:
                if fleet is not None:
                    fleet.close()
        finally:
            await control.close()
    routes = {"invoke" if b.path == "/invoke" else plan.protocol for b in bodies}
    protocol = "+".join(sorted(routes, key=lambda route: route != "invoke"))  # invoke+binary
    return BenchReport(
        target, endpoint.url, name, protocol, source, settings.window_s, tuple(results)
    )
