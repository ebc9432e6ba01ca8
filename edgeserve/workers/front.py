"""A front process: uvicorn on the shared socket, decoding and the handler, batches elsewhere.

A front is a whole `Runtime` (the same checks at the door, the same handler calls, the same
statistics) whose engine is a `RemoteEngine`: rows go to the inference process through this
front's arena, written once, and come back the same way.

While the inference process is away (starting, restarting) the front is not ready: readiness
says 503, requests are refused with 503 and Retry-After, and those it held are answered 503.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import socket
from pathlib import Path
from typing import Any

from edgeserve.batching import ONE_REQUEST, BatchPolicy
from edgeserve.errors import BackendError, PayloadTooLarge, Unavailable
from edgeserve.http.app import create_app
from edgeserve.http.server import DrainingServer, uvicorn_config
from edgeserve.http.timeouts import Timeouts
from edgeserve.http.tls import TlsFiles
from edgeserve.runtime import Runtime
from edgeserve.shapes import ShapeProfile
from edgeserve.sharedmemory import Regions
from edgeserve.types import TensorDict
from edgeserve.workers import wire
from edgeserve.workers.arena import Arena, Blocks, block_size
from edgeserve.workers.board import Board, SharedStats
from edgeserve.workers.layout import ChildConfig, child_main
from edgeserve.workers.supervisor import reuse_port_socket

log = logging.getLogger("edgeserve")

ARENA_BYTES = 256 * 2**20
"""Virtual size of a front's arena; memory is taken only as blocks are first used."""
LISTEN_BACKLOG = 2048
RECONNECT_S = 0.05
RETRY_AFTER_S = 1.0


class RemoteEngine:
    """The inference process, seen from a front: submit, cancel, readiness, admission."""

    def __init__(self, socket_path: str, front: int, board: Board, policy: BatchPolicy) -> None:
        self.socket_path = socket_path
        self.front = front
        self.board = board
        self.policy = policy
        self.arena = Arena.create(ARENA_BYTES)
        self._blocks = Blocks(ARENA_BYTES)
        self._ids = itertools.count(1)
        self._pending: dict[int, tuple[asyncio.Future[TensorDict], int, int]] = {}
        self._writer: asyncio.StreamWriter | None = None
        self._connected = asyncio.Event()
        self._keeper: asyncio.Task[None] | None = None
        self.backend_name = "?"
        self.profile: ShapeProfile | None = None  # told by the inference process (HELLO)

    @property
    def ready(self) -> bool:
        return self._writer is not None

    async def start(self) -> None:
        """Connect, and keep connecting whenever the inference process goes away."""
        self._keeper = asyncio.create_task(self._keep_connected())
        await self._connected.wait()

    async def stop(self, drain_timeout_s: float) -> None:
        # uvicorn has drained this front's requests before its lifespan stops the runtime
        if self._keeper is not None:
            self._keeper.cancel()
        if self._writer is not None:
            self._writer.close()

    async def admit(self, deadline: float) -> None:
        """Straight in while the board shows room and nobody waiting; else wait in the inference
        process's line (edgeserve.door), which is one for every front."""
        if self.board.queued_rows < self.policy.max_queue_size and not self.board.waiting:
            return
        await self._ask((wire.WAIT, deadline), 0, 0)

    def hurry(self) -> None:
        """Nothing to do here: the supervisor tells the inference process (SIGUSR1) as it
        starts the drain, once for every front."""

    def check_room(self, rows: int) -> None:
        """A request of several items (the handler's): refused at once if the board shows no
        room for all of them (the inference process still checks each item)."""
        queued, limit = self.board.queued_rows, self.policy.max_queue_size
        if rows > limit:
            raise PayloadTooLarge(
                f"request of {rows} rows exceeds max_queue_size ({limit} rows), which the "
                "queue can never hold. Hint: raise [batching] max_queue_size in function.toml"
            )
        if queued + rows > limit:
            raise Unavailable(f"queue full: {queued} of {limit} rows waiting", RETRY_AFTER_S)

    async def submit(self, inputs: TensorDict, deadline: float, arrived: float) -> TensorDict:
        size = block_size(inputs)
        offset = self._blocks.allocate(size) if size else None
        if offset is None:  # arena full (or BYTES only): the tensors travel inline
            offset, size = 0, 0
        placed = self.arena.place(inputs, offset, size)
        request = ONE_REQUEST.get()  # a handler's items: they share one outcome
        request = request if isinstance(request, int) else None
        result: TensorDict = await self._ask(
            (wire.SUBMIT, placed, (offset, size), deadline, arrived, request), offset, size
        )
        return result

    async def _ask(self, message: tuple[Any, ...], offset: int, size: int) -> Any:
        """Send (kind, key, *rest) and await its DONE; `offset`, `size`: the block it holds."""
        writer = self._writer
        if writer is None:
            self._free(offset, size)
            raise Unavailable("the inference process is restarting", RETRY_AFTER_S)
        key = next(self._ids)
        try:
            frame = wire.encode((message[0], key, *message[1:]))
        except wire.Malformed as exc:  # a tensor of objects other than str and bytes
            self._free(offset, size)
            raise BackendError(f"cannot hand the request to the inference process: {exc}") from None
        future = asyncio.get_running_loop().create_future()
        self._pending[key] = (future, offset, size)
        writer.write(frame)
        try:
            return await future
        except asyncio.CancelledError:
            if key in self._pending and not writer.is_closing():
                wire.send(writer, (wire.CANCEL, key))  # its block is freed by the answer
            raise

    async def _keep_connected(self) -> None:
        while True:
            try:
                receiver = await self._connect()
            except (OSError, asyncio.IncompleteReadError, wire.Malformed) as exc:
                if isinstance(exc, wire.Malformed):
                    log.error(
                        "front %d: a wrong hello from the inference process: %s", self.front, exc
                    )
                await asyncio.sleep(RECONNECT_S)
                continue
            self._connected.set()
            log.info("front %d: connected to the inference process", self.front)
            try:
                await self._read(receiver)
            finally:
                self._disconnected()

    async def _connect(self) -> wire.Receiver:
        """Connect and hand over the arena; ready once the inference process says hello."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(self.socket_path)
            hello = {"front": self.front, "arena_bytes": ARENA_BYTES}
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
        self._writer = writer
        return receiver

    async def _read(self, receiver: wire.Receiver) -> None:
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:
                try:
                    _, key, result = await receiver.receive({wire.DONE})
                    future, offset, size = self._pending.pop(key)
                except (wire.Malformed, KeyError) as exc:
                    log.error(
                        "front %d: a wrong answer from the inference process (%r): disconnecting",
                        self.front,
                        exc,
                    )
                    return
                if not future.done():
                    if isinstance(result, BaseException):
                        future.set_exception(result)
                    else:
                        future.set_result(result and self.arena.copied(result))
                self._free(offset, size)

    def _disconnected(self) -> None:
        """The inference process is gone: what it held is answered 503, its blocks are free."""
        if self._writer is not None:
            self._writer.close()
            log.warning("front %d: the inference process went away", self.front)
        self._writer = None
        error = Unavailable("the inference process restarted; retry", RETRY_AFTER_S)
        for future, offset, size in self._pending.values():
            if not future.done():
                future.set_exception(error)
            self._free(offset, size)
        self._pending.clear()

    def _free(self, offset: int, size: int) -> None:
        if size:
            self._blocks.free(offset, size)


def run_front(config: ChildConfig) -> None:
    """Serve HTTP on this front's socket with a Runtime whose engine is remote, under the same
    uvicorn settings, timeouts and drain as the one-process server (http/server.py)."""
    bundle = config.open_bundle()
    batching = bundle.manifest.batching
    board = Board(config.board_fd, config.fronts, batching.max_batch_size)
    policy = BatchPolicy.from_manifest(batching, batched=bundle.signature.batched)
    engine = RemoteEngine(config.socket_path, config.front, board, policy)
    stats = SharedStats(bundle.name, bundle.manifest.function.model_version, board, config.front)
    limits = Timeouts.from_resources(bundle.manifest.resources, **config.timeouts)
    regions = Regions(store=Path(config.regions_dir))  # one registry for every front
    app = create_app(Runtime(bundle, engine, stats), timeouts=limits, regions=regions)
    listener = reuse_port_socket(config.host, config.port)
    listener.listen(LISTEN_BACKLOG)
    tls = {} if config.tls is None else TlsFiles(**config.tls).uvicorn_options()
    settings = uvicorn_config(app, log_level=config.log_level, **tls)
    DrainingServer(settings).run(sockets=[listener])


if __name__ == "__main__":
    child_main(run_front)
