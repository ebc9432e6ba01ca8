"""`make bench`: the limit, the floor, Triton and edgeserve on three models, in ONE run.

    .venv/bin/python benchmarks/run.py                 # the full suite (~8 min on 2 cores)
    .venv/bin/python benchmarks/run.py --quick         # tiny windows: does everything run?

Servers run side by side and are measured in alternation (A B C A B C ...), rounds are combined
by their median; every server gets the same load generator (edgeserve.bench.loadgen) and the
same binary requests. Results go to benchmarks/results.json and the measured section of
benchmarks/RESULTS.md (the notes around it are kept).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

from limit import measure_limit, output_difference  # noqa: E402
from load import Sample, measure, median_sample, request_for  # noqa: E402
from models import BENCH_SHAPES, MAX_BATCH, write_function  # noqa: E402
from overload import as_json as overload_json  # noqa: E402
from overload import run as overload_run  # noqa: E402
from report import write_results  # noqa: E402
from servers import Server, start_edgeserve, start_floor, start_triton, triton_available  # noqa: E402

from tests.slo_simulation import capacity, fixed, simulate, with_slo  # noqa: E402

INPUT_NAMES = {"resnet": "image", "mlp": "x", "crnn": "image"}
WINDOW_SCALE = {"resnet": 2.0}  # ~30 items/s on ORT: a window must hold a few batches of 32
CONCURRENCY = (1, 4, 16, 64)
POISSON_RATE = {"resnet": 20.0, "mlp": 1500.0, "crnn": 150.0}  # a middling open-loop load, items/s
SATURATION = (16, 64)
DELAY_US = 2000  # Triton's and edgeserve's max_queue_delay: the same 2 ms
IDLE_S = 5.0
SEVERAL = ("resnet", "crnn")  # the models of the efficiency target
ITEMS_PER_REQUEST = 8
SLO_MODEL = "crnn"
SLO_MS = 50.0
FIXED_DELAYS_MS = (0.0, 2.0, 10.0)
RATE_SHARES = (0.3, 0.6, 0.9, 1.2)
THREADING = {  # label -> backend, manifest: how 2 cores are best split
    "ort: 1 instance x 2 intra-op threads": ("onnxruntime", {"threads": 0, "instances": 1}),
    "ort: 2 instances x 1 thread": ("onnxruntime", {"threads": 1, "instances": 2}),
    "openvino auto: 1 instance, 1 stream (LATENCY)": (
        "openvino",
        {"precision": "auto", "instances": 1},
    ),
    "openvino auto: 2 instances, 2 streams (THROUGHPUT)": (
        "openvino",
        {"precision": "auto", "instances": 2},
    ),
}


@dataclasses.dataclass
class Settings:
    window_s: float
    warmup_s: float
    rounds: int
    limit_window_s: float
    work: Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny windows, one round")
    parser.add_argument("--models", default="resnet,mlp,crnn")
    parser.add_argument("--work", type=Path, default=HERE / ".work")
    args = parser.parse_args()
    settings = (
        Settings(0.5, 0.2, 1, 0.1, args.work)
        if args.quick
        else Settings(2.0, 0.5, 2, 0.6, args.work)
    )
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    models = args.models.split(",")
    results: dict[str, Any] = {
        "date": started,
        "settings": dataclasses.asdict(settings) | {"work": str(args.work)},
    }
    results["triton"] = triton_available()
    results["limit"], results["precision"] = limits(models, settings)
    results["serving"], results["memory"], results["several_items"] = {}, {}, {}
    for model in models:
        table, memory, several = serving(model, settings, results["triton"])
        results["serving"][model], results["memory"][model] = table, memory
        if several is not None:
            results["several_items"][model] = several
    results["threading"] = {m: threading(m, settings) for m in models if m != "mlp"}
    if SLO_MODEL in models:
        results["slo"] = slo_comparison(results["serving"][SLO_MODEL], settings)
    if "crnn" in models:  # 256 connections against a small queue (issue 12)
        rows = overload_run("crnn", ["auto"], settings.window_s * 2, settings.warmup_s * 2)
        results["overload"] = overload_json(rows)
    results["simulation"] = simulation()
    results["coldstart"] = coldstart(settings)
    results["command"] = " ".join([".venv/bin/python benchmarks/run.py", *sys.argv[1:]])
    (HERE / "results.json").write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    write_results(results, HERE / "RESULTS.md")
    print(f"wrote {HERE / 'RESULTS.md'}")


def function(model: str, variant: str, settings: Settings, **manifest: Any) -> Path:
    """A function folder for `model`; the model file is made once and shared by the variants."""
    folder = settings.work / f"{model}-{variant}"
    shared = settings.work / f"{model}.onnx"
    if not shared.exists():
        write_function(model, settings.work / "_make" / model)
        shutil.move(settings.work / "_make" / model / "model.onnx", shared)
    folder.mkdir(parents=True, exist_ok=True)
    if not (folder / "model.onnx").exists():
        shutil.copy(shared, folder / "model.onnx")
    return write_function(model, folder, **manifest)


def limits(models: list[str], settings: Settings) -> tuple[list[dict[str, Any]], dict[str, float]]:
    rows, precision = [], {}
    for model in models:
        path = function(model, "ort", settings).joinpath("model.onnx")
        for backend, mode in (("onnxruntime", "fp32"), ("openvino", "auto"), ("openvino", "fp32")):
            row = measure_limit(
                model, path, BENCH_SHAPES[model], backend, mode, settings.limit_window_s
            )
            rows.append(dataclasses.asdict(row) | {"best": row.best})
            print(
                f"limit {model} {backend}/{mode}: {row.best[1]:.0f} items/s at b={row.best[0]}",
                flush=True,
            )
        precision[model] = output_difference(path, BENCH_SHAPES[model])
    return rows, precision


def serving(
    model: str, settings: Settings, triton_missing: str | None
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any] | None]:
    """Floor, Triton (ORT), edgeserve (ORT) at every level; edgeserve (OpenVINO) at saturation,
    and with requests of several items (`several_items`, not counted in the targets)."""
    logs = settings.work / "logs"
    ort = function(model, "ort", settings, delay_ms=DELAY_US / 1000)
    ov = function(
        model, "ov", settings, backend="openvino", precision="auto", delay_ms=DELAY_US / 1000
    )
    servers = [start_floor("floor (ort)", ort / "model.onnx", model, "onnxruntime", "fp32", logs)]
    if triton_missing is None:
        servers.append(start_triton("triton (ort)", ort / "model.onnx", model, DELAY_US, logs))
    servers.append(start_edgeserve("edgeserve (ort)", ort, "onnxruntime", logs))
    servers.append(start_edgeserve("edgeserve (openvino auto)", ov, "openvino", logs))
    try:
        for server in servers:
            server.wait_ready()
        table = alternate(model, servers, settings)
        several = several_items(model, servers[-1], settings) if model in SEVERAL else None
        time.sleep(IDLE_S)  # what a server keeps once idle (edgeserve trims after ~2-4 s idle)
        memory = {s.label: s.rss_mb() for s in servers if "triton" not in s.label}
    finally:
        for server in servers:
            server.stop()
    memory["backend alone (ort)"] = _footprint(
        ["backend", str(ort / "model.onnx"), "onnxruntime", "fp32", str(MAX_BATCH)]
    )["rss_mb"]
    memory["backend alone (openvino auto)"] = _footprint(
        ["backend", str(ov / "model.onnx"), "openvino", "auto", str(MAX_BATCH)]
    )["rss_mb"]
    return table, memory, several


def several_items(model: str, server: Server, settings: Settings) -> dict[str, Any]:
    """The same server at c=16 when each request carries ITEMS_PER_REQUEST items: what serving
    costs per item once a request's own cost is shared."""
    request = request_for(
        model, INPUT_NAMES[model], BENCH_SHAPES[model], server.port, ITEMS_PER_REQUEST
    )
    scale = WINDOW_SCALE.get(model, 1.0)
    runs = [
        measure(
            server.port,
            request,
            concurrency=16,
            window_s=settings.window_s * scale,
            warmup_s=settings.warmup_s * scale,
            pid=server.process.pid,
        )
        for _ in range(settings.rounds)
    ]
    sample = median_sample(runs)
    print(f"{model} c=16, {ITEMS_PER_REQUEST} items a request: {sample.items_per_s:.0f}/s")
    return {"items_per_request": ITEMS_PER_REQUEST} | dataclasses.asdict(sample)


def alternate(model: str, servers: list[Server], settings: Settings) -> dict[str, Any]:
    """Rounds of: each level, each server in turn (A B C, A B C); medians over rounds."""
    samples: dict[tuple[str, str], list[Sample]] = {}
    scale = WINDOW_SCALE.get(model, 1.0)
    levels = [f"c={c}" for c in CONCURRENCY] + [f"r={POISSON_RATE[model]:g}/s"]
    for _ in range(settings.rounds):
        for level in levels:
            for server in servers:
                if "openvino" in server.label and level not in {f"c={c}" for c in SATURATION}:
                    continue
                request = request_for(model, INPUT_NAMES[model], BENCH_SHAPES[model], server.port)
                load = (
                    {"concurrency": int(level[2:])}
                    if level.startswith("c=")
                    else {"rate": POISSON_RATE[model]}
                )
                sample = measure(
                    server.port,
                    request,
                    window_s=settings.window_s * scale,
                    warmup_s=settings.warmup_s * scale,
                    pid=server.process.pid,
                    **load,  # type: ignore[arg-type]
                )
                samples.setdefault((server.label, level), []).append(sample)
                print(
                    f"{model} {level} {server.label}: {sample.items_per_s:.0f}/s "
                    f"p50 {sample.p50_ms:.2f} p99 {sample.p99_ms:.2f}",
                    flush=True,
                )
    table: dict[str, Any] = {}
    for (label, level), runs in samples.items():
        table.setdefault(label, {})[level] = dataclasses.asdict(median_sample(runs))
    return table


def threading(model: str, settings: Settings) -> dict[str, Any]:
    """edgeserve at c=16 with the 2 cores split differently between instances and threads."""
    servers = [
        start_edgeserve(
            label,
            function(
                model, f"thr{i}", settings, backend=backend, delay_ms=DELAY_US / 1000, **manifest
            ),
            backend,
            settings.work / "logs",
        )
        for i, (label, (backend, manifest)) in enumerate(THREADING.items())
    ]
    samples: dict[str, list[Sample]] = {}
    try:
        for server in servers:
            server.wait_ready()
        for _ in range(settings.rounds):
            for server in servers:
                request = request_for(model, INPUT_NAMES[model], BENCH_SHAPES[model], server.port)
                sample = measure(
                    server.port,
                    request,
                    concurrency=16,
                    window_s=settings.window_s,
                    warmup_s=settings.warmup_s,
                )
                samples.setdefault(server.label, []).append(sample)
                print(
                    f"threading {model} {server.label}: "
                    f"{sample.items_per_s:.0f}/s p99 {sample.p99_ms:.1f}",
                    flush=True,
                )
    finally:
        for server in servers:
            server.stop()
    return {label: dataclasses.asdict(median_sample(runs)) for label, runs in samples.items()}


def slo_comparison(serving_table: dict[str, Any], settings: Settings) -> dict[str, Any]:
    """Poisson load at shares of capacity: fixed max_queue_delay settings against the SLO."""
    logs = settings.work / "logs"
    capacity = max(serving_table["edgeserve (ort)"][f"c={c}"]["items_per_s"] for c in SATURATION)
    configs = {f"fixed {d:g} ms": {"delay_ms": d} for d in FIXED_DELAYS_MS}
    configs[f"slo {SLO_MS:g} ms"] = {"delay_ms": 2.0, "slo_ms": SLO_MS}
    servers = [
        start_edgeserve(
            label, function(SLO_MODEL, f"slo{i}", settings, **manifest), "onnxruntime", logs
        )
        for i, (label, manifest) in enumerate(configs.items())
    ]
    samples: dict[tuple[str, float], list[Sample]] = {}
    try:
        for server in servers:
            server.wait_ready()
        for _ in range(settings.rounds):
            for share in RATE_SHARES:
                for server in servers:
                    request = request_for(
                        SLO_MODEL, INPUT_NAMES[SLO_MODEL], BENCH_SHAPES[SLO_MODEL], server.port
                    )
                    sample = measure(
                        server.port,
                        request,
                        rate=share * capacity,
                        window_s=settings.window_s * 1.5,
                        warmup_s=settings.warmup_s,
                        slo_ms=SLO_MS,
                    )
                    samples.setdefault((server.label, share), []).append(sample)
                    print(
                        f"slo {share:.0%} {server.label}: {sample.items_per_s:.0f}/s "
                        f"p99 {sample.p99_ms:.1f} failed {sample.failed:.1%}",
                        flush=True,
                    )
    finally:
        for server in servers:
            server.stop()
    table: dict[str, Any] = {}
    for (label, share), runs in samples.items():
        table.setdefault(f"{share:.0%}", {})[label] = dataclasses.asdict(median_sample(runs))
    return {"model": SLO_MODEL, "slo_ms": SLO_MS, "capacity": capacity, "table": table}


def simulation() -> dict[str, Any]:
    """The same comparison without noise: the real planner, a known cost, simulated time."""
    table: dict[str, Any] = {}
    for share in RATE_SHARES:
        policies = {f"fixed {d:g} ms": fixed(d) for d in FIXED_DELAYS_MS}
        policies[f"slo {SLO_MS:g} ms"] = with_slo(SLO_MS)
        table[f"{share:.0%}"] = {
            label: dataclasses.asdict(simulate(policy, share * capacity(), SLO_MS, seconds=20))
            for label, policy in policies.items()
        }
    return {"capacity": capacity(), "slo_ms": SLO_MS, "table": table}


def coldstart(settings: Settings) -> dict[str, Any]:
    """`edgeserve serve functions/ocr` (or the CRNN function when the OCR model is not trained
    yet) to ready, four times: the first builds the bundle cache, the others open it. Then the
    phases of a start, measured in-process."""
    ocr = HERE.parent / "functions" / "ocr"
    target = (
        ocr
        if (ocr / "model.onnx").exists()
        else function("crnn", "ov", settings, backend="openvino", precision="auto")
    )
    spawns = []
    for _ in range(4):
        server = start_edgeserve("coldstart", target, "openvino", settings.work / "logs")
        try:
            spawns.append(server.wait_ready())
        finally:
            server.stop()
    return {
        "target": str(target.relative_to(HERE.parent)),
        "ready_s": spawns,
        "phases": _footprint(["coldstart", str(target)]),
    }


def _footprint(args: list[str]) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, str(HERE / "footprint.py"), *args],
        check=True,
        capture_output=True,
        text=True,
    )
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


if __name__ == "__main__":
    main()
