"""Serving efficiency with the load generator on cores of its own (needs 4 cores or more).

On the 2-core machine of RESULTS.md the load generator shares the server's cores. At the CRNN's
limit (~3,000 items/s at ~640 µs of CPU an item) the generator alone needs about a tenth of those
2 cores, so 0.9 of the limit is out of reach there whatever the server does. Here the limit and
the server get cores {0, 1} and the generator two others; the same server is also driven from
cores {0, 1}, in alternation, so that both ratios come from one run.

    .venv/bin/python benchmarks/isolated.py                  # CRNN, OpenVINO auto
    .venv/bin/python benchmarks/isolated.py --models crnn,resnet --rounds 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

from limit import measure_limit  # noqa: E402
from load import measure, request_for  # noqa: E402
from models import BENCH_SHAPES  # noqa: E402
from run import INPUT_NAMES, SATURATION, WINDOW_SCALE, Settings, function  # noqa: E402
from servers import start_edgeserve  # noqa: E402

SERVER_CORES = {0, 1}
CONCURRENCY = max(SATURATION)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="crnn")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--work", type=Path, default=HERE / ".work")
    args = parser.parse_args()
    cores = sorted(os.sched_getaffinity(0))
    own = set(cores[2:4])
    if len(cores) < 4 or not set(cores) >= SERVER_CORES:
        sys.exit(f"needs cores 0 and 1 and two more; this process may use {cores}")
    settings = Settings(2.0, 0.5, args.rounds, 0.6, args.work)
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} cores")
    for model in args.models.split(","):
        report(model, settings, own)


def report(model: str, settings: Settings, generator_cores: set[int]) -> None:
    folder = function(model, "ov", settings, backend="openvino", precision="auto", delay_ms=2.0)
    os.sched_setaffinity(0, SERVER_CORES)  # the limit, and the server spawned below, get 0 and 1
    scale = WINDOW_SCALE.get(model, 1.0)
    shape = BENCH_SHAPES[model]
    limit = measure_limit(
        model, folder / "model.onnx", shape, "openvino", "auto", settings.limit_window_s * scale
    )
    server = start_edgeserve("edgeserve (openvino auto)", folder, "openvino", settings.work)
    placements = {"own cores": generator_cores, "the server's cores": SERVER_CORES}
    rates: dict[str, list[float]] = {name: [] for name in placements}
    try:
        server.wait_ready()
        request = request_for(model, INPUT_NAMES[model], shape, server.port)
        for _ in range(settings.rounds):
            for name, cores in placements.items():
                os.sched_setaffinity(0, cores)
                sample = measure(
                    server.port,
                    request,
                    concurrency=CONCURRENCY,
                    window_s=settings.window_s * scale,
                    warmup_s=settings.warmup_s * scale,
                )
                rates[name].append(sample.items_per_s)
    finally:
        server.stop()
    best_size, best = limit.best
    print(f"\n{model}: limit (openvino auto, cores 0-1) {best:.0f} items/s at batch {best_size}")
    print(f"| load generator on | edgeserve items/s at c={CONCURRENCY} (median) | / limit |")
    print("|---|---|---|")
    for name, runs in rates.items():
        served = statistics.median(runs)
        each = ", ".join(f"{r:.0f}" for r in runs)
        print(f"| {name} | {served:.0f} ({each}) | {served / best:.2f} |")


if __name__ == "__main__":
    main()
