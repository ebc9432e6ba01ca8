"""An inference process: the backend on its one device and the batcher, fed by every front.

    load -> warm up -> listen on the unix socket (its existence means ready) -> serve fronts
    SIGTERM (the fronts drain at the same time): stop accepting fronts, run what they send
        without waiting for company -> once every front has gone (at most the drain bound),
        stop the batcher -> exit

Each front connects once, handing over its arena with its hello. A SUBMIT queues its inputs,
read in place, in the batcher; a callback writes the outputs back into the request's block and
sends the DONE (no task per request: this one event loop serves every front's items, and what
it spends per item is what bounds a GPU fed with small requests). A front that goes away has
its requests cancelled, so its queued items are dropped.
Once per turn of the event loop that changed the queue, its slot on the board gets the queued
rows: the fronts' admission reads them, and its door reads the requests the fronts let in.
The supervisor gives it its device (CUDA_VISIBLE_DEVICES, EDGESERVE_DEVICE).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from edgeserve.backends.registered import REGISTRY
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
        self._publishing = False
        self._fronts: dict[int, Counts] = {}  # what it counted of each front connected

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
            sender = wire.Sender(writer)
            front = hello["front"]
            counts = Counts(  # read before the front may send: it sends once it has the HELLO
                taken_before=int(self.board.taken_from(self.instance)[front]),
                sent_before=int(self.board.sent_to(self.instance)[front]),
            )
            sender.send((wire.HELLO, self.engine.backend_name, self.engine.profile))
            arena = Arena(fds[0], hello["arena_bytes"])
            REGISTRY.share(arena.buffer)  # a GPU backend may read its rows in place
            task = asyncio.create_task(self.serve_front(reader, sender, arena, front, counts))
            self.fronts.add(task)
            task.add_done_callback(self.fronts.discard)

    async def serve_front(
        self,
        reader: asyncio.StreamReader,
        sender: wire.Sender,
        arena: Arena,
        front: int,
        counts: Counts,
    ) -> None:
        held: dict[int, asyncio.Future[Any]] = {}  # SUBMITs and WAITs not answered yet
        work: asyncio.Future[Any]
        receiver = wire.Receiver(reader)
        self._fronts[front] = counts
        self._publish()  # the fronts read its count of their rows against their own
        try:
            while True:
                message = await receiver.receive(wire.FROM_FRONT)
                kind, key = message[0], message[1]
                if kind == wire.CANCEL:
                    if key in held:
                        held[key].cancel()
                    continue
                block = None
                try:
                    if kind == wire.SUBMIT:
                        placed, block, deadline, arrived, request = message[2:]
                        token = None if request is None else (sender, request)
                        tensors = arena.tensors(placed)
                        counts.received += self.engine.batcher.rows_in(tensors)
                        work = self.engine.batcher.submit_soon(tensors, deadline, arrived, token)
                    else:
                        work = asyncio.ensure_future(self._wait_at_door(counts, message[2]))
                except EdgeserveError as exc:  # refused at once (queue full, deadline passed)
                    sender.send((wire.DONE, key, exc))
                    continue
                except Exception as exc:  # a fault of ours: logged, a plain error for the front
                    log.exception("request %d failed", key)
                    sender.send((wire.DONE, key, BackendError(f"{type(exc).__name__}: {exc}")))
                    continue
                held[key] = work
                work.add_done_callback(partial(self._answer, sender, held, key, arena, block))
                self._publish()
        except (asyncio.IncompleteReadError, ConnectionError):
            log.info("front %d went away: dropping its %d requests", front, len(held))
        except wire.Malformed as exc:
            log.error("front %d sent %s: dropping it and its %d requests", front, exc, len(held))
        finally:
            for work in list(held.values()):
                work.cancel()
            await asyncio.gather(*held.values(), return_exceptions=True)
            sender.close()
            if self._fronts.get(front) is counts:  # not a restarted front's new connection
                del self._fronts[front]
            REGISTRY.retire(arena.buffer)
            arena.close()
            self._publish()

    def _answer(
        self,
        sender: wire.Sender,
        held: dict[int, asyncio.Future[Any]],
        key: int,
        arena: Arena,
        block: tuple[int, int] | None,
        work: asyncio.Future[Any],
    ) -> None:
        """Send `work`'s outcome, exactly one DONE per SUBMIT or WAIT: a callback, not a task
        per request (what the inference process's one event loop can least afford); the
        outputs written back into the request's block."""
        del held[key]
        self._publish()
        try:
            if work.cancelled():
                reply: Any = Unavailable("cancelled: the client went away")
            else:
                reply = work.result()
                if block is not None:
                    reply = arena.place(reply, *block)
        except EdgeserveError as exc:
            reply = exc
        except Exception as exc:  # a fault of ours: logged here, a plain error for the front
            log.exception("request %d failed", key)
            reply = BackendError(f"{type(exc).__name__}: {exc}")
        if sender.closing:
            return
        try:
            frame = wire.encode((wire.DONE, key, reply))
        except wire.Malformed as exc:  # outputs holding objects other than str and bytes
            log.error("request %d: its answer cannot cross to the front: %s", key, exc)
            frame = wire.encode(
                (wire.DONE, key, BackendError(f"an output that cannot cross: {exc}"))
            )
        sender.put(frame)

    async def drain(self, bound_s: float) -> None:
        """SIGTERM reached the fronts at the same time: run what they send without waiting for
        company until every front has gone, at most `bound_s` (at the bound the fronts answer
        what is left 503 themselves)."""
        self.engine.hurry()
        if self.fronts:
            await asyncio.wait(self.fronts, timeout=bound_s)

    async def _wait_at_door(self, counts: Counts, deadline: float) -> None:
        """A front's WAIT. Its grant counts as on its way in the step that let it in: counted
        by a callback once the wait had ended, it was counted nowhere in between, and the door,
        which forgets its own finished entries when short of room, then let in every WAIT that
        ran in that turn (45 of a burst of 100, each refused once its body was read). One let
        in at once is looked at and shown on the board under the fronts' lock: a front taking
        the last row at that instant saw it free (1 of 300 refused once read)."""
        door = self.engine.batcher.door
        with self.board.admitting():
            let_in = door.enter_now()
            if let_in:
                counts.grants += 1
                self._published()
        if not let_in:
            await door.enter(deadline)
            counts.grants += 1

    def let_in_by_fronts(self) -> int:
        """Requests the fronts let in for this queue, their bodies not queued yet: those they
        count, the door's grants on their way to them, and the rows on their way here."""
        taken = self.board.taken_from(self.instance)  # in this order: see Board.queues
        let_in = int(self.board.let_in_rows()[self.instance])
        sent = self.board.sent_to(self.instance)
        on_their_way = sum(
            counts.grants_on_their_way(int(taken[front]))
            + counts.rows_on_their_way(int(sent[front]))
            for front, counts in self._fronts.items()
        )
        return let_in + on_their_way

    def _publish(self) -> None:
        """Publish the queue's length once this turn of the event loop is over: a turn queues
        or answers many items (a batch's answers, a burst of SUBMITs), the board needs the last."""
        if not self._publishing:
            self._publishing = True
            asyncio.get_running_loop().call_soon(self._published)

    def _published(self) -> None:
        self._publishing = False
        batcher = self.engine.batcher
        received = sum(counts.sent_before + counts.received for counts in self._fronts.values())
        taken = self.board.taken_from(self.instance)
        granted = sum(
            counts.grants_on_their_way(int(taken[front])) for front, counts in self._fronts.items()
        )  # still at the door as the fronts see it: none may walk past them into their rows
        at_door = batcher.door.at_door + granted
        self.board.publish_queue(self.instance, batcher.queued_rows, at_door, received)


@dataclass
class Counts:
    """What an inference process counted of one front's connection, against the front's own
    counters on the board as they stood when it connected: grants of the door and rows sent."""

    taken_before: int
    sent_before: int
    grants: int = 0
    received: int = 0

    def grants_on_their_way(self, taken: int) -> int:
        """Grants of the door the front has not taken yet."""
        return max(0, self.grants - (taken - self.taken_before))

    def rows_on_their_way(self, sent: int) -> int:
        """Rows the front sent that have not arrived."""
        return max(0, sent - self.sent_before - self.received)


async def serve_inference(config: ChildConfig) -> None:
    """Load, warm up, then serve fronts on its socket until SIGTERM."""
    bundle = config.open_bundle()
    batching = bundle.manifest.batching
    board = Board(config.board_fd, config.fronts, config.instances, batching.max_batch_size)
    name, version = bundle.name, bundle.manifest.function.model_version
    stats = SharedStats(name, version, board, config.devices, instance=config.instance)
    threads = config.cpu_threads if config.devices[config.instance] == "cpu" else 0
    runtime = Runtime.load(bundle, backend=config.backend, stats=stats, threads=threads)
    await runtime.start()
    freeze_long_lived()
    assert isinstance(runtime.engine, LocalEngine)  # Runtime.load builds the local one
    server = InferenceServer(runtime.engine, board, config.instance)
    runtime.engine.batcher.door.let_in_elsewhere = server.let_in_by_fronts
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
