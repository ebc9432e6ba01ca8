"""How fast can the bench's load generator go? Its ceiling against a trivial endpoint, vs httpx.

    .venv/bin/python benchmarks/loadgen_ceiling.py [--concurrency 16] [--seconds 5]

A trivial Starlette app (200 "ok") runs under uvicorn in its own process; each client runs a
closed loop at the same concurrency for the same time. Reported per client: requests/s reached,
and the client's own CPU time per request, whose inverse is the rate one core of client could
drive if the server were infinitely fast: the client's ceiling, robust to a busy machine.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Coroutine
from typing import Any

import httpx
import uvloop

from edgeserve.bench.loadgen import Request, Target, closed_loop, encode_request, open_loop
from edgeserve.bench.measure import LATE_SEND_S, Record, percentile


def serve_trivial(port: int) -> None:
    """The endpoint under load: as little server work as Starlette allows."""
    import uvicorn
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    app = Starlette(routes=[Route("/", lambda request: PlainTextResponse("ok"))])
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="error", access_log=False)


async def raw_client(port: int, concurrency: int, seconds: float) -> int:
    target = Target(
        "127.0.0.1", port, [Request(encode_request(f"127.0.0.1:{port}", "/", {}, b""), 1)]
    )
    stop = asyncio.Event()
    asyncio.get_running_loop().call_later(seconds, stop.set)
    await closed_loop(target, concurrency, stop)
    return sum(record.ok for record in target.records)


async def raw_open_loop(port: int, rate: float, seconds: float) -> list[Record]:
    target = Target(
        "127.0.0.1", port, [Request(encode_request(f"127.0.0.1:{port}", "/", {}, b""), 1)]
    )
    stop = asyncio.Event()
    asyncio.get_running_loop().call_later(seconds, stop.set)
    await open_loop(target, rate, stop)
    return target.records


async def httpx_client(port: int, concurrency: int, seconds: float) -> int:
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    deadline = time.monotonic() + seconds
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", limits=limits) as client:

        async def worker() -> int:
            done = 0
            while time.monotonic() < deadline:
                done += (await client.get("/")).status_code == 200
            return done

        return sum(await asyncio.gather(*(worker() for _ in range(concurrency))))


def measure(name: str, run: Callable[[], Coroutine[Any, Any, int]], use_uvloop: bool) -> None:
    wall, cpu = time.monotonic(), time.process_time()
    done = uvloop.run(run()) if use_uvloop else asyncio.run(run())
    wall, cpu = time.monotonic() - wall, time.process_time() - cpu
    loop = "uvloop" if use_uvloop else "asyncio"
    print(
        f"{name:6s} {loop:8s} {done / wall:8.0f} req/s   client CPU {cpu / done * 1e6:6.1f} us/req"
        f"   -> ceiling {done / cpu:7.0f} req/s per client core"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rate", type=float, action="append", default=[], help="open-loop rates")
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve_trivial(args.serve)
        return
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = subprocess.Popen([sys.executable, __file__, "--serve", str(port)])
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        c, s = args.concurrency, args.seconds
        for use_uvloop in (False, True):
            measure("raw", lambda: raw_client(port, c, s), use_uvloop)
            measure("httpx", lambda: httpx_client(port, c, s), use_uvloop)
        for rate in args.rate:
            records = uvloop.run(raw_open_loop(port, rate, s))
            lags = sorted(r.sent - r.scheduled for r in records)
            late = sum(lag > LATE_SEND_S for lag in lags) / len(lags)
            print(
                f"open loop {rate:6.0f}/s: sent {len(records) / s:6.0f}/s, {late:.1%} late, "
                f"send lag p99 {percentile(lags, 99) * 1e3:.2f} ms"
            )
    finally:
        server.terminate()
        server.wait(10)


if __name__ == "__main__":
    main()
