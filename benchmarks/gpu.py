"""GPU figures (benchmarks/RESULTS-gpu.md): in-process limits against `edgeserve serve`, one run.

Run on a machine with an NVIDIA GPU and onnxruntime-gpu; compare figures only within one GPU
model. For the ResNet-18-shaped and the CRNN benchmark models (benchmarks/models.py, fp32):

- in-process: plain `session.run` on the CUDA provider with the provider options edgeserve uses,
  per batch size (numpy feeds: what the targets call "the in-process best batch"), and the same
  session bound to pinned buffers (IOBinding, one DMA copy in per run), and a session at that
  shape alone run as a CUDA graph over device buffers (edgeserve's path since cuda_graphs);
- served: `edgeserve serve` under `edgeserve bench`'s closed loop, HTTP binary tensors, one item
  per request, with the server's own mean batch and compute time per batch, set against the
  in-process time of a batch of that size (rounded up to the bucket the server runs);
- functions/ocr: pages/s and p50 at c=1 and c=32 on CUDA, and on the same host's CPU provider
  (`EDGESERVE_DEVICE=cpu`).

    python benchmarks/gpu.py WORK_DIR [--json FILE] [--processes 4]   # ~4 min on an H100 host
    EDGESERVE_WORKERS=1 python benchmarks/gpu.py ...     # the served layout: 1 process, N fronts

The edgeserve that runs is the one first on PYTHONPATH (this script appends its own checkout
last), so one script measures two trees: before and after a change.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

sys.path.append(str(Path(__file__).resolve().parents[1]))

from benchmarks.models import BENCH_SHAPES, write_function
from edgeserve.bench import bench
from edgeserve.builder import build

BATCHES = (1, 8, 16, 32)
CONCURRENCY = (1, 16, 64, 128)
OCR_CONCURRENCY = (1, 32)
CUDA = [("CUDAExecutionProvider", {"device_id": "0", "use_tf32": "0"}), "CPUExecutionProvider"]


def rate(run: Callable[[], object], batch: int, seconds: float = 1.5) -> float:
    """Items/s of `run` (median of 5 rounds after 10 warm-up calls)."""
    for _ in range(10):
        run()
    rounds = []
    for _ in range(5):
        runs, started = 0, time.perf_counter()
        while time.perf_counter() - started < seconds / 5:
            run()
            runs += 1
        rounds.append(runs * batch / (time.perf_counter() - started))
    return statistics.median(rounds)


def pinned(shape: tuple[int, ...]) -> np.ndarray:
    from cuda.bindings import runtime

    nbytes = int(np.prod(shape)) * 4
    _, pointer = runtime.cudaMallocHost(nbytes)
    raw = (ctypes.c_byte * nbytes).from_address(int(pointer))
    return np.frombuffer(memoryview(raw), dtype=np.float32).reshape(shape)


def in_process(model: Path, shape: tuple[int, ...], batch: int) -> dict[str, float]:
    """Plain and bound (pinned, IOBinding) items/s of one CUDA session at one batch shape."""
    session = ort.InferenceSession(str(model), providers=CUDA)
    assert session.get_providers()[0] == "CUDAExecutionProvider", session.get_providers()
    name, output = session.get_inputs()[0].name, session.get_outputs()[0].name
    x = np.random.default_rng(0).normal(size=(batch, *shape)).astype(np.float32)
    plain = rate(lambda: session.run(None, {name: x}), batch)
    bound_x = pinned(x.shape)
    bound_x[:] = x
    y = session.run(None, {name: x})[0]
    bound_y = pinned(y.shape)
    on_device = ort.OrtValue.ortvalue_from_shape_and_type(list(x.shape), np.float32, "cuda", 0)
    io = session.io_binding()
    io.bind_ortvalue_input(name, on_device)
    io.bind_output(output, "cpu", 0, np.float32, list(y.shape), bound_y.ctypes.data)

    def bound() -> None:
        on_device.update_inplace(bound_x)  # pinned host -> device, as edgeserve's bindings do
        session.run_with_iobinding(io)

    bound()
    np.testing.assert_allclose(bound_y, y, rtol=1e-3, atol=1e-3)  # the bound path computes
    return {
        "plain": plain,
        "bound": rate(bound, batch),
        "graph": graph_rate(model, (name, x), (output, y)),
    }


def graph_rate(model: Path, feed: tuple[str, np.ndarray], fetch: tuple[str, np.ndarray]) -> float:
    """Items/s of a session at the input's shape alone (named dims fixed) run as a CUDA graph
    over device buffers, copied in from and out to the host each run: edgeserve's bucket path.
    `feed` is the input (name, value), `fetch` the output (name, a plain run's answer)."""
    from edgeserve.backends.sessions import dim_names, fixed_dims, with_graphs

    (name, x), (output, y) = feed, fetch
    options = ort.SessionOptions()
    for dim, size in fixed_dims(dim_names(model), {name: x.shape}).items():
        options.add_free_dimension_override_by_name(dim, size)
    session = ort.InferenceSession(str(model), options, providers=with_graphs(CUDA))
    x_device, y_device = (
        ort.OrtValue.ortvalue_from_shape_and_type(list(a.shape), np.float32, "cuda", 0)
        for a in (x, y)
    )
    io = session.io_binding()
    io.bind_ortvalue_input(name, x_device)
    io.bind_ortvalue_output(output, y_device)
    run_options = ort.RunOptions()
    run_options.add_run_config_entry("gpu_graph_id", "0")
    host_x = pinned(x.shape)
    host_x[:] = x

    def graph() -> np.ndarray:
        x_device.update_inplace(host_x)
        session.run_with_iobinding(io, run_options)
        return y_device.numpy()

    for _ in range(3):  # a plain run, the capture, a replay
        answer = graph()
    np.testing.assert_allclose(answer, y, rtol=1e-3, atol=1e-3)
    return rate(graph, batch=len(x))


def gpu_bundle(source: Path, work: Path) -> str:
    """Built for the jetson target: the GPU plan (TensorRT, then ONNX Runtime), no CPU IR."""
    return str(build(source, work / "build" / source.name, targets=("jetson",)).root)


def bucket(rows: float) -> int:
    return next(b for b in (1, 2, 4, 8, 16, 32) if b >= round(rows))


def served(
    model_name: str, work: Path, limits: dict[int, dict[str, float]], processes: int
) -> list[dict]:
    source = write_function(model_name, work / model_name)
    shapes = {"image": BENCH_SHAPES[model_name]}
    target = gpu_bundle(source, work)
    report = bench(
        target,
        concurrency=CONCURRENCY,
        window_s=1.0,
        max_windows=5,
        shapes=shapes,
        processes=processes,
    )
    rows = []
    for level in report.to_json()["levels"]:
        server = level["server"] or {}
        mean, compute = server.get("mean_batch") or 1.0, server["ms"]["compute_infer"]
        size = bucket(mean)
        plain = limits.get(size) or in_process(
            work / model_name / "model.onnx", BENCH_SHAPES[model_name], size
        )
        limits[size] = plain
        rows.append(
            {
                "c": level["value"],
                "items_per_s": level["items_per_s"],
                "errors": level["errors"],
                "p50_ms": level["latency_ms"]["p50"],
                "p99_ms": level["latency_ms"]["p99"],
                "mean_batch": mean,
                "server_compute_ms": compute,
                "in_process_ms_at_bucket": round(size / plain["plain"] * 1e3, 3),
                "bucket": size,
            }
        )
    return rows


@contextlib.contextmanager
def device(value: str | None) -> Iterator[None]:
    old = os.environ.get("EDGESERVE_DEVICE")
    if value is not None:
        os.environ["EDGESERVE_DEVICE"] = value
    try:
        yield
    finally:
        os.environ.pop("EDGESERVE_DEVICE", None)
        if old is not None:
            os.environ["EDGESERVE_DEVICE"] = old


def ocr(source: Path, work: Path, providers: list[str], processes: int) -> dict[str, list[dict]]:
    """Pages/s and latency of functions/ocr on CUDA and on the CPU provider."""
    target, results = gpu_bundle(source, work), {}
    for label in providers:
        value = "cpu" if label == "cpu" else None
        with device(value):
            report = bench(
                target,
                concurrency=OCR_CONCURRENCY,
                window_s=2.0,
                max_windows=5,
                processes=processes,
            )
        results[label] = [
            {
                "c": level["value"],
                "pages_per_s": level["throughput_rps"],
                "errors": level["errors"],
                "p50_ms": level["latency_ms"]["p50"],
                "p99_ms": level["latency_ms"]["p99"],
                "lines_per_batch": (level["server"] or {}).get("mean_batch"),
            }
            for level in report.to_json()["levels"]
        ]
    return results


def print_model(name: str, limits: dict[int, dict[str, float]], rows: list[dict]) -> None:
    best = max(v["plain"] for v in limits.values())
    bound = max(v["bound"] for v in limits.values())
    print(f"\n## {name}: in-process (items/s, CUDA EP, fp32)")
    print("| batch | plain session.run | bound, pinned (IOBinding) |\n|---|---|---|")
    for batch, value in sorted(limits.items()):
        print(f"| {batch} | {value['plain']:.0f} | {value['bound']:.0f} |")
    print(f"\n## {name}: served, HTTP binary, one item per request")
    print(
        "| c | items/s | vs in-process best | p50 ms | p99 ms | mean batch | server compute ms "
        "| in-process ms (bucket) | compute ratio | errors |\n" + "|---" * 10 + "|"
    )
    for r in rows:
        ratio = r["server_compute_ms"] / r["in_process_ms_at_bucket"]
        print(
            f"| {r['c']} | {r['items_per_s']:.0f} | {r['items_per_s'] / best:.2f} "
            f"| {r['p50_ms']} | {r['p99_ms']} | {r['mean_batch']} | {r['server_compute_ms']} "
            f"| {r['in_process_ms_at_bucket']} ({r['bucket']}) | {ratio:.2f} | {r['errors']} |"
        )
    print(f"in-process best batch: {best:.0f} items/s plain, {bound:.0f} bound")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("work", type=Path)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--models", default="resnet,crnn", help="benchmark models to measure")
    parser.add_argument("--processes", type=int, default=1, help="load-generator processes")
    parser.add_argument("--ocr", type=Path, default=Path(__file__).parents[1] / "functions/ocr")
    parser.add_argument(
        "--ocr-providers",
        default="cuda,cpu",
        help="cuda,cpu (cpu: needs a tree with EDGESERVE_DEVICE)",
    )
    args = parser.parse_args()
    if hasattr(ort, "preload_dlls"):
        ort.preload_dlls()
    workers = os.environ.get("EDGESERVE_WORKERS", "the manifest's (auto)")
    print(f"# served with workers = {workers}, {args.processes} load-generator process(es)")
    results: dict[str, Any] = {"workers": workers, "processes": args.processes}
    for name in filter(None, args.models.split(",")):
        model = write_function(name, args.work / name) / "model.onnx"
        limits = {b: in_process(model, BENCH_SHAPES[name], b) for b in BATCHES}
        rows = served(name, args.work, limits, args.processes)
        print_model(name, limits, rows)
        results[name] = {"in_process": limits, "served": rows}
    providers = list(filter(None, args.ocr_providers.split(",")))
    results["ocr"] = ocr(args.ocr, args.work, providers, args.processes)
    print(
        "\n## functions/ocr (pages)\n"
        "| provider | c | pages/s | p50 ms | p99 ms | lines/batch | errors |"
    )
    print("|---|---|---|---|---|---|---|")
    for label, levels in results["ocr"].items():
        for r in levels:
            print(
                f"| {label} | {r['c']} | {r['pages_per_s']:.1f} | {r['p50_ms']} | {r['p99_ms']} "
                f"| {r['lines_per_batch']} | {r['errors']} |"
            )
    if {"cuda", "cpu"} <= results["ocr"].keys():
        cuda, cpu = (results["ocr"][k] for k in ("cuda", "cpu"))
        print(
            f"OCR CUDA / CPU pages/s at c={cuda[-1]['c']}: "
            f"{cuda[-1]['pages_per_s'] / cpu[-1]['pages_per_s']:.2f}; p50 at c={cuda[0]['c']}: "
            f"{cuda[0]['p50_ms']} ms CUDA, {cpu[0]['p50_ms']} ms CPU"
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main()
