"""A front process: uvicorn on the connections the supervisor hands it, decoding and the
handler, batches elsewhere.

A front is a whole `Runtime` (the same checks at the door, the same handler calls, the same
statistics) whose engine is a `RemoteEngine`: rows go to an inference process through this
front's arena, written once, and come back the same way.

Routing: each request goes to the inference process holding the fewest rows that every front
sent and nothing has answered yet (join the shortest queue, counted on the board, so the
fronts see each other's load); ties rotate. Items of every front thus meet in full batches on
every device. The items of one request (a handler's, e.g. a page's lines) spread over a CPU's
processes, which run side by side on their own cores; on a GPU they stay together, up to one
full batch: processes sharing a GPU take turns on it, so a page split over two of them waits for
two runs instead of one (benchmarks/RESULTS-gpu.md, seventh and eighth sessions).
While an inference process is away (starting, restarting) the others take its share and
readiness says what is degraded; while none is there the front is not ready (503).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import signal
import socket
from functools import partial
from pathlib import Path
from types import FrameType

import uvicorn

from edgeserve.batching import ONE_REQUEST, BatchPolicy
from edgeserve.batching.rows import rows_of
from edgeserve.dataplane.settings import LogSettings
from edgeserve.errors import PayloadTooLarge, Unavailable
from edgeserve.http.app import FunctionApp, create_app
from edgeserve.http.server import Companion, DrainingServer, uvicorn_config
from edgeserve.http.timeouts import Timeouts
from edgeserve.http.tls import TlsFiles
from edgeserve.runtime import Runtime
from edgeserve.shapes import ShapeProfile
from edgeserve.sharedmemory import Regions
from edgeserve.types import TensorDict
from edgeserve.workers import wire
from edgeserve.workers.arena import Arena, Blocks, block_size
from edgeserve.workers.board import QUEUED, RESTARTS, WAITING, Board
from edgeserve.workers.child import ChildConfig, child_main
from edgeserve.workers.handoff import Receiver
from edgeserve.workers.link import RECONNECT_S, RETRY_AFTER_S, Link
from edgeserve.workers.statistics import SharedStats

log = logging.getLogger("edgeserve")

ARENA_BYTES = 256 * 2**20
"""Virtual size of a front's arena; memory is taken only as blocks are first used."""


class RemoteEngine:
    """The inference processes, seen from a front: submit, cancel, readiness, admission."""

    def __init__(
        self,
        config: ChildConfig,
        board: Board,
        policy: BatchPolicy,
        whole: frozenset[str] = frozenset(),
    ) -> None:
        """`whole`: optional inputs sent without a batch axis (Signature.whole), not rows."""
        self.board = board
        self.policy = policy
        self._whole = whole
        self.devices = config.devices
        self.arena = Arena.create(ARENA_BYTES)
        self._blocks = Blocks(ARENA_BYTES)
        self.links = [
            Link(config.socket_path(i), i, config.front, self.arena, self._free)
            for i in range(config.instances)
        ]
        self._held = board.held(config.front)  # this front's rows at each inference process
        self._let_in = board.let_in(config.front)  # its requests let in, bodies not queued yet
        self._taken = board.taken(config.front)  # grants of each inference process's door
        self._sent = board.sent(config.front)  # rows sent to each inference process, ever
        self._entered: dict[asyncio.Task[object], int] = {}  # those requests: process each
        self._turn = itertools.count(config.front)
        self._front = config.front
        self._together: tuple[int, int, int] | None = None  # (request, process, rows) on a GPU

    @property
    def ready(self) -> bool:
        return any(link.ready for link in self.links)

    @property
    def degraded(self) -> str | None:
        """Which inference processes are away while others serve (None: all serve)."""
        away = [link.instance for link in self.links if not link.ready]
        if not away or len(away) == len(self.links):
            return None
        where = ", ".join(f"{i} ({self.devices[i]})" for i in away)
        serving = len(self.links) - len(away)
        return f"inference process {where} restarting: {serving} of {len(self.links)} serve"

    @property
    def backend_name(self) -> str:
        return self.links[0].backend_name

    @property
    def profile(self) -> ShapeProfile | None:
        return self.links[0].profile

    async def start(self) -> None:
        """Connect to every inference process; ready once all have said hello but those that
        were restarted after a fault (a front restarted meanwhile serves with the others;
        they join when up), and at least one."""
        for link in self.links:
            link.start()
        restarts = self.board.instance_slots()[:, RESTARTS]
        first_start = [link for link in self.links if not restarts[link.instance]]
        await asyncio.gather(*(link.connected.wait() for link in first_start))
        while not self.ready:
            await asyncio.sleep(RECONNECT_S)

    async def stop(self, drain_timeout_s: float) -> None:
        # uvicorn has drained this front's requests before its lifespan stops the runtime
        for link in self.links:
            link.stop()

    async def admit(self, deadline: float) -> None:
        """Straight in while some inference process shows room (its queue and the requests
        every front let in for it) and nobody waiting; else wait in the line of the one with
        the shortest queue (edgeserve.door, one for every front, which counts them too). A
        request let in holds its place on the board until its rows are sent or its task ends:
        a burst at an empty queue does not walk in whole, to be read and then refused."""
        task = asyncio.current_task()
        assert task is not None
        with self.board.admitting():
            instance = self._room()
            if instance is not None:
                self._enter(task, instance)
                return
        slots = self.board.instance_slots()
        instance = min(self._ready_links(), key=lambda i: (slots[i, QUEUED], slots[i, WAITING]))
        await self.links[instance].ask(
            (wire.WAIT, deadline), 0, 0, granted=partial(self._granted, task, instance)
        )

    def _enter(self, task: asyncio.Task[object], instance: int) -> None:
        """The request holds a place until its rows are sent or it ends (a bad body, a client
        gone): given back at once, for the other processes count it too, and none would prune
        it for this one."""
        self._entered[task] = instance
        self._let_in[instance] += 1
        task.add_done_callback(self._leave)

    def _leave(self, task: asyncio.Task[object]) -> None:
        if (instance := self._entered.pop(task, None)) is not None:
            self._let_in[instance] -= 1

    def _granted(self, task: asyncio.Task[object], instance: int) -> None:
        """Inference process `instance`'s door let the request in: its place moves from the
        door's grants on their way to this front's, in the one step (the door counts both)."""
        self._enter(task, instance)  # before the grant counts as taken: see Board.queues
        self._taken[instance] += 1

    def _room(self) -> int | None:
        """Of the ready inference processes with room and nobody waiting, the one holding the
        fewest rows (ties rotate per request), if any: the request will go there."""
        taken, held, waiting = self.board.queues()
        limit, start = self.policy.max_queue_size, next(self._turn)
        order = [(start + i) % len(self.links) for i in range(len(self.links))]
        free = [i for i in self._ready_links(order) if taken[i] < limit and not waiting[i]]
        return min(free, key=held.__getitem__) if free else None

    def _queued(self) -> None:
        """The current task's request reached the queue (or was refused there): the place it
        held is the queue's to count now."""
        task = asyncio.current_task()
        if task is not None:
            self._leave(task)

    def _on_its_way(self, task: asyncio.Task[object] | None, instance: int, rows: int) -> None:
        """The request's rows were sent: counted on their way before its place is given back,
        so that no process sees it in neither count."""
        self._sent[instance] += rows
        if task is not None:
            self._leave(task)

    def hurry(self) -> None:
        """Nothing to do here: the supervisor's SIGTERM reaches the inference processes as it
        reaches the fronts, and they hurry then, once for every front."""

    def check_room(self, rows: int) -> None:
        """A request of several items (the handler's): refused at once if no inference process
        shows room for all of them (the one each item reaches still checks it)."""
        self._queued()
        limit = self.policy.max_queue_size
        if rows > limit:
            raise PayloadTooLarge(
                f"request of {rows} rows exceeds max_queue_size ({limit} rows), which the "
                "queue can never hold. Hint: raise [batching] max_queue_size in function.toml"
            )
        taken = self.board.queues().taken
        queued = min(int(taken[i]) for i in self._ready_links())
        if queued + rows > limit:
            raise Unavailable(f"queue full: {queued} of {limit} rows waiting", RETRY_AFTER_S)

    async def submit(self, inputs: TensorDict, deadline: float, arrived: float) -> TensorDict:
        task = asyncio.current_task()
        let_in_for = None if task is None else self._entered.get(task)
        rows = rows_of(inputs, bool(self.policy.max_batch_size), self._whole)
        request = ONE_REQUEST.get()  # a handler's items: they share one outcome
        request = request if isinstance(request, int) else None
        if let_in_for is not None and self.links[let_in_for].ready:
            link = self.links[let_in_for]  # where its place was kept
        else:
            link = self.links[self._route(rows, request)]
        size = block_size(inputs)
        offset = self._blocks.allocate(size) if size else None
        if offset is None:  # arena full (or BYTES only): the tensors travel inline
            offset, size = 0, 0
        placed = self.arena.place(inputs, offset, size)
        self._held[link.instance] += rows
        try:
            result: TensorDict = await link.ask(
                (wire.SUBMIT, placed, (offset, size), deadline, arrived, request), offset, size,
                sent=partial(self._on_its_way, task, link.instance, rows),
            )  # fmt: skip
        finally:
            self._held[link.instance] -= rows
        return result

    def _route(self, rows: int, request: int | None) -> int:
        """The ready inference process holding the fewest rows among those whose queue has
        room for `rows` (any, when none has); ties rotate per request: the items of one start
        where its number says (a turn per item, with the door's, made every page of three lines
        start at the same process of two). On a GPU, where the request's earlier items went
        while they fit one batch (the module's docstring)."""
        held, slots = self.board.held_rows(), self.board.instance_slots()
        limit = self.policy.max_queue_size
        start = next(self._turn) if request is None else request + self._front
        if self._together is not None and self._together[0] == request:
            _, instance, sent = self._together
            fits = sent + rows <= max(self.policy.max_batch_size, 1)
            if fits and self.links[instance].ready and slots[instance, QUEUED] + rows <= limit:
                self._together = (request, instance, sent + rows)
                return instance
        order = [(start + i) % len(self.links) for i in range(len(self.links))]
        instance = min(
            self._ready_links(order), key=lambda i: (slots[i, QUEUED] + rows > limit, held[i])
        )
        if request is not None and self.devices[instance] != "cpu":
            self._together = (request, instance, rows)
        return instance

    def _ready_links(self, order: list[int] | None = None) -> list[int]:
        ready = [i for i in order or range(len(self.links)) if self.links[i].ready]
        if not ready:
            raise Unavailable("the inference processes are restarting", RETRY_AFTER_S)
        return ready

    def _free(self, offset: int, size: int) -> None:
        if size:
            self._blocks.free(offset, size)


class FrontServer(DrainingServer):
    """uvicorn without a listener of its own: it serves the connections the supervisor hands
    it (handoff.py) from the end of its start-up until its drain begins. A front told to stop
    before it was ever ready has nothing to drain: it exits at once, rather than wait on
    inference processes that may never come (its supervisor died)."""

    def __init__(
        self, config: uvicorn.Config, receiver: Receiver, companions: list[Companion]
    ) -> None:
        super().__init__(config, companions)
        self.receiver = receiver

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=[])  # the app's lifespan, and no listener
        self.receiver.start(
            self.config.http_protocol_class,
            self.config.ssl,
            config=self.config,  # what uvicorn gives the protocol on its own listener
            server_state=self.server_state,
            app_state=self.lifespan.state,
        )

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if not self.started:  # no request was ever let in; the arena goes with the process
            # The kernel sends PDEATHSIG again each time the front passes to another of its dead
            # supervisor's threads: one line, one exit.
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
            log.warning("front stopped (signal %d) before it was ready: nothing to drain", sig)
            os._exit(0)
        self.receiver.stop()
        super().handle_exit(sig, frame)


def run_front(config: ChildConfig) -> None:
    """Serve HTTP on this front's socket with a Runtime whose engine is remote, under the same
    uvicorn settings, timeouts and drain as the one-process server (http/server.py)."""
    bundle = config.open_bundle()
    batching = bundle.manifest.batching
    board = Board(config.board_fd, config.fronts, config.instances, batching.max_batch_size)
    policy = BatchPolicy.from_manifest(batching, batched=bundle.signature.batched)
    engine = RemoteEngine(config, board, policy, bundle.signature.whole)
    name, version = bundle.name, bundle.manifest.function.model_version
    stats = SharedStats(name, version, board, config.devices, front=config.front)
    limits = Timeouts.from_resources(bundle.manifest.resources, **config.timeouts)
    regions = Regions(store=Path(config.regions_dir))  # one registry for every front
    logs = LogSettings(
        f"with --workers, each of this server's {config.fronts} front processes and its "
        "inference processes logs on its own, and a change would reach this front alone. "
        "Hint: restart the server with `edgeserve serve --log-level`"
    )
    runtime = Runtime(bundle, engine, stats)
    app = create_app(runtime, timeouts=limits, regions=regions, log_settings=logs)
    receiver = Receiver(socket.socket(fileno=config.channel_fd), board.slot(config.front))
    tls = {} if config.tls is None else TlsFiles(**config.tls).uvicorn_options()
    settings = uvicorn_config(app, log_level=config.log_level, **tls)
    FrontServer(settings, receiver, _grpc_beside(app, config)).run()


def _grpc_beside(app: FunctionApp, config: ChildConfig) -> list[Companion]:
    if config.grpc_address is None:
        return []
    from edgeserve.grpc.server import beside

    return [
        beside(app, config.grpc_address, None if config.tls is None else TlsFiles(**config.tls))
    ]


if __name__ == "__main__":
    child_main(run_front)
