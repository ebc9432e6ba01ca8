"""A front's connection to one inference process: connect, ask, answer, reconnect.

The front hands its arena over in the hello of every connection (each inference process reads
the same arena). While the inference process is away (starting, restarting) the link is not
ready; the requests it held when it went are answered 503 with Retry-After, at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import socket
from collections.abc import Callable
from typing import Any

from edgeserve.errors import BackendError, Unavailable
from edgeserve.shapes import ShapeProfile
from edgeserve.workers import wire
from edgeserve.workers.arena import Arena

log = logging.getLogger("edgeserve")

RECONNECT_S = 0.05
RETRY_AFTER_S = 1.0


class Link:
    """Front `front`'s line to inference process `instance`; `free(offset, size)` gives a
    request's arena block back once its answer came (or never will)."""

    def __init__(
        self,
        socket_path: str,
        instance: int,
        front: int,
        arena: Arena,
        free: Callable[[int, int], None],
    ) -> None:
        self.socket_path = socket_path
        self.instance = instance
        self.front = front
        self.arena = arena
        self._free = free
        self._ids = itertools.count(1)
        self._pending: dict[int, tuple[asyncio.Future[Any], int, int]] = {}
        self._grants: dict[int, Callable[[], None]] = {}  # WAITs: taken when let in
        self._sender: wire.Sender | None = None
        self.connected = asyncio.Event()  # set once, at the first connection
        self._keeper: asyncio.Task[None] | None = None
        self._stopping = False
        self.backend_name = "?"
        self.profile: ShapeProfile | None = None  # told by the inference process (HELLO)

    @property
    def ready(self) -> bool:
        return self._sender is not None

    def start(self) -> None:
        """Connect, and keep connecting whenever the inference process goes away."""
        self._keeper = asyncio.create_task(self._keep_connected())

    def stop(self) -> None:
        self._stopping = True  # the front's own shutdown: nothing went away
        if self._keeper is not None:
            self._keeper.cancel()
        if self._sender is not None:
            self._sender.close()

    async def ask(
        self,
        message: tuple[Any, ...],
        offset: int,
        size: int,
        sent: Callable[[], None] | None = None,
        granted: Callable[[], None] | None = None,
    ) -> Any:
        """Send (kind, key, *rest) and await its DONE; `offset`, `size`: the block it holds.
        `sent` is called once the message is sent (never, when it cannot be); `granted` as a
        good DONE arrives, whether or not its asker still waits."""
        sender = self._sender
        if sender is None:
            self._free(offset, size)
            raise Unavailable(f"inference process {self.instance} is restarting", RETRY_AFTER_S)
        key = next(self._ids)
        try:
            frame = wire.encode((message[0], key, *message[1:]))
        except wire.Malformed as exc:  # a tensor of objects other than str and bytes
            self._free(offset, size)
            raise BackendError(f"cannot hand the request to the inference process: {exc}") from None
        future = asyncio.get_running_loop().create_future()
        self._pending[key] = (future, offset, size)
        if granted is not None:
            self._grants[key] = granted
        sender.put(frame)
        if sent is not None:
            sent()
        try:
            return await future
        except asyncio.CancelledError:
            if key in self._pending and not sender.closing:
                sender.send((wire.CANCEL, key))  # its block is freed by the answer
            raise

    async def _keep_connected(self) -> None:
        while True:
            try:
                receiver = await self._connect()
            except (OSError, asyncio.IncompleteReadError, wire.Malformed) as exc:
                if isinstance(exc, wire.Malformed):
                    log.error(
                        "front %d: a wrong hello from inference process %d: %s",
                        self.front,
                        self.instance,
                        exc,
                    )
                await asyncio.sleep(RECONNECT_S)
                continue
            self.connected.set()
            log.info("front %d: connected to inference process %d", self.front, self.instance)
            try:
                await self._read(receiver)
            finally:
                self._disconnected()

    async def _connect(self) -> wire.Receiver:
        """Connect and hand over the arena; ready once the inference process says hello."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(self.socket_path)
            hello = {"front": self.front, "arena_bytes": self.arena.size}
            wire.send_hello(sock, hello, [self.arena.fd])
        except OSError:
            sock.close()
            raise
        sock.setblocking(False)
        reader, writer = await asyncio.open_unix_connection(sock=sock)
        receiver = wire.Receiver(reader)
        try:
            _, self.backend_name, self.profile = await receiver.receive({wire.HELLO})
        except BaseException:
            writer.close()
            raise
        self._sender = wire.Sender(writer)
        return receiver

    async def _read(self, receiver: wire.Receiver) -> None:
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:
                try:
                    _, key, result = await receiver.receive({wire.DONE})
                    future, offset, size = self._pending.pop(key)
                except (wire.Malformed, KeyError) as exc:
                    log.error(
                        "front %d: a wrong answer from inference process %d (%r): disconnecting",
                        self.front,
                        self.instance,
                        exc,
                    )
                    return
                granted = self._grants.pop(key, None)
                if granted is not None and not isinstance(result, BaseException):
                    granted()
                if not future.done():
                    if isinstance(result, BaseException):
                        future.set_exception(result)
                    else:
                        future.set_result(result and self.arena.copied(result))
                self._free(offset, size)

    def _disconnected(self) -> None:
        """The inference process is gone: what it held is answered 503, its blocks are free."""
        if self._sender is not None:
            self._sender.close()
            if not self._stopping:
                log.warning("front %d: inference process %d went away", self.front, self.instance)
        self._sender = None
        error = Unavailable(f"inference process {self.instance} restarted; retry", RETRY_AFTER_S)
        for future, offset, size in self._pending.values():
            if not future.done():
                future.set_exception(error)
            self._free(offset, size)
        self._pending.clear()
        self._grants.clear()
