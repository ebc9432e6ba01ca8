"""What reading a shared-memory input costs: `SystemRegion.read` (a copy with pread, which a
client shrinking its object cannot turn into a SIGBUS) against a view of a mapping (no copy,
which it can), and both followed by one pass over the data, as a model's first layer makes.

    .venv/bin/python benchmarks/shm_read.py        # a table, microseconds per read (medians)

Standalone (not part of `make bench`): a few seconds on one core.
"""

from __future__ import annotations

import mmap
import os
import statistics
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import numpy as np

from edgeserve.sharedmemory import SystemRegion

SIZES = (4 << 10, 64 << 10, 1 << 20, 6 << 20, 16 << 20)  # 6 MiB: a 1080p RGB frame


def median_us(read: Callable[[], object], size: int) -> float:
    repeats = max(20, min(2000, (256 << 20) // size))
    read()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        read()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def row(size: int) -> str:
    key = f"shm-read-{uuid.uuid4().hex[:8]}"
    path = Path("/dev/shm") / key
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, size)
        os.pwrite(fd, np.random.default_rng(0).bytes(size), 0)
        region = SystemRegion.open("bench", f"/{key}", 0, size)
        mapping = mmap.mmap(fd, size)
        try:

            def in_place() -> np.ndarray:
                return np.frombuffer(mapping, np.uint8, count=size)

            def copied() -> np.ndarray:
                return np.frombuffer(region.read(0, size), np.uint8)

            figures = [
                median_us(in_place, size),
                median_us(copied, size),
                median_us(lambda: in_place().max(), size),
                median_us(lambda: copied().max(), size),
            ]
        finally:
            mapping.close()
    finally:
        os.close(fd)
        path.unlink()
    return f"{size >> 10:>9} KiB" + "".join(f"{figure:>14.1f}" for figure in figures)


def main() -> None:
    columns = ("mapped view", "pread copy", "view + pass", "copy + pass")
    print(f"{'input':>13}" + "".join(f"{column:>14}" for column in columns))
    for size in SIZES:
        print(row(size))


if __name__ == "__main__":
    main()
