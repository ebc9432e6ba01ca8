"""GPU scaling (benchmarks/RESULTS-gpu.md): one inference process per device, one run.

The ResNet-18-shaped benchmark model (fp32, benchmarks/models.py) served by `edgeserve serve`,
HTTP binary tensors, one item per request, under `edgeserve bench`'s closed loop: first with
`[resources] devices = [0]` (one GPU), then with every visible GPU (`devices = "auto"`), the
fronts and the load the same. The ratio is what the second GPU (and more) adds; the per-GPU
batches come from the server's own /metrics (edgeserve_instance_executions).

    python benchmarks/devices.py WORK_DIR [--processes 4] [--model resnet]   # needs >= 2 GPUs
    EDGESERVE_WORKERS=8 python benchmarks/devices.py ...                     # set the fronts

The edgeserve that runs is the one first on PYTHONPATH (this script appends its own checkout
last).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.append(str(Path(__file__).resolve().parents[1]))

from benchmarks.gpu import gpu_bundle
from benchmarks.models import BENCH_SHAPES, write_function
from edgeserve.bench import bench
from edgeserve.hardware import probe_gpus

CONCURRENCY = (16, 64, 128, 256)
SETTINGS = {"one": "[0]", "all": '"auto"'}


def served(name: str, work: Path, label: str, processes: int) -> list[dict[str, Any]]:
    """items/s, p50, p99 and mean batch at each concurrency with SETTINGS[label]'s devices."""
    devices = SETTINGS[label]
    source = write_function(name, work / f"{name}-{label}")
    manifest = source / "function.toml"
    manifest.write_text(manifest.read_text() + f"\n[resources]\ndevices = {devices}\n")
    report = bench(
        gpu_bundle(source, work),
        concurrency=CONCURRENCY,
        window_s=1.0,
        max_windows=5,
        shapes={"image": BENCH_SHAPES[name]},
        processes=processes,
    )
    return [
        {
            "c": level["value"],
            "items_per_s": level["items_per_s"],
            "p50_ms": level["latency_ms"]["p50"],
            "p99_ms": level["latency_ms"]["p99"],
            "mean_batch": (level["server"] or {}).get("mean_batch"),
            "errors": level["errors"],
        }
        for level in report.to_json()["levels"]
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("work", type=Path)
    parser.add_argument("--model", default="resnet")
    parser.add_argument("--processes", type=int, default=4, help="load-generator processes")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    gpus = len(probe_gpus())
    if gpus < 2:
        sys.exit(f"devices.py: needs 2 or more GPUs, this machine shows {gpus}")
    results = {label: served(args.model, args.work, label, args.processes) for label in SETTINGS}
    one, every = results["one"], results["all"]
    print(f"\n## {args.model}: served on 1 GPU and on {gpus} GPUs, HTTP binary, one item/request")
    print(
        "| c | 1 GPU items/s | p99 ms | all GPUs items/s | p99 ms | ratio | mean batch | errors |"
    )
    print("|---" * 8 + "|")
    for a, b in zip(one, every, strict=True):
        print(
            f"| {a['c']} | {a['items_per_s']:.0f} | {a['p99_ms']} | {b['items_per_s']:.0f} "
            f"| {b['p99_ms']} | {b['items_per_s'] / a['items_per_s']:.2f} "
            f"| {a['mean_batch']} / {b['mean_batch']} | {a['errors']} / {b['errors']} |"
        )
    if args.json:
        args.json.write_text(json.dumps({"gpus": gpus, **results}, indent=1))


if __name__ == "__main__":
    main()
