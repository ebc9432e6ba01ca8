"""GPU figures: the ResNet-18-shaped model on ONNX Runtime's CUDA provider, raw and served.

Run on a machine with an NVIDIA GPU and onnxruntime-gpu. "raw" is the backend's own in-process
throughput per batch size (no HTTP); "served" is `edgeserve serve` of the same model under the
closed-loop load of `edgeserve bench`, binary tensors, one item per request.

    python benchmarks/gpu.py WORK_DIR     # makes the model and its bundle there, then measures
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.models import write_function
from edgeserve.bench import bench
from edgeserve.builder import build

BATCHES = (1, 8, 32)
CONCURRENCY = (1, 8, 32, 64)


def raw_throughput(model: Path, batch: int, seconds: float = 2.0) -> float:
    """Items/s of plain session.run calls on the CUDA provider (median of 5 rounds)."""
    providers = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    session = ort.InferenceSession(str(model), providers=providers)
    assert session.get_providers()[0] == "CUDAExecutionProvider", session.get_providers()
    name = session.get_inputs()[0].name
    x = np.random.default_rng(0).normal(size=(batch, 3, 224, 224)).astype(np.float32)
    for _ in range(10):
        session.run(None, {name: x})
    rounds = []
    for _ in range(5):
        runs, started = 0, time.perf_counter()
        while time.perf_counter() - started < seconds / 5:
            session.run(None, {name: x})
            runs += 1
        rounds.append(runs * batch / (time.perf_counter() - started))
    return statistics.median(rounds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("work", type=Path)
    args = parser.parse_args()
    if hasattr(ort, "preload_dlls"):
        ort.preload_dlls()
    source = write_function("resnet", args.work / "resnet")
    # the jetson target plans TensorRT then ONNX Runtime (CUDA): the GPU plan, with no CPU IR
    bundle = build(source, args.work / "build" / "resnet", targets=("jetson",))
    raw = {batch: raw_throughput(bundle.model_path, batch) for batch in BATCHES}
    report = bench(str(bundle.root), concurrency=CONCURRENCY, window_s=1.0, max_windows=5)
    served = report.to_json()["levels"]
    limit = max(raw.values())
    print("raw (in-process, CUDA EP):", {b: round(v) for b, v in raw.items()}, "items/s")
    header = ("concurrency", "items/s", "p50 ms", "p99 ms", "batch", "vs limit")
    print("".join(f"{name:>12}" for name in header))
    for row in served:
        items, latency = row["items_per_s"], row["latency_ms"]
        batch = (row["server"] or {}).get("mean_batch")
        cells = (
            row["value"],
            f"{items:.0f}",
            latency["p50"],
            latency["p99"],
            batch,
            f"{items / limit:.2f}",
        )
        print("".join(f"{cell!s:>12}" for cell in cells))
    print(json.dumps({"raw": raw, "served": served}, default=str))


if __name__ == "__main__":
    main()
