"""An inference process: the backend on its one device and the batcher, fed by every front.

    load -> warm up -> listen on the unix socket (its existence means ready) -> serve fronts
    SIGTERM (the fronts drain at the same time): stop accepting fronts, run what they send
        without waiting for company -> once every front has gone (at most the drain bound),
        stop the batcher -> exit

Each front connects once, handing over its arena with its hello. A SUBMIT becomes a task that
reads the inputs in place, awaits the batcher and writes the outputs back into the request's
block; a front that goes away has its tasks cancelled, so its queued items are dropped.
After every change of the queue its slot on the board gets the queued rows: the fronts'
admission reads them. The supervisor gives it its device (CUDA_VISIBLE_DEVICES, EDGESERVE_DEVICE).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
from collections.abc import Coroutine
from contextvars import Context, copy_context
from functools import partial
from pathlib import Path
from typing import Any

from edgeserve.batching import ONE_REQUEST
from edgeserve.engine import LocalEngine
from edgeserve.errors import BackendError, EdgeserveError, Unavailable
from edgeserve.http.timeouts import Timeouts
from edgeserve.memory import freeze_long_lived
from edgeserve.runtime import Runtime
from edgeserve.workers import wire
from edgeserve.workers.arena import Arena
from edgeserve.workers.board import Board
from edgeserve.workers.child import ChildConfig, child_main, run_loop
from edgeserve.workers.statistics import SharedStats

log = logging.getLogger("edgeserve")


class InferenceServer:
    """Serves the fronts' SUBMITs with one engine; publishes the queue's length on the board."""

    def __init__(self, engine: LocalEngine, board: Board, instance: int) -> None:
        self.engine = engine
        self.board = board
        self.instance = instance
        self.fronts: set[asyncio.Task[None]] = set()

    async def accept(self, listener: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            conn, _ = await loop.sock_accept(listener)
            conn.setblocking(True)
            conn.settimeout(5.0)  # the front sends its hello right after connecting
            try:
                hello, fds = wire.receive_hello(conn)
            except (OSError, wire.Malformed) as exc:
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
        receiver = wire.Receiver(reader)
        try:
            while True:
                message = await receiver.receive(wire.FROM_FRONT)
                kind, key = message[0], message[1]
                if kind == wire.CANCEL:
                    if key in tasks:
                        tasks[key].cancel()
                    continue
                if kind == wire.SUBMIT:
                    *fields, request = message[2:]
                    work = self._run(arena, *fields)
                    context = _one_request(writer, request)
                else:
                    work, context = self.engine.admit(message[2]), None
                task = asyncio.create_task(self._answer(writer, key, work), context=context)
                tasks[key] = task
                task.add_done_callback(partial(_forget, tasks, key))
                loop.call_soon(self._publish)  # after the task has queued its rows
        except (asyncio.IncompleteReadError, ConnectionError):
            log.info("front %d went away: dropping its %d requests", front, len(tasks))
        except wire.Malformed as exc:
            log.error("front %d sent %s: dropping it and its %d requests", front, exc, len(tasks))
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
        if writer.is_closing():
            return
        try:
            frame = wire.encode((wire.DONE, key, reply))
        except wire.Malformed as exc:  # outputs holding objects other than str and bytes
            log.error("request %d: its answer cannot cross to the front: %s", key, exc)
            frame = wire.encode(
                (wire.DONE, key, BackendError(f"an output that cannot cross: {exc}"))
            )
        writer.write(frame)

    async def _run(
        self, arena: Arena, placed: Any, block: tuple[int, int], deadline: float, arrived: float
    ) -> Any:
        """Inputs in place from the arena; outputs written back into the request's block."""
        outputs = await self.engine.submit(arena.tensors(placed), deadline, arrived)
        return arena.place(outputs, *block)

    async def drain(self, bound_s: float) -> None:
        """SIGTERM reached the fronts at the same time: run what they send without waiting for
        company until every front has gone, at most `bound_s` (at the bound the fronts answer
        what is left 503 themselves)."""
        self.engine.hurry()
        if self.fronts:
            await asyncio.wait(self.fronts, timeout=bound_s)

    def _publish(self) -> None:
        batcher = self.engine.batcher
        self.board.publish_queue(self.instance, batcher.queued_rows, batcher.door.waiting)


def _one_request(writer: asyncio.StreamWriter, request: int | None) -> Context | None:
    """The context a SUBMIT runs in: a front's request of several items is one request here
    too (ONE_REQUEST, told apart from other fronts' by their connection), so when one item
    fails its waiting siblings fail with it instead of costing compute."""
    if request is None:
        return None
    context = copy_context()
    context.run(ONE_REQUEST.set, (writer, request))
    return context


def _forget(tasks: dict[int, asyncio.Task[None]], key: int, _: object) -> None:
    tasks.pop(key, None)


async def serve_inference(config: ChildConfig) -> None:
    """Load, warm up, then serve fronts on its socket until SIGTERM."""
    bundle = config.open_bundle()
    batching = bundle.manifest.batching
    board = Board(config.board_fd, config.fronts, config.instances, batching.max_batch_size)
    name, version = bundle.name, bundle.manifest.function.model_version
    stats = SharedStats(name, version, board, config.devices, instance=config.instance)
    runtime = Runtime.load(bundle, backend=config.backend, stats=stats)
    await runtime.start()
    freeze_long_lived()
    assert isinstance(runtime.engine, LocalEngine)  # Runtime.load builds the local one
    server = InferenceServer(runtime.engine, board, config.instance)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    socket_path = config.socket_path(config.instance)
    Path(socket_path).unlink(missing_ok=True)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(socket_path)
    listener.listen(64)
    listener.setblocking(False)
    accepting = asyncio.create_task(server.accept(listener))
    device = config.devices[config.instance]
    log.info("inference process %d ready on %s (pid %d)", config.instance, device, os.getpid())
    await stop.wait()
    limits = Timeouts.from_resources(bundle.manifest.resources, **config.timeouts)
    accepting.cancel()
    listener.close()
    await server.drain(limits.drain_s)
    await runtime.stop(limits.drain_s)  # nothing queued is left: at most the batch running


if __name__ == "__main__":
    child_main(lambda config: run_loop(serve_inference(config)))
