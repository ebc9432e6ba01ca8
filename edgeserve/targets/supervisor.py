"""The `process` service manager on a device: one supervisor per function, hand-over with no gap.

Why a supervisor: a second deploy must switch versions with no moment where nobody answers.
The supervisor binds the function's port once and holds that listening socket for its whole
life; every release runs as a child uvicorn accepting on the same inherited socket. On SIGHUP
it starts a child from the release `current` points at and waits for the child to say that it
listens (one byte on a pipe, written after the app's startup: model loaded and warmed up). Only
then does it SIGTERM the old child, which stops accepting and drains. Connections that arrive
meanwhile wait in the one shared accept queue, so none is refused or reset (two processes with
SO_REUSEPORT would each have their own queue, reset when the old one closes). A child that
exits or misses the deadline is killed and the old one keeps serving. `run/state.json` says
which release is live, its generation, and the last failure; the deploy driver polls it.

A child never outlives its supervisor: it asks the kernel (prctl PR_SET_PDEATHSIG) for SIGTERM
when the supervisor dies, even by SIGKILL, so it stops accepting at once and frees the port for
the next supervisor instead of serving on as an orphan nobody manages.

gRPC (`--grpc-port`) is each child's own: the child binds it with SO_REUSEPORT, as `serve`
does, so the new child listens beside the old one, which stops accepting when it drains.
gRPC clients hold a connection to one child: a retiring child's drain closes it (GOAWAY), and
they reconnect to the new one, whose port has been open since it became ready.

    python -m edgeserve.targets.supervisor run FUNCTION_DIR --host H --port P [--grpc-port G]
        [--python PY]
    python -m edgeserve.targets.supervisor child RELEASE --fd N --notify-fd W [--host H
        --grpc-port G]   (started by run)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import errno
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import uvicorn

from edgeserve.http.server import Companion, DrainingServer, uvicorn_config
from edgeserve.targets.releases import BUNDLE_DIR

STATE_FILE = "run/state.json"
PID_FILE = "run/supervisor.pid"
LOG_FILE = "run/service.log"
HANDOVER_GRACE_S = 0.5
"""How long a retiring child keeps just-accepted connections before closing idle ones."""
DRAIN_S = 35.0
"""How long an old child may drain after SIGTERM (it exits at its [resources] drain_timeout_s,
30 s by default)."""
BIND_WAIT_S = 10.0
"""How long a starting supervisor retries a port still held by a dying child."""
PR_SET_PDEATHSIG = 1


class Supervisor:
    """Holds the listening socket and the live child of one function directory."""

    def __init__(
        self,
        fn_dir: Path,
        sock: socket.socket,
        python: str | None,
        start_s: float,
        grpc: list[str] | None = None,
    ):
        self.fn_dir, self.sock, self.python, self.start_s = fn_dir, sock, python, start_s
        self.grpc = grpc or []  # the child's --host and --grpc-port, where it serves gRPC
        self.live: subprocess.Popen[bytes] | None = None
        self.state: dict[str, Any] = {"pid": os.getpid(), "generation": 0, "release": None}

    def hand_over(self) -> None:
        """Start the release `current` names; once it listens, retire the old child."""
        release = str((self.fn_dir / "current").resolve())
        self.state.update(generation=self.state["generation"] + 1, attempted=release)
        try:
            child = self._start(release)
        except RuntimeError as exc:
            self.state["error"] = str(exc)
            self._write_state()
            return
        old, self.live = self.live, child
        self.state.update(release=release, child=child.pid, error=None)
        if old is not None:
            old.terminate()
        self._write_state()
        if old is not None:
            _reap(old)

    def _start(self, release: str) -> subprocess.Popen[bytes]:
        notify_r, notify_w = os.pipe()
        fd = self.sock.fileno()
        argv = [child_python(release, self.python), "-m", "edgeserve.targets.supervisor", "child"]
        argv += [str(Path(release) / BUNDLE_DIR), "--fd", str(fd), "--notify-fd", str(notify_w)]
        argv += self.grpc
        with (self.fn_dir / LOG_FILE).open("ab") as log:
            child = subprocess.Popen(
                argv, pass_fds=(fd, notify_w), stdout=log, stderr=log,
                preexec_fn=_die_with(os.getpid()),  # one thread: safe here
            )  # fmt: skip
        os.close(notify_w)
        try:
            ready, _, _ = select.select([notify_r], [], [], self.start_s)
            listening = bool(ready) and os.read(notify_r, 1) == b"1"
        finally:
            os.close(notify_r)
        if listening:
            return child
        child.kill()
        code = child.wait()
        why = f"exited with {code}" if ready else f"not listening after {self.start_s} s"
        raise RuntimeError(f"release {release} {why}; see {self.fn_dir / LOG_FILE}")

    def respawn_if_dead(self) -> None:
        """A live child that died on its own is replaced from `current` (as Restart=always)."""
        if self.live is not None and self.live.poll() is not None:
            self.live = None
            time.sleep(1.0)
            self.hand_over()

    def stop(self) -> None:
        if self.live is not None:
            self.live.terminate()
            _reap(self.live)
        (self.fn_dir / PID_FILE).unlink(missing_ok=True)

    def _write_state(self) -> None:
        path = self.fn_dir / STATE_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.state), encoding="utf-8")
        tmp.replace(path)


def child_python(release: str, python: str | None) -> str:
    """The interpreter of a release: the profile's, else the release's own venv, else ours."""
    if python:
        return python
    venv = Path(release) / ".venv" / "bin" / "python"
    return str(venv) if venv.exists() else sys.executable


def _die_with(parent: int) -> Callable[[], None]:
    """Run in the forked child before exec: SIGTERM it when `parent` dies (survives exec)."""
    libc = ctypes.CDLL(None, use_errno=True)

    def arm() -> None:
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the request took effect
            os._exit(1)

    return arm


def _reap(child: subprocess.Popen[bytes]) -> None:
    try:
        child.wait(timeout=DRAIN_S)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()


def listen(host: str, port: int) -> socket.socket:
    """The one listening socket every child of this function accepts on.

    A port still held by a release's child is retried a little: the child of a killed
    supervisor lets go of it within a moment of its SIGTERM. Held by anything else, it fails at
    once, naming the holder (a deploy waited 10 s to say so)."""
    deadline = time.monotonic() + BIND_WAIT_S
    while True:
        try:
            sock = socket.create_server((host, port), backlog=2048, reuse_port=False)
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
            holder = port_holder(port)
            ours = holder is not None and "edgeserve.targets.supervisor child" in holder
            if not ours or time.monotonic() > deadline:
                held = f"pid {holder}" if holder else "a process this user cannot see"
                raise OSError(exc.errno, f"{exc.strerror}: port {port} is held by {held}") from None
            time.sleep(0.2)
            continue
        sock.set_inheritable(True)
        return sock


def port_holder(port: int) -> str | None:
    """'PID: COMMAND LINE' of a process of this user listening on TCP `port`, if any (Linux:
    the socket's inode in /proc/net/tcp*, found among the processes' open files)."""
    sockets = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                local, state, inode = fields[1], fields[3], fields[9]
                if state == "0A" and int(local.rpartition(":")[2], 16) == port:  # 0A: LISTEN
                    sockets.add(f"socket:[{inode}]")
    if not sockets:  # nobody listens there any more
        return None
    for fds in Path("/proc").glob("[0-9]*/fd"):
        with contextlib.suppress(OSError):
            if any(str(fd.readlink()) in sockets for fd in fds.iterdir()):
                command = (fds.parent / "cmdline").read_bytes().replace(b"\0", b" ").strip()
                return f"{fds.parent.name}: {command.decode(errors='replace')[:160]}"
    return None


def run(args: argparse.Namespace) -> None:
    """The supervisor's life: bind, start `current`, then act on signals until SIGTERM."""
    fn_dir = Path(args.fn_dir).resolve()
    (fn_dir / "run").mkdir(exist_ok=True)
    (fn_dir / STATE_FILE).unlink(missing_ok=True)  # a stale state must not read as this run's
    grpc = (
        None
        if args.grpc_port is None
        else ["--host", args.host, "--grpc-port", str(args.grpc_port)]
    )
    sock = listen(args.host, args.port)
    supervisor = Supervisor(fn_dir, sock, args.python, args.start_timeout, grpc)
    (fn_dir / PID_FILE).write_text(str(os.getpid()), encoding="utf-8")
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    for signum in (signal.SIGHUP, signal.SIGTERM, signal.SIGINT, signal.SIGCHLD):
        signal.signal(signum, lambda *_: None)
    supervisor.hand_over()
    while True:
        select.select([wake_r], [], [])
        received = set(os.read(wake_r, 64))
        if received & {signal.SIGTERM, signal.SIGINT}:
            supervisor.stop()
            return
        if signal.SIGHUP in received:
            supervisor.hand_over()
        supervisor.respawn_if_dead()


class _HandoverServer(DrainingServer):
    """A uvicorn server that says when it accepts connections, and lets go of them gently.

    uvicorn's shutdown closes every connection without a request in progress, which includes
    one accepted a moment ago whose request has not been read yet; stopping accepting first and
    waiting a little lets such requests start, so they are answered instead of dropped.
    """

    drain_at_signal = False  # requests accepted a moment ago start during the grace, not 503

    def __init__(
        self, config: uvicorn.Config, notify_fd: int, companions: Sequence[Companion] = ()
    ) -> None:
        super().__init__(config, companions)
        self.notify_fd = notify_fd

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        os.write(self.notify_fd, b"1")
        os.close(self.notify_fd)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        for server in self.servers:
            server.close()  # the next child takes new connections from the shared queue
        await asyncio.sleep(HANDOVER_GRACE_S)
        await super().shutdown(sockets=sockets)


def child(args: argparse.Namespace) -> None:
    """One release serving on the supervisor's socket (the app is built as `serve` builds it)."""
    from edgeserve.server import grpc_beside, load_app

    if args.grpc_port is not None:
        from edgeserve.grpc import check_installed

        check_installed()  # before the model loads (the port is the old child's too: no probe)
    sock = socket.socket(fileno=args.fd)
    app = load_app(Path(args.release))
    companions = grpc_beside(app, args.host, args.grpc_port, None)
    _HandoverServer(uvicorn_config(app), args.notify_fd, companions).run(sockets=[sock])


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m edgeserve.targets.supervisor")
    verbs = parser.add_subparsers(dest="verb", required=True)
    p = verbs.add_parser("run")
    p.add_argument("fn_dir")
    p.add_argument("--host", default="0.0.0.0")  # noqa: S104 - a device serves its network
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--grpc-port", type=int)
    p.add_argument("--python")
    p.add_argument("--start-timeout", type=float, default=300.0)
    p.set_defaults(func=run)
    p = verbs.add_parser("child")
    p.add_argument("release")
    p.add_argument("--fd", type=int, required=True)
    p.add_argument("--notify-fd", type=int, required=True)
    p.add_argument("--host", default="0.0.0.0")  # noqa: S104 - where gRPC listens
    p.add_argument("--grpc-port", type=int)
    p.set_defaults(func=child)
    return parser


if __name__ == "__main__":
    arguments = _parser().parse_args()
    arguments.func(arguments)
