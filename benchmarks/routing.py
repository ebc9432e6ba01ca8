"""How the fronts share batches over inference processes (docs/performance.md, "Process layout").

`edgeserve serve --workers 2` with two CPU inference processes (`[resources]
processes_per_device = 2`) serving the MLP benchmark model; each round sends 16 one-row requests
at once, each on its own connection, and reads from the server's /metrics how many rows and
batches each inference process ran. Two batch policies: batches of up to 16 waiting 500 ms (the
shortest queue splits 8/8 and each process runs one batch), and batches closing at 8 (a
process that ran its 8 is empty again and takes the stragglers).

    python benchmarks/routing.py WORK_DIR [--rounds 10]      # ~1 min on 2 cores
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np

sys.path.append(str(Path(__file__).resolve().parents[1]))

from benchmarks.models import BENCH_SHAPES, write_function
from benchmarks.servers import start_edgeserve

POLICIES = {"up to 16, 500 ms": (16, 500.0), "closing at 8, 500 ms": (8, 500.0)}
REQUESTS = 16


def per_process(url: str) -> dict[str, tuple[int, int]]:
    """{instance: (rows, batches)} from /metrics."""
    text = httpx.get(f"{url}/metrics", timeout=5).text
    found: dict[str, dict[str, int]] = {}
    for family, instance, value in re.findall(
        r'edgeserve_instance_(inferences|executions)\{.*?instance="(\d+)".*?\} (\S+)', text
    ):
        found.setdefault(instance, {})[family] = int(float(value))
    return {i: (v["inferences"], v["executions"]) for i, v in sorted(found.items())}


def rounds(work: Path, batch: int, delay_ms: float, count: int) -> Counter[str]:
    """How often each split of rows/batches over the two processes happened."""
    folder = write_function("mlp", work / f"mlp-{batch}", delay_ms=delay_ms)
    manifest = folder / "function.toml"
    text = manifest.read_text().replace("max_batch_size = 32", f"max_batch_size = {batch}")
    manifest.write_text(text + "\n[resources]\nprocesses_per_device = 2\n")
    server = start_edgeserve(f"mlp-{batch}", folder, "onnxruntime", work / "logs", workers="2")
    url = f"http://127.0.0.1:{server.port}"
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, BENCH_SHAPES["mlp"][0]]}]}
    body["inputs"][0]["data"] = np.zeros(BENCH_SHAPES["mlp"][0]).tolist()
    splits: Counter[str] = Counter()
    try:
        server.wait_ready()
        with ThreadPoolExecutor(REQUESTS) as pool:
            for _ in range(count):
                before = per_process(url)

                def post(_: int) -> int:
                    answer = httpx.post(f"{url}/v2/models/mlp/infer", json=body, timeout=30)
                    return answer.status_code

                assert list(pool.map(post, range(REQUESTS))) == [200] * REQUESTS
                after = per_process(url)
                rows = sorted(after[i][0] - before[i][0] for i in after)
                batches = [after[i][1] - before[i][1] for i in sorted(after)]
                splits[f"rows {rows[0]}/{rows[1]}, batches {batches[0]}+{batches[1]}"] += 1
    finally:
        server.stop()
    return splits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("work", type=Path)
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    print(f"| batches | split over the 2 processes (rows, batches) | rounds of {args.rounds} |")
    print("|---|---|---|")
    for label, (batch, delay_ms) in POLICIES.items():
        for split, times in rounds(args.work, batch, delay_ms, args.rounds).most_common():
            print(f"| {label} | {split} | {times} |")


if __name__ == "__main__":
    main()
