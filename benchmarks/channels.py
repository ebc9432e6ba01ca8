"""Control channels between two processes: round trips of one small message, measured.

    .venv/bin/python benchmarks/channels.py          # a few seconds

The candidates for a front <-> inference process control message (a few hundred bytes:
the tensors themselves cross in shared memory): a unix stream socket, a pair of pipes, a
shared-memory ring polled with a spin (then `sched_yield` once it has spun for a while, a
futex-like back-off without a futex in Python), and the unix socket under asyncio (uvloop),
which is what edgeserve.workers uses since both ends run event loops anyway.

A second table times edgeserve's own messages over that channel: a SUBMIT of one tensor in the
arena answered by a DONE, encoded with `edgeserve.workers.wire` (msgpack, every field checked)
against pickle, which the wire used before (pickle would run whatever a message names).
"""

from __future__ import annotations

import argparse
import asyncio
import mmap
import multiprocessing as mp
import os
import pickle
import socket
import statistics
import struct
import time
from collections.abc import Callable
from typing import Any

from edgeserve.workers import wire

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


SUBMIT = (wire.SUBMIT, 1, {"x": ("<f4", (1, 3, 224, 224), 0)}, (0, 602112), 1e4, 1e4, None)
DONE = (wire.DONE, 1, {"y": ("<f4", (1, 1000), 0)})
IN_FLIGHT = 32
_LENGTH = struct.Struct("<I")


class Pickled:
    """The wire before: pickle, length-prefixed, read with two readexactly a message."""

    def __init__(self, reader: asyncio.StreamReader) -> None:
        self.reader = reader

    @staticmethod
    def encode(message: tuple[Any, ...]) -> bytes:
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        return _LENGTH.pack(len(data)) + data

    async def receive(self, kinds: frozenset[int]) -> tuple[Any, ...]:
        (length,) = _LENGTH.unpack(await self.reader.readexactly(_LENGTH.size))
        message: tuple[Any, ...] = pickle.loads(await self.reader.readexactly(length))
        return message


class Wire(wire.Receiver):
    """edgeserve.workers.wire: msgpack, streamed, every field checked."""

    encode = staticmethod(wire.encode)


CODECS: dict[str, type[Pickled] | type[Wire]] = {
    "pickle, length-prefixed (before)": Pickled,
    "wire: msgpack streamed, checked": Wire,
}


def _answer_async(sock: socket.socket, name: str, count: int) -> None:
    import uvloop

    codec = CODECS[name]

    async def answer() -> None:
        reader, writer = await asyncio.open_unix_connection(sock=sock)
        receiver = codec(reader)
        for _ in range(count):
            message = await receiver.receive(wire.FROM_FRONT)
            writer.write(codec.encode((wire.DONE, message[1], DONE[2])))

    uvloop.run(answer())


def message_round_trips(name: str, count: int) -> list[float]:
    """SUBMIT -> DONE under uvloop at both ends, each side encoding and decoding with `name`."""
    import uvloop

    parent, child = socket.socketpair()
    worker = mp.Process(target=_answer_async, args=(child, name, count))
    worker.start()
    codec, times = CODECS[name], []

    async def ask() -> None:
        reader, writer = await asyncio.open_unix_connection(sock=parent)
        receiver = codec(reader)
        for key in range(count):
            started = time.perf_counter()
            writer.write(codec.encode((wire.SUBMIT, key, *SUBMIT[2:])))
            await receiver.receive(wire.TO_FRONT)
            times.append(time.perf_counter() - started)

    uvloop.run(ask())
    worker.join()
    return times


def in_flight_per_s(name: str, count: int, window: int = IN_FLIGHT) -> float:
    """Round trips a second with `window` SUBMITs always in flight (a busy front): answers
    arrive bunched, and a read may carry several."""
    import uvloop

    parent, child = socket.socketpair()
    worker = mp.Process(target=_answer_async, args=(child, name, count))
    worker.start()
    codec = CODECS[name]

    async def ask() -> float:
        reader, writer = await asyncio.open_unix_connection(sock=parent)
        receiver = codec(reader)
        started = time.perf_counter()
        for key in range(window):
            writer.write(codec.encode((wire.SUBMIT, key, *SUBMIT[2:])))
        for key in range(window, count + window):
            await receiver.receive(wire.TO_FRONT)
            if key < count:
                writer.write(codec.encode((wire.SUBMIT, key, *SUBMIT[2:])))
        return count / (time.perf_counter() - started)

    rate = uvloop.run(ask())
    worker.join()
    return rate


def codec_us(name: str, count: int) -> float:
    """Receiving a SUBMIT and a DONE that have arrived (encoding, reading, decoding), each."""
    codec = CODECS[name]

    async def receive() -> float:
        reader = asyncio.StreamReader()
        receiver = codec(reader)
        started = time.perf_counter()
        for _ in range(count):
            reader.feed_data(codec.encode(SUBMIT) + codec.encode(DONE))
            await receiver.receive(wire.FROM_FRONT)
            await receiver.receive(wire.TO_FRONT)
        return (time.perf_counter() - started) / count * 1e6

    return asyncio.run(receive())


def _row(name: str, times: list[float]) -> str:
    times = sorted(times)
    p50, p99 = statistics.median(times), times[int(len(times) * 0.99)]
    return f"| {name} | {p50 * 1e6:.1f} | {p99 * 1e6:.1f} | {len(times) / sum(times):.0f} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=5000)
    args = parser.parse_args()
    print(f"{args.count} round trips of {len(MESSAGE)} bytes, {os.cpu_count()} cores")
    print("| channel | p50 us | p99 us | round trips/s |")
    print("|---|---|---|---|")
    for name, channel in CHANNELS.items():
        print(_row(name, channel(args.count)))
    print(f"\nSUBMIT -> DONE, asyncio (uvloop) both ends, {args.count} round trips")
    print(
        "| codec | p50 us | p99 us | round trips/s "
        f"| {IN_FLIGHT} in flight, round trips/s | send + receive both, us |"
    )
    print("|---|---|---|---|---|---|")
    for name in CODECS:
        row = _row(name, message_round_trips(name, args.count))
        rate = in_flight_per_s(name, args.count * 4)
        print(f"{row} {rate:.0f} | {codec_us(name, args.count):.1f} |")


if __name__ == "__main__":
    main()
