"""The load generator: lean asyncio over raw HTTP/1.1 keep-alive connections.

It shares a small machine with the server it measures, so it must cost little: requests are
encoded to bytes once, responses are parsed only as far as the status line and the body length,
and each connection carries one request at a time (no client library, no per-request objects
beyond one Record). docs/bench.md states its ceiling on this machine and the comparison to httpx.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Awaitable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from edgeserve.bench.measure import Record

OPEN_LOOP_MAX_CONNECTIONS = 512
STOP_WAIT_S = 10.0
BROKEN_PAUSE_S = 0.01
FAILURE_BODY_CHARS = 500
_BROKEN = (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError)


@dataclass(frozen=True)
class Request:
    """One request as the bytes to write, and how many items (batch rows) it carries."""

    raw: bytes
    items: int


def encode_request(host: str, path: str, headers: dict[str, str], body: bytes) -> bytes:
    """A complete HTTP/1.1 POST (or GET for an empty body), ready to write as is."""
    method = "POST" if body else "GET"
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}", f"Content-Length: {len(body)}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


class Connection:
    """One keep-alive connection; `exchange` writes a request and drains its response."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self.body = b""  # the last response's body (empty when it came chunked)

    @classmethod
    async def open(cls, host: str, port: int) -> Connection:
        reader, writer = await asyncio.open_connection(host, port)
        return cls(reader, writer)

    async def exchange(self, raw: bytes) -> int:
        """Send one request and read its response; the status code."""
        self._writer.write(raw)
        head = await self._reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        length, chunked = _body_framing(head)
        self.body = b""
        if chunked:
            await self._drain_chunks()
        elif length:
            self.body = await self._reader.readexactly(length)
        return status

    async def _drain_chunks(self) -> None:
        while True:
            size = int((await self._reader.readuntil(b"\r\n")).split(b";")[0], 16)
            await self._reader.readexactly(size + 2)
            if size == 0:
                return

    async def close(self) -> None:
        self._writer.close()
        with contextlib.suppress(OSError, ConnectionError):
            await self._writer.wait_closed()


def _body_framing(head: bytes) -> tuple[int, bool]:
    """(Content-Length, chunked?) from a response head, scanning only the header names."""
    length, chunked = 0, False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        lowered = name.lower()
        if lowered == b"content-length":
            length = int(value)
        elif lowered == b"transfer-encoding" and b"chunked" in value.lower():
            chunked = True
    return length, chunked


class Target:
    """Where the load goes, and the records it leaves behind."""

    def __init__(self, host: str, port: int, requests: Sequence[Request]) -> None:
        self.host = host
        self.port = port
        self.requests = requests
        self.records: list[Record] = []
        self.first_failure: str | None = None  # what the first failed request got, as words

    async def send(
        self, connection: Connection | None, index: int, scheduled: float
    ) -> Connection | None:
        """One request on `connection` (opened if None); appends its Record and returns the
        connection to reuse, or None when it broke (after a short pause, so a dead server is
        not hammered in a tight loop)."""
        request = self.requests[index % len(self.requests)]
        sent = time.monotonic()
        try:
            connection, status = await self._exchange(connection, request.raw)
        except _BROKEN as exc:
            connection, status = None, 0
            self._failed(f"no answer: {type(exc).__name__}: {exc}")
        if status not in (0, 200):
            self._failed(_describe(status, connection.body if connection else b""))
        self.records.append(Record(scheduled, sent, time.monotonic(), status == 200, request.items))
        if connection is None:
            await asyncio.sleep(BROKEN_PAUSE_S)
        return connection

    def _failed(self, reason: str) -> None:
        if self.first_failure is None:
            self.first_failure = reason

    async def _exchange(self, connection: Connection | None, raw: bytes) -> tuple[Connection, int]:
        if connection is not None:
            try:
                return connection, await connection.exchange(raw)
            except _BROKEN:  # the server may have closed an idle keep-alive connection: retry once
                await connection.close()
        connection = await Connection.open(self.host, self.port)
        try:
            return connection, await connection.exchange(raw)
        except _BROKEN:
            await connection.close()
            raise


def _describe(status: int, body: bytes) -> str:
    """`HTTP 400: {"error": ...}`, the body cut to a readable length."""
    text = body.decode("utf-8", "replace").strip()
    return f"HTTP {status}: {text[:FAILURE_BODY_CHARS] or '(empty body)'}"


async def closed_loop(target: Target, concurrency: int, stop: asyncio.Event) -> None:
    """`concurrency` workers, one connection each, each sending as soon as its last answer came."""

    async def worker(offset: int) -> None:
        connection: Connection | None = None  # opened by the first send
        index = offset
        while not stop.is_set():
            connection = await target.send(connection, index, time.monotonic())
            index += concurrency
        if connection is not None:
            await connection.close()

    workers = [asyncio.create_task(worker(i)) for i in range(concurrency)]
    await stop.wait()
    await _finish(asyncio.gather(*workers))


def poisson_intervals(rate: float, seed: int) -> Iterator[float]:
    """Gaps between sends of a Poisson process of `rate` per second (exponential, seeded)."""
    rng = random.Random(seed)
    while True:
        yield rng.expovariate(rate)


async def open_loop(target: Target, rate: float, stop: asyncio.Event, seed: int = 0) -> None:
    """Send on a Poisson schedule whatever the answers; a send waiting for a free connection
    is late, and its lag is recorded rather than hidden."""
    pool = _Pool(target)
    tasks: set[asyncio.Task[None]] = set()
    scheduled = time.monotonic()
    for index, gap in enumerate(poisson_intervals(rate, seed)):
        scheduled += gap
        await asyncio.sleep(max(0.0, scheduled - time.monotonic()))
        if stop.is_set():
            break
        connection = await pool.take()
        task = asyncio.create_task(pool.send(connection, index, scheduled))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    await _finish(asyncio.gather(*tasks))
    await pool.close()


class _Pool:
    """Idle connections for the open loop; grows up to OPEN_LOOP_MAX_CONNECTIONS."""

    def __init__(self, target: Target) -> None:
        self._target = target
        self._idle: asyncio.Queue[Connection] = asyncio.Queue()
        self._opened = 0

    async def take(self) -> Connection | None:
        """An idle connection, a new one while under the cap, else wait for one to free up."""
        if self._idle.empty() and self._opened < OPEN_LOOP_MAX_CONNECTIONS:
            self._opened += 1
            return None  # Target.send opens it: the wait is then part of the send
        return await self._idle.get()

    async def send(self, connection: Connection | None, index: int, scheduled: float) -> None:
        connection = await self._target.send(connection, index, scheduled)
        if connection is None:
            self._opened -= 1
        else:
            await self._idle.put(connection)

    async def close(self) -> None:
        while not self._idle.empty():
            await self._idle.get_nowait().close()


async def _finish(work: Awaitable[Any]) -> None:
    """Let in-flight requests end (bounded), so the next level starts on a quiet server."""
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(work, STOP_WAIT_S)
