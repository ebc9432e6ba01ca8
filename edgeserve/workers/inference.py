"""The inference process: the backend and the one batcher, fed by every front.

    load -> warm up -> listen on the unix socket (its existence means ready) -> serve fronts
    SIGUSR1 (the fronts begin to drain): run what is queued without waiting for company
    SIGTERM (the fronts have drained by then): stop accepting -> drain the batcher -> exit

Each front connects once, handing over its arena with its hello. A SUBMIT becomes a task that
reads the inputs in place, awaits the batcher and writes the outputs back into the request's
block; a front that goes away has its tasks cancelled, so its queued items are dropped.
After every change of the queue the board gets the queued rows: the fronts' admission reads it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
from collections.abc import Coroutine
from functools import partial
from pathlib import Path
from typing import Any

from edgeserve.errors import BackendError, EdgeserveError, Unavailable
from edgeserve.http.timeouts import Timeouts
from edgeserve.memory import freeze_long_lived
from edgeserve.runtime import LocalEngine, Runtime
from edgeserve.workers import wire
from edgeserve.workers.arena import Arena
from edgeserve.workers.board import Board, SharedStats
from edgeserve.workers.layout import ChildConfig, child_main, run_loop

log = logging.getLogger("edgeserve")


class InferenceServer:
    """Serves the fronts' SUBMITs with one engine; publishes the queue's length on the board."""

    def __init__(self, engine: LocalEngine, board: Board) -> None:
        self.engine = engine
        self.board = board
        self.fronts: set[asyncio.Task[None]] = set()

    async def accept(self, listener: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            conn, _ = await loop.sock_accept(listener)
            conn.setblocking(True)
            conn.settimeout(5.0)  # the front sends its hello right after connecting
            try:
                hello, fds = wire.receive_hello(conn)
            except (OSError, ConnectionError) as exc:
                log.warning("a front's hello failed: %s", exc)
                conn.close()
                continue
            conn.setblocking(False)
            reader, writer = await asyncio.open_unix_connection(sock=conn)
            wire.send(writer, (wire.HELLO, self.engine.backend_name, self.engine.profile))
            arena = Arena(fds[0], hello["arena_bytes"])
            task = asyncio.create_task(self.serve_front(reader, writer, arena, hello["front"]))
            self.fronts.add(task)
            task.add_done_callback(self.fronts.discard)

    async def serve_front(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        arena: Arena,
        front: int,
    ) -> None:
        tasks: dict[int, asyncio.Task[None]] = {}
        loop = asyncio.get_running_loop()
        try:
            while True:
                message = await wire.receive(reader)
                kind, key = message[0], message[1]
                if kind in (wire.SUBMIT, wire.WAIT):
                    work = (
                        self._run(arena, *message[2:])
                        if kind == wire.SUBMIT
                        else (self.engine.admit(message[2]))
                    )
                    tasks[key] = asyncio.create_task(self._answer(writer, key, work))
                    tasks[key].add_done_callback(partial(_forget, tasks, key))
                    loop.call_soon(self._publish)  # after the task has queued its rows
                elif kind == wire.CANCEL and key in tasks:
                    tasks[key].cancel()
        except (asyncio.IncompleteReadError, ConnectionError):
            log.info("front %d went away: dropping its %d requests", front, len(tasks))
        finally:
            for task in list(tasks.values()):
                task.cancel()
            await asyncio.gather(*tasks.values(), return_exceptions=True)
            writer.close()
            arena.close()
            self._publish()

    async def _answer(
        self, writer: asyncio.StreamWriter, key: int, work: Coroutine[Any, Any, Any]
    ) -> None:
        """Await `work` and send its outcome: exactly one DONE per SUBMIT or WAIT."""
        try:
            reply = await work
        except asyncio.CancelledError:
            work.close()  # cancelled before it started: no "never awaited" warning
            reply = Unavailable("cancelled: the client went away")
        except EdgeserveError as exc:
            reply = exc
        except Exception as exc:  # a fault of ours: logged here, a plain error for the front
            log.exception("request %d failed", key)
            reply = BackendError(f"{type(exc).__name__}: {exc}")
        finally:
            self._publish()
        if not writer.is_closing():
            wire.send(writer, (wire.DONE, key, reply))

    async def _run(
        self, arena: Arena, placed: Any, block: tuple[int, int], deadline: float, arrived: float
    ) -> Any:
        """Inputs in place from the arena; outputs written back into the request's block."""
        outputs = await self.engine.submit(arena.tensors(placed), deadline, arrived)
        return arena.place(outputs, *block)

    def _publish(self) -> None:
        self.board.publish_queue(self.engine.batcher.queued_rows, self.engine.batcher.door.waiting)


def _forget(tasks: dict[int, asyncio.Task[None]], key: int, _: object) -> None:
    tasks.pop(key, None)


async def serve_inference(config: ChildConfig) -> None:
    """Load, warm up, then serve fronts on `config.socket_path` until SIGTERM."""
    bundle = config.open_bundle()
    board = Board(config.board_fd, config.fronts, bundle.manifest.batching.max_batch_size)
    stats = SharedStats(bundle.name, bundle.manifest.function.model_version, board, None)
    runtime = Runtime.load(bundle, backend=config.backend, stats=stats)
    await runtime.start()
    freeze_long_lived()
    assert isinstance(runtime.engine, LocalEngine)  # Runtime.load builds the local one
    server = InferenceServer(runtime.engine, board)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    loop.add_signal_handler(signal.SIGUSR1, runtime.engine.hurry)  # the fronts are draining
    Path(config.socket_path).unlink(missing_ok=True)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(config.socket_path)
    listener.listen(64)
    listener.setblocking(False)
    accepting = asyncio.create_task(server.accept(listener))
    log.info("inference process ready (pid %d)", os.getpid())
    await stop.wait()
    # the fronts have drained by now (the supervisor stops them first): what is left is bounded
    accepting.cancel()
    listener.close()
    limits = Timeouts.from_resources(bundle.manifest.resources, **config.timeouts)
    await runtime.stop(limits.drain_s)


if __name__ == "__main__":
    child_main(lambda config: run_loop(serve_inference(config)))
