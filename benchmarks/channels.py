"""Control channels between two processes: round trips of one small message, measured.

    .venv/bin/python benchmarks/channels.py          # a few seconds

The candidates for a front <-> inference process control message (a few hundred bytes:
the tensors themselves cross in shared memory): a unix stream socket, a pair of pipes, a
shared-memory ring polled with a spin (then `sched_yield` once it has spun for a while, a
futex-like back-off without a futex in Python), and the unix socket under asyncio (uvloop),
which is what edgeserve.workers uses since both ends run event loops anyway.
"""

from __future__ import annotations

import argparse
import asyncio
import mmap
import multiprocessing as mp
import os
import socket
import statistics
import struct
import time
from collections.abc import Callable

MESSAGE = b"x" * 200
SPINS_BEFORE_YIELD = 2000


def _echo_socket(sock: socket.socket, count: int) -> None:
    for _ in range(count):
        sock.sendall(sock.recv(4096))


def unix_socket(count: int) -> list[float]:
    parent, child = socket.socketpair()
    worker = mp.Process(target=_echo_socket, args=(child, count))
    worker.start()
    times = []
    for _ in range(count):
        started = time.perf_counter()
        parent.sendall(MESSAGE)
        parent.recv(4096)
        times.append(time.perf_counter() - started)
    worker.join()
    return times


def _echo_pipe(read_fd: int, write_fd: int, count: int) -> None:
    for _ in range(count):
        os.write(write_fd, os.read(read_fd, 4096))


def pipes(count: int) -> list[float]:
    to_child, from_parent = os.pipe()
    to_parent, from_child = os.pipe()
    worker = mp.Process(target=_echo_pipe, args=(to_child, from_child, count))
    worker.start()
    times = []
    for _ in range(count):
        started = time.perf_counter()
        os.write(from_parent, MESSAGE)
        os.read(to_parent, 4096)
        times.append(time.perf_counter() - started)
    worker.join()
    return times


def _wait_for(ring: mmap.mmap, at: int, value: int) -> None:
    spins = 0
    while struct.unpack_from("<q", ring, at)[0] != value:
        spins += 1
        if spins > SPINS_BEFORE_YIELD:
            os.sched_yield()


def _echo_ring(ring: mmap.mmap, count: int) -> None:
    for turn in range(1, count + 1):
        _wait_for(ring, 0, turn)
        ring[16 : 16 + len(MESSAGE)] = ring[16 : 16 + len(MESSAGE)]
        struct.pack_into("<q", ring, 8, turn)


def shm_ring(count: int) -> list[float]:
    ring = mmap.mmap(-1, 4096)  # shared with the child across fork
    worker = mp.get_context("fork").Process(target=_echo_ring, args=(ring, count))
    worker.start()
    times = []
    for turn in range(1, count + 1):
        started = time.perf_counter()
        ring[16 : 16 + len(MESSAGE)] = MESSAGE
        struct.pack_into("<q", ring, 0, turn)
        _wait_for(ring, 8, turn)
        times.append(time.perf_counter() - started)
    worker.join()
    return times


def _echo_async(sock: socket.socket, count: int) -> None:
    import uvloop

    async def echo() -> None:
        reader, writer = await asyncio.open_unix_connection(sock=sock)
        for _ in range(count):
            writer.write(await reader.readexactly(len(MESSAGE)))

    uvloop.run(echo())


def asyncio_unix(count: int) -> list[float]:
    import uvloop

    parent, child = socket.socketpair()
    worker = mp.Process(target=_echo_async, args=(child, count))
    worker.start()
    times: list[float] = []

    async def ask() -> None:
        reader, writer = await asyncio.open_unix_connection(sock=parent)
        for _ in range(count):
            started = time.perf_counter()
            writer.write(MESSAGE)
            await reader.readexactly(len(MESSAGE))
            times.append(time.perf_counter() - started)

    uvloop.run(ask())
    worker.join()
    return times


CHANNELS: dict[str, Callable[[int], list[float]]] = {
    "unix socket (blocking)": unix_socket,
    "pipe pair (blocking)": pipes,
    "shm ring, spin then sched_yield": shm_ring,
    "unix socket, asyncio (uvloop) both ends": asyncio_unix,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=5000)
    args = parser.parse_args()
    print(f"{args.count} round trips of {len(MESSAGE)} bytes, {os.cpu_count()} cores")
    print("| channel | p50 us | p99 us | round trips/s |")
    print("|---|---|---|---|")
    for name, channel in CHANNELS.items():
        times = sorted(channel(args.count))
        p50, p99 = statistics.median(times), times[int(len(times) * 0.99)]
        print(f"| {name} | {p50 * 1e6:.1f} | {p99 * 1e6:.1f} | {len(times) / sum(times):.0f} |")


if __name__ == "__main__":
    main()
