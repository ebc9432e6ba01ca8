"""What a served benchmark uses: CPU per process and of the machine, GPU utilization, and
py-spy's samples summed by frame, and the sweep's tables (benchmarks/gpu_sweep.py)."""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
import subprocess
import threading
from collections import Counter
from pathlib import Path
from typing import Any

TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of one process (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICK


def machine_busy() -> tuple[float, float]:
    """(busy, total) jiffies of the whole machine."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + values[4]
    return sum(values) - idle, sum(values)


def children(parent: int) -> dict[int, str]:
    """The supervisor's children: pid -> 'inference' or 'front'."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            command = (entry / "cmdline").read_bytes().decode(errors="replace")
        except (OSError, IndexError):
            continue
        if ppid == parent:
            found[int(entry.name)] = "inference" if "workers.inference" in command else "front"
    return found


class GpuSampler:
    """Mean GPU utilization (%) from nvidia-smi while the block runs; None without one."""

    def __init__(self) -> None:
        self.values: list[float] = []
        self.process: subprocess.Popen[str] | None = None
        self.thread: threading.Thread | None = None

    def __enter__(self) -> GpuSampler:
        if shutil.which("nvidia-smi"):
            query = ["--query-gpu=utilization.gpu", "--format=csv,noheader,nounits", "-lms", "200"]
            self.process = subprocess.Popen(
                ["nvidia-smi", *query], stdout=subprocess.PIPE, text=True
            )
            self.thread = threading.Thread(target=self._read, daemon=True)
            self.thread.start()
        return self

    def _read(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        for line in self.process.stdout:
            with contextlib.suppress(ValueError):
                self.values.append(float(line.strip()))

    def __exit__(self, *_: object) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait()

    @property
    def mean(self) -> float | None:
        return round(sum(self.values) / len(self.values), 1) if self.values else None


def children_cpu() -> float:
    """CPU seconds of this process's reaped children (the load generators, their helpers)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def summarize(raw: Path, ticks: int, top: int = 25) -> dict[str, Any]:
    """Leaf (self) frames and edgeserve/uvicorn frames (inclusive), as shares of the samples
    taken (`ticks`: rate x seconds, per thread): idle time is not sampled, so the shares of
    one thread add up to the fraction of time it was busy."""
    if not raw.exists():
        return {"error": "no py-spy output"}
    leaves: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    threads: Counter[str] = Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        count = int(count_text)
        frames = stack.split(";")
        total += count
        threads[frames[0]] += count
        leaves[frames[-1]] += count
        for frame in set(frames[1:]):
            if "edgeserve" in frame or "uvicorn" in frame or "starlette" in frame:
                inclusive[frame] += count

    def shares(counter: Counter[str]) -> list[tuple[str, float]]:
        return [(name, round(n / ticks, 3)) for name, n in counter.most_common(top)]

    return {
        "samples": total,
        "ticks": ticks,
        "threads": shares(threads),
        "self": shares(leaves),
        "inclusive": shares(inclusive),
    }


def print_table(results: dict[str, Any]) -> None:
    keys = [
        "workers",
        "per_device",
        "fronts",
        "load",
        "transport",
        "c",
        "items_per_s",
        "requests_per_s",
        "p50_ms",
        "p99_ms",
        "mean_batch",
        "server_compute_ms",
        "cores_inference",
        "cores_fronts",
        "cores_busiest_front",
        "cores_load",
        "cores_machine",
        "gpu_util",
    ]
    for name, rows in results.items():
        if name in ("profiles", "in_process"):
            continue
        print(f"\n## {name}\n| " + " | ".join(keys) + " |\n" + "|---" * len(keys) + "|")
        for row in rows:
            print(
                "| " + " | ".join(str(row.get(k, row.get("error", "")[:40])) for k in keys) + " |"
            )
    for name, limits in results.get("in_process", {}).items():
        print(
            f"in-process {name}: "
            + ", ".join(f"b{b} {v['plain']:.0f}/{v['bound']:.0f}" for b, v in limits.items())
        )
    for name, roles in results.get("profiles", {}).items():
        for role, summary in roles.items():
            print(f"\n## py-spy {name} {role}: {summary.get('samples')} samples")
            for kind in ("threads", "self", "inclusive"):
                for frame, share in summary.get(kind, [])[:12]:
                    print(f"{kind:9} {share:6.3f} {frame[:150]}")
