"""One measurement: edgeserve's own load generator (edgeserve.bench.loadgen) against a server.

Every server gets the same generator, the same request bytes (Triton's binary tensor extension)
and the same windows: a warm-up that is discarded, then a fixed measurement window.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgeserve.bench.inputs import encode_infer
from edgeserve.bench.loadgen import Request, Target, closed_loop, encode_request, open_loop
from edgeserve.bench.measure import Record, percentile


@dataclass(frozen=True)
class Sample:
    """What one window measured; latencies in ms over the successful requests."""

    items_per_s: float
    p50_ms: float
    p99_ms: float
    failed: float  # share of requests answered with an error (503 shed included)
    within_slo_per_s: float = 0.0
    server_cpu_us: float = float("nan")  # CPU of the server's process tree per answered item
    client_cpu_us: float = float("nan")  # CPU of this load generator per answered item


def request_for(
    name: str, input_name: str, shape: tuple[int, ...], port: int, items: int = 1
) -> Request:
    x = np.random.default_rng(0).random((items, *shape), dtype=np.float32)
    body = encode_infer(name, {input_name: x}, {input_name: "FP32"}, binary=True, items=items)
    return Request(encode_request(f"127.0.0.1:{port}", body.path, body.headers, body.body), items)


def measure(
    port: int,
    request: Request,
    *,
    concurrency: int = 0,
    rate: float = 0.0,
    window_s: float = 2.0,
    warmup_s: float = 0.5,
    slo_ms: float = 0.0,
    pid: int | None = None,
) -> Sample:
    """Closed loop at `concurrency`, or Poisson arrivals at `rate` per second; with `pid`, the
    CPU time the server's processes and the generator spent in the window, per answered item."""
    cpu: list[tuple[float, float]] = []
    records = asyncio.run(_records(port, request, concurrency, rate, window_s, warmup_s, pid, cpu))
    sample = summarize(records, window_s, slo_ms)
    items = sample.items_per_s * window_s
    if len(cpu) == 2 and items:
        server, client = (cpu[1][i] - cpu[0][i] for i in range(2))
        sample = dataclasses.replace(
            sample, server_cpu_us=server / items * 1e6, client_cpu_us=client / items * 1e6
        )
    return sample


def process_tree_cpu_s(pid: int) -> float:
    """User + system seconds of `pid` and its descendants (Triton runs tritonserver below)."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            parents[int(stat.parent.name)] = int(fields[1])
    tree, total = {pid}, 0.0
    for child, parent in sorted(parents.items()):
        if parent in tree:
            tree.add(child)
    for member in tree:
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = Path(f"/proc/{member}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


async def _records(
    port: int,
    request: Request,
    concurrency: int,
    rate: float,
    window_s: float,
    warmup_s: float,
    pid: int | None,
    cpu: list[tuple[float, float]],
) -> list[Record]:
    target = Target("127.0.0.1", port, [request])
    stop = asyncio.Event()
    if concurrency:
        load = asyncio.create_task(closed_loop(target, concurrency, stop))
    else:
        load = asyncio.create_task(open_loop(target, rate, stop, seed=1))
    loop = asyncio.get_running_loop()
    begin = loop.time() + warmup_s
    await asyncio.sleep(warmup_s)
    if pid is not None:
        cpu.append((process_tree_cpu_s(pid), time.process_time()))
    await asyncio.sleep(window_s)
    if pid is not None:
        cpu.append((process_tree_cpu_s(pid), time.process_time()))
    stop.set()
    await load
    return [r for r in target.records if begin <= r.ended < begin + window_s]


def summarize(records: list[Record], window_s: float, slo_ms: float) -> Sample:
    ok = sorted(r.latency * 1000 for r in records if r.ok)
    items = sum(r.items for r in records if r.ok)
    failed = 1 - len(ok) / len(records) if records else 1.0
    within = sum(1 for latency in ok if latency <= slo_ms) if slo_ms else 0
    return Sample(
        items / window_s, percentile(ok, 50), percentile(ok, 99), failed, within / window_s
    )


def median_sample(samples: list[Sample]) -> Sample:
    """Field-wise median over rounds."""
    rows = [dataclasses.astuple(sample) for sample in samples]
    return Sample(*(float(np.median(column)) for column in zip(*rows, strict=True)))
