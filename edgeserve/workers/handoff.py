"""Connections accepted once, by the supervisor, and handed to the front holding the fewest.

    supervisor   accept -> the accepting front with the fewest open connections (handed by the
                 supervisor less closed by the front, both on the board) -> its fd sent over
                 that front's channel (a unix socket pair, SCM_RIGHTS)
    front        fds from its channel -> uvicorn's protocol on each (connect_accepted_socket);
                 each close counted on the board

The kernel's own spreading is blind to load: SO_REUSEPORT hashes each connection to a front and
a keep-alive connection stays where it lands. On a 16-core host, 32 connections over 14 fronts
landed [5, 4, 4, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 0]: pages queued behind each other in the
busiest front while another idled. One queue that every front accepts from is no better (the
first front to wake takes most of a burst). Hence least connections, as HAProxy's `leastconn`
(Node's cluster module hands connections round-robin from its primary for the same reason).
A front counts as accepting from the end of its start-up (model loaded, inference processes
reached) until its drain begins; connections that arrive while none is wait in the backlog.
"""

from __future__ import annotations

import asyncio
import logging
import selectors
import socket
import ssl
import time
from collections import deque
from functools import partial
from typing import Any

import numpy as np

from edgeserve.workers.board import ACCEPTING, CLOSED, HANDED, Board

log = logging.getLogger("edgeserve")

ACCEPT_BURST = 256
"""Connections accepted in one turn of the supervisor before it looks at its children again."""
TAKE_BURST = 64
"""Connections a front takes from its channel in one turn of its event loop."""
HELD_RETRY_S = 0.005
"""How often connections no front could take yet are offered again."""
MAX_HELD = 8192
"""The most connections the supervisor holds while every front's channel is full (beyond, they
wait in the listening socket's backlog). A channel takes a few hundred; while the fronts are busy,
a burst of connections overflowed the backlog (2048) and the kernel reset them."""


class Dispatcher:
    """The supervisor's side: the listening socket and one channel per front."""

    def __init__(self, listener: socket.socket, board: Board) -> None:
        listener.setblocking(False)
        self.listener = listener
        self.board = board
        self._channels: list[socket.socket | None] = [None] * board.fronts
        self._selector = selectors.DefaultSelector()
        self._selector.register(listener, selectors.EVENT_READ)
        self._random = np.random.default_rng()
        self._held: deque[socket.socket] = deque()  # accepted; no channel had room for them yet

    def channel(self, front: int) -> socket.socket:
        """A new channel to front `front`, whose end the front's process inherits (the
        caller closes it here once spawned); what its predecessor held died with it."""
        old = self._channels[front]
        if old is not None:
            old.close()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        ours.setblocking(False)
        self._channels[front] = ours
        slot = self.board.slot(front)
        slot[ACCEPTING] = 0
        slot[HANDED] = slot[CLOSED]
        return theirs

    def wait(self, timeout_s: float) -> None:
        """Hand over the connections that arrive within `timeout_s` (while no front accepts,
        they wait in the listening socket's backlog)."""
        if not self.board.slots()[:, ACCEPTING].any():
            time.sleep(timeout_s)
            return
        if self._held:  # every channel was full: offer them again shortly
            time.sleep(min(timeout_s, HELD_RETRY_S))
            self._hand_over()
        elif self._selector.select(timeout_s):
            self._hand_over()

    def close(self) -> None:
        """No new connections (SIGTERM): the fronts drain those they hold."""
        self._selector.close()
        self.listener.close()
        while self._held:
            self._held.popleft().close()

    def _hand_over(self) -> None:
        """Connections held back first, in order, then new ones, held behind them while no
        channel has room (up to MAX_HELD; the rest wait in the backlog)."""
        held = self._held
        while held and self._send(held[0]):
            held.popleft().close()  # the front holds its own copy once sent
        for _ in range(ACCEPT_BURST):
            if len(held) >= MAX_HELD:
                return
            try:
                conn, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # out of file descriptors, or the client gave up first
                log.warning("accepting a connection failed: %s", exc)
                return
            if held or not self._send(conn):
                held.append(conn)
            else:
                conn.close()

    def _send(self, conn: socket.socket) -> bool:
        """To the accepting front with the fewest open connections; ties at random (a fixed
        turn would pin to one front a client whose connections alternate between two kinds).
        False when none could take it now: every channel full, as when the fronts' event loops
        are busy under a burst of connections (it was closed unanswered; now it is held)."""
        slots, fronts = self.board.slots(), self.board.fronts
        held = slots[:, HANDED] - slots[:, CLOSED]
        for front in np.argsort(held * fronts + self._random.permutation(fronts)):
            channel = self._channels[front]
            if not slots[front, ACCEPTING] or channel is None:
                continue
            slot = self.board.slot(int(front))
            slot[HANDED] += 1  # before it is sent: the front may close it before we go on
            try:
                socket.send_fds(channel, [b"c"], [conn.fileno()])
            except OSError:  # its channel is full (the front is stuck) or it has just died
                slot[HANDED] -= 1
                continue
            return True
        return False


class Receiver:
    """A front's side: connections from its channel, served by uvicorn's protocol (`factory`,
    as uvicorn's own listener would call it) and counted on the board once closed."""

    def __init__(self, channel: socket.socket, slot: np.ndarray) -> None:
        channel.setblocking(False)
        self._channel = channel
        self._slot = slot
        self._tls: ssl.SSLContext | None = None
        self._factory: Any = None
        self._serving: set[asyncio.Task[None]] = set()

    def start(
        self, protocol: type[asyncio.Protocol], tls: ssl.SSLContext | None, **kw: Any
    ) -> None:
        """Take connections from now on; `kw`: what uvicorn passes its protocol."""
        self._factory = partial(_counted(protocol, self._slot), **kw)
        self._tls = tls
        asyncio.get_running_loop().add_reader(self._channel, self._take)
        self._slot[ACCEPTING] = 1

    def stop(self) -> None:
        """Take no more (the drain has begun); a signal handler may call it."""
        self._slot[ACCEPTING] = 0

    def _take(self) -> None:
        loop = asyncio.get_running_loop()
        for _ in range(TAKE_BURST):
            try:
                data, fds, _, _ = socket.recv_fds(self._channel, 16, 1)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                log.error("the supervisor's channel failed: %s", exc)
                data, fds = b"", []
            if not data:  # the supervisor has gone: PDEATHSIG stops this front too
                loop.remove_reader(self._channel)
                return
            for fd in fds:
                conn = socket.socket(fileno=fd)
                if not self._slot[ACCEPTING]:  # draining: the client will connect again
                    conn.close()
                    self._slot[CLOSED] += 1
                    continue
                task = loop.create_task(self._serve(conn))
                self._serving.add(task)
                task.add_done_callback(self._serving.discard)

    async def _serve(self, conn: socket.socket) -> None:
        try:
            await asyncio.get_running_loop().connect_accepted_socket(
                self._factory, conn, ssl=self._tls
            )
        except (OSError, ssl.SSLError) as exc:  # gone, or a failed TLS handshake
            log.debug("a connection ended before it was served: %s", exc)
            conn.close()
            self._slot[CLOSED] += 1


def _counted(protocol: type[asyncio.Protocol], slot: np.ndarray) -> type[asyncio.Protocol]:
    """`protocol`, counting its closed connections on the board (the supervisor's load)."""

    class Counted(protocol):  # type: ignore[valid-type, misc]
        def connection_lost(self, exc: Exception | None) -> None:
            slot[CLOSED] += 1
            super().connection_lost(exc)

    return Counted
