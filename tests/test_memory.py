"""Idle trimming: after a burst of large requests, an idle server gives the memory back."""

from __future__ import annotations

import subprocess
import sys

import pytest

BURST = """
import asyncio, sys
from pathlib import Path
from edgeserve.memory import trim_when_idle

def rss_mb():
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024

async def main(busy):
    requests = 0
    watcher = asyncio.create_task(trim_when_idle(lambda: requests, every_s=0.05))
    await asyncio.sleep(0)  # the watcher takes its first look before the burst
    block = bytearray(4 << 20)  # a batch: freeing it makes glibc serve 600 KB from the heap
    del block
    before = rss_mb()
    bodies, kept = [], []
    for _ in range(100):  # 100 requests of 600 KB, each leaving a small object behind
        bodies.append(bytearray(600_000))
        kept.append(bytearray(2000))
        requests += 1
    del bodies
    for _ in range(30):  # 0.3 s: idle, or a request every 10 ms
        await asyncio.sleep(0.01)
        requests += busy
    print(rss_mb() - before)
    watcher.cancel()

asyncio.run(main(int(sys.argv[1])))
"""


def kept_mb(busy: bool) -> float:
    command = [sys.executable, "-c", BURST, str(int(busy))]
    return float(subprocess.run(command, capture_output=True, text=True, check=True).stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_an_idle_server_returns_the_memory_a_burst_of_large_bodies_left_in_the_heap() -> None:
    assert kept_mb(busy=True) > 40  # while requests keep coming, nothing is trimmed
    assert kept_mb(busy=False) < 5
