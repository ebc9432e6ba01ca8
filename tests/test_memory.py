"""Idle trimming: after a burst of large requests, an idle server gives the memory back."""

from __future__ import annotations

import functools
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.models import identity_model, write_function
from tests.server import running
from tests.test_tritonclient import MANIFEST

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


def peak_rss_mb(pid: int) -> int:
    """The process's high-water mark of resident memory (VmHWM), in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) // 1024
    raise AssertionError(f"no VmHWM in /proc/{pid}/status")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/<pid>/status")
def test_large_json_bodies_sent_at_once_are_decoded_one_after_the_other(tmp_path: Path) -> None:
    """An 8 MB JSON body of rows of numbers peaks at ~120 MB of Python objects while it is
    decoded. Five sent at once, refused only once decoded (an unknown input beside the
    real one: a flood of bad requests), peaked at 3.5 times one's, as decoding them together
    (the GIL lets one run at a time anyway) held all their objects at once. One at a time,
    the peak stays near one's (the bodies themselves, read meanwhile, add a little)."""
    rows = (8 << 20) // 8
    body = b'{"inputs":[{"name":"zz","datatype":"FP32","shape":[1],"data":[0]},'
    body += b'{"name":"in_FP32","datatype":"FP32","shape":[%d,3],"data":[' % rows
    body += b"[0,0,0]," * (rows - 1) + b"[0,0,0]]}]}"
    model = functools.partial(identity_model, datatypes=("FP32",))
    source = write_function(tmp_path / "src", model, MANIFEST)
    with running(source, "--workers", "1") as (url, server):
        infer = f"{url}/v2/models/identity/infer"
        before = peak_rss_mb(server.process.pid)
        assert httpx.post(infer, content=body, timeout=120).status_code == 400
        one = peak_rss_mb(server.process.pid) - before
        with ThreadPoolExecutor(5) as pool:
            sent = [pool.submit(httpx.post, infer, content=body, timeout=300) for _ in range(5)]
            answers = [answer.result() for answer in sent]
        five = peak_rss_mb(server.process.pid) - before
    assert [answer.json()["error"] for answer in answers] == [
        "inputs: expected ['in_FP32']; unknown ['zz']"
    ] * 5
    assert one > 60, one  # the decoding's objects, which the bound is about
    assert five < 2 * one, (one, five)
