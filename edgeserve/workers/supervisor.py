"""The supervisor: the parent of the fronts and the inference processes, and nothing else.

    bind the socket -> start the inference processes (one per device) and the fronts -> watch:
        a front died        -> start it again (its requests died with it; the inference
                               processes saw its connection close and dropped their items)
        an inference process died -> start it alone again; meanwhile the fronts answer what
                               it held 503, route to the others and say so in readiness
                               (not ready only while none is there)
        an inference process died before it was ever ready, or a front kept dying within
        seconds of its start -> stop everything, fail (a broken install must not restart forever)
    SIGTERM / SIGINT: passed on to every child at once, so that one bound (`drain_s`) counts
        from the same instant everywhere: the fronts drain their requests (at the bound, what
        is left is answered 503), the inference processes run what is queued without waiting
        for company and stop once their fronts have gone -> exit. A child still there
        BACKSTOP_S past the bound is killed.

The supervisor listens, and hands each connection to the front holding the fewest
(handoff.py: the kernel's own spreading is blind to load, and keep-alive connections stay where
they land); a restarted front gets a new channel and takes connections again once it is up. It
holds the board, so the counters outlive any child. Each inference process gets its device in
its environment (layout.Instance.env: CUDA_VISIBLE_DEVICES and EDGESERVE_DEVICE). Children run
in their own process group (a terminal's Ctrl+C reaches only the supervisor, which stops them
in order) and die with it (PDEATHSIG).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from edgeserve.grpc import address
from edgeserve.http.server import BACKSTOP_S
from edgeserve.workers.board import RESTARTS, Board
from edgeserve.workers.child import ChildConfig
from edgeserve.workers.handoff import Dispatcher
from edgeserve.workers.layout import Instance, Layout

if TYPE_CHECKING:
    from edgeserve.bundle import Bundle
    from edgeserve.http.tls import TlsFiles

log = logging.getLogger("edgeserve")

WATCH_S = 0.05
"""How often the supervisor looks at its children (meanwhile it hands connections over)."""
KILL_WAIT_S = 5.0
LISTEN_BACKLOG = 2048
QUICK_DEATH_S = 10.0
QUICK_DEATHS = 3
"""A front that dies this many times in a row, each within QUICK_DEATH_S of its start, fails
the server: it will not come up (a bad handler import, a broken install)."""


@dataclass
class _Child:
    module: str
    config: ChildConfig
    process: subprocess.Popen[bytes]
    env: dict[str, str] | None = None  # what its environment adds (an inference process's device)
    started: float = 0.0
    quick_deaths: int = 0  # in a row, its predecessors included

    def alive(self) -> bool:
        return self.process.poll() is None


class Supervisor:
    """Starts, watches, restarts and stops the processes of one server."""

    def __init__(
        self,
        config: ChildConfig,
        instances: tuple[Instance, ...],
        dispatcher: Dispatcher,
        board: Board,
    ) -> None:
        self.config = config
        self.dispatcher = dispatcher
        self.board = board
        self.stopping = False
        self._stopped_at: float | None = None
        self.signal: int | None = None  # the one that stopped it
        self.inference = [
            self._spawn("edgeserve.workers.inference", replace(config, instance=i), where.env())
            for i, where in enumerate(instances)
        ]
        self.fronts = [self._spawn_front(index) for index in range(config.fronts)]

    def watch(self) -> int:
        """Keep every child alive until SIGTERM/SIGINT; then stop them all. The exit status."""
        signal.signal(signal.SIGTERM, self._stop_signal)
        signal.signal(signal.SIGINT, self._stop_signal)
        while not self.stopping:
            for index, inference in enumerate(self.inference):
                if not inference.alive():
                    if not self._was_ready(index):
                        log.error("inference process %d failed before it was ready", index)
                        self.stop()
                        return 1
                    self._restart_inference(index)
            for index, front in enumerate(self.fronts):
                if not front.alive():
                    log.warning("front %d exited (%s): starting it again", index, _how(front))
                    quick = time.monotonic() - front.started < QUICK_DEATH_S
                    if quick and front.quick_deaths + 1 >= QUICK_DEATHS:
                        log.error("front %d keeps failing at start: stopping", index)
                        self.stop()
                        return 1
                    self.fronts[index] = self._spawn_front(index)
                    self.fronts[index].quick_deaths = front.quick_deaths + 1 if quick else 0
            self.dispatcher.wait(WATCH_S)
        self.stop()
        return 0

    def stop(self) -> None:
        """Stop every child within the bound (see the module's docstring); kill the rest."""
        stopped_at = self._signal_children()
        self.dispatcher.close()
        _wait([*self.fronts, *self.inference], stopped_at + self.config.drain_s + BACKSTOP_S)

    def _signal_children(self) -> float:
        """SIGTERM to every child, once; when that was (the drain bound counts from there)."""
        if self._stopped_at is None:
            self._stopped_at = time.monotonic()
            for child in [*self.fronts, *self.inference]:
                if child.alive():
                    child.process.send_signal(signal.SIGTERM)
        return self._stopped_at

    def _restart_inference(self, index: int) -> None:
        dead = self.inference[index]
        log.warning("inference process %d exited (%s): starting it again", index, _how(dead))
        self.board.instance(index)[RESTARTS] += 1
        self.board.publish_queue(index, 0, 0, 0)
        Path(self.config.socket_path(index)).unlink(missing_ok=True)
        self.inference[index] = self._spawn(dead.module, dead.config, dead.env)

    def _was_ready(self, index: int) -> bool:
        """An inference process listens on its socket only once it is ready."""
        return Path(self.config.socket_path(index)).exists()

    def _spawn_front(self, index: int) -> _Child:
        with self.dispatcher.channel(index) as channel:  # the front keeps its own copy
            config = replace(self.config, front=index, channel_fd=channel.fileno())
            return self._spawn("edgeserve.workers.front", config, fds=[channel.fileno()])

    def _spawn(
        self,
        module: str,
        config: ChildConfig,
        env: dict[str, str] | None = None,
        fds: list[int] | None = None,
    ) -> _Child:
        process = subprocess.Popen(
            [sys.executable, *config.argv(module)],
            pass_fds=[config.board_fd, *(fds or [])],
            process_group=0,
            env={**os.environ, **env} if env else None,
        )
        return _Child(module, config, process, env, time.monotonic())

    def _stop_signal(self, signum: int, frame: object) -> None:
        self.signal = signum
        self.stopping = True
        self._signal_children()  # now, not at the watch loop's next turn


def serve_workers(
    bundle: Bundle,
    *,
    host: str,
    port: int,
    layout: Layout,
    backend: str | None,
    log_level: str,
    drain_s: float,
    timeouts: dict[str, float | None],
    tls: TlsFiles | None = None,
    grpc_port: int | None = None,
) -> int:
    """Serve with the layout's front and inference processes; the exit status. `grpc_port`:
    every front serves gRPC there too."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.create_server((host, port), family=family, backlog=LISTEN_BACKLOG)
    host, port = listener.getsockname()[:2]
    reserved = None if grpc_port is None else _reserve_port(family, host, grpc_port)
    fronts, instances = layout.fronts, len(layout.instances)
    board = Board.create(fronts, instances, bundle.manifest.batching.max_batch_size)
    with tempfile.TemporaryDirectory(prefix="edgeserve-") as scratch:
        config = ChildConfig(
            bundle=str(bundle.root),
            source=None if bundle.source is None else str(bundle.source),
            sockets_dir=scratch,
            regions_dir=str(Path(scratch) / "regions"),
            board_fd=board.fd,
            fronts=fronts,
            devices=layout.devices,
            cpu_threads=layout.cpu_threads,
            supervisor=os.getpid(),
            drain_s=drain_s,
            log_level=log_level,
            backend=backend,
            tls=None if tls is None else asdict(tls),
            timeouts=timeouts,
            grpc_address=None if reserved is None else address(host, reserved.getsockname()[1]),
        )
        supervisor = Supervisor(config, layout.instances, Dispatcher(listener, board), board)
        scheme = "http" if tls is None else "https"
        also = "" if config.grpc_address is None else f", gRPC on {config.grpc_address}"
        print(
            f"edgeserve: {_count(fronts, 'front process')} and "
            f"{_count(instances, 'inference process')} ({layout.placement}) "
            f"serving on {scheme}://{host}:{port}{also}",
            flush=True,
        )
        status = supervisor.watch()
    if supervisor.signal is not None:
        _end_by(supervisor.signal)
    return status


def _reserve_port(family: socket.AddressFamily, host: str, port: int) -> socket.socket:
    """The gRPC port, bound but not listening, with SO_REUSEPORT as gRPC binds it: every front
    then binds it too, and port 0 becomes one port for all of them. Kept open while serving."""
    reserved = socket.socket(family, socket.SOCK_STREAM)
    reserved.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    reserved.bind((host, port))
    return reserved


def _wait(children: list[_Child], deadline: float) -> None:
    for child in children:
        try:
            child.process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            log.error("pid %d did not stop within the drain bound: killed", child.process.pid)
            child.process.kill()
            child.process.wait(KILL_WAIT_S)


def _end_by(signum: int) -> None:
    """End this process by the signal that stopped it, as uvicorn ends the one-process server
    (the same exit status for both layouts), and without Python's teardown of what serving
    imported: 0.1-0.3 s measured here, after every child had gone."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    signal.signal(signum, signal.SIG_DFL)
    signal.raise_signal(signum)


def _how(child: _Child) -> str:
    code = child.process.returncode
    return f"signal {-code}" if code is not None and code < 0 else f"status {code}"


def _count(count: int, noun: str) -> str:
    return f"{count} {noun}{'es' if count > 1 else ''}"
