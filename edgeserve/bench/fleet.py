"""Load from several processes (`edgeserve bench --processes N`), and the client's own CPU.

One event loop drives about 20,000 requests/s per core (docs/bench.md): enough for a server on
a few cores, not for one using sixteen. With N processes the bench's own process runs one share
of the load and N - 1 helpers run the others (connections or the Poisson rate split evenly);
at every window cut each helper hands over the records that ended before the cut, so windows
and the stability rule see every request, in completion order.

Each process also reports the CPU it used over the measured windows: a load process busy
`SATURATED` of a core or more was the limit of the measurement, and the report says so.
"""

from __future__ import annotations

import asyncio
import itertools
import multiprocessing
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from edgeserve.bench.loadgen import Request, Target, closed_loop, open_loop
from edgeserve.bench.measure import Record

SATURATED = 0.9
"""Share of one core above which a load process counts as the limit."""


@dataclass(frozen=True)
class Share:
    """One process's part of a level: connections (closed loop) or requests/s (open loop)."""

    mode: str
    value: float
    seed: int


def shares(mode: str, value: float, processes: int, seed: int) -> list[Share]:
    """`value` split over `processes`: whole connections, or an even share of the rate."""
    if mode == "concurrency":
        base, extra = divmod(int(value), processes)
        counts = [base + (index < extra) for index in range(processes)]
        return [Share(mode, c, seed + index) for index, c in enumerate(counts) if c]
    return [Share(mode, value / processes, seed + index) for index in range(processes)]


async def run_share(target: Target, share: Share, stop: asyncio.Event) -> None:
    if share.mode == "concurrency":
        await closed_loop(target, int(share.value), stop)
    else:
        await open_loop(target, share.value, stop, share.seed)


class CpuMeter:
    """This process's CPU time as a share of one core, between two `read`s."""

    def __init__(self) -> None:
        self._cpu, self._wall = time.process_time(), time.monotonic()

    def read(self) -> float:
        cpu, wall = time.process_time(), time.monotonic()
        share = (cpu - self._cpu) / max(wall - self._wall, 1e-9)
        self._cpu, self._wall = cpu, wall
        return share


class Fleet:
    """The helper processes of one bench run: started once, given a share at each level."""

    def __init__(self, host: str, port: int, requests: list[Request], helpers: int) -> None:
        context = multiprocessing.get_context("spawn")  # no forked event loop, no forked locks
        self._pipes: list[Connection] = []
        self._processes = []
        for _ in range(helpers):
            ours, theirs = context.Pipe()
            process = context.Process(target=_helper, args=(theirs, host, port, requests))
            process.start()
            self._pipes.append(ours)
            self._processes.append(process)
        for pipe in self._pipes:  # started and imported: a level then starts in every process
            pipe.recv()

    @property
    def size(self) -> int:
        return len(self._processes)

    def start(self, shares: list[Share]) -> None:
        for pipe, share in zip(self._pipes, shares, strict=False):
            pipe.send(("start", share))

    async def cut(self, end: float) -> tuple[list[Record], list[float]]:
        """Every helper's records that ended before `end`, and each one's CPU since the last cut."""
        return await self._ask(("cut", end))

    async def stop(self) -> tuple[list[Record], list[float]]:
        return await self._ask(("stop",))

    async def _ask(self, command: tuple[Any, ...]) -> tuple[list[Record], list[float]]:
        for pipe in self._pipes:
            pipe.send(command)
        answers = await asyncio.gather(*(asyncio.to_thread(pipe.recv) for pipe in self._pipes))
        records = list(itertools.chain.from_iterable(a[0] for a in answers))
        return records, [a[1] for a in answers]

    def close(self) -> None:
        for pipe in self._pipes:
            pipe.send(("exit",))
        for process in self._processes:
            process.join(10)
            if process.is_alive():
                process.kill()


def _helper(pipe: Connection, host: str, port: int, requests: list[Request]) -> None:
    """A helper's main: obey the parent's commands until told to exit."""
    try:
        import uvloop

        uvloop.run(_obey(pipe, Target(host, port, requests)))
    except ImportError:  # pragma: no cover - uvloop comes with uvicorn[standard]
        asyncio.run(_obey(pipe, Target(host, port, requests)))


async def _obey(pipe: Connection, target: Target) -> None:
    stop, load, consumed, meter = asyncio.Event(), None, 0, CpuMeter()
    pipe.send("ready")
    while True:
        command = await asyncio.to_thread(pipe.recv)
        if command[0] == "start":
            target.records, consumed, stop = [], 0, asyncio.Event()
            load = asyncio.create_task(run_share(target, command[1], stop))
            meter = CpuMeter()
        elif command[0] == "cut":
            done = _ended_before(target.records[consumed:], command[1])
            consumed += len(done)
            pipe.send((done, meter.read()))
        elif command[0] == "stop":
            stop.set()
            if load is not None:
                await load
            pipe.send(([], meter.read()))
        else:
            return


def _ended_before(records: list[Record], end: float) -> list[Record]:
    """The leading records (completion order) that ended before `end`."""
    return list(itertools.takewhile(lambda record: record.ended < end, records))
