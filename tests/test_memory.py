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
    later = bytearray(600_000)  # a later request's body, above them: the heap's top stays in use
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


STARTED = """
import asyncio, gc, socket
from contextlib import asynccontextmanager
import httpx, uvicorn
from starlette.applications import Starlette
from starlette.responses import Response
from starlette.routing import Route
from edgeserve.http.server import DrainingServer

class Loaded:  # what a model load leaves behind: objects in a cycle, alive for good
    def __init__(self):
        self.me = self

loaded = []

@asynccontextmanager
async def lifespan(app):
    loaded.extend(Loaded() for _ in range(1000))
    yield

async def ready(request):
    return Response(b"")

class App(Starlette):  # what DrainingServer tells of its shutdown (FunctionApp has more)
    def begin_drain(self):
        pass

async def main():
    app = App(routes=[Route("/", ready)], lifespan=lifespan)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = DrainingServer(uvicorn.Config(app, log_level="warning"))
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        await asyncio.sleep(0.01)
    async with httpx.AsyncClient() as client:
        status = (await client.get(f"http://127.0.0.1:{sock.getsockname()[1]}/")).status_code
    frozen = gc.get_freeze_count()
    for _ in range(100):
        Loaded()  # a request's garbage, in cycles too
    collected = gc.collect()
    server.should_exit = True
    await serving
    print(status, frozen, collected)

asyncio.run(main())
"""


def test_a_started_server_leaves_what_it_loaded_out_of_the_collector_s_sight() -> None:
    """After startup (the lifespan loaded the model) the server freezes what exists; what
    requests leave behind later is still collected."""
    out = subprocess.run(
        [sys.executable, "-c", STARTED], capture_output=True, text=True, check=True, timeout=60
    )
    status, frozen, collected = map(int, out.stdout.split())
    assert status == 200
    assert frozen > 1000  # the lifespan's objects among them
    assert collected >= 100
