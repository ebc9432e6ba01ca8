"""How a connection's requests begin and end beyond uvicorn's defaults, in its HTTP protocol.

    Pipelined       a lost connection reaches every request of it, not only the last one parsed
    HalfClosed      a client that closes its sending side once its request is sent is answered
    IgnoredUpgrade  an `Upgrade` is served as HTTP/1.1 (with `without_upgrade`)

An `Upgrade` is ignored, as RFC 9110 (7.8) lets a server that stays on HTTP/1.1 do: edgeserve
serves no other protocol, and httptools (llhttp) takes `Connection: upgrade` with an `Upgrade`
header for the end of HTTP on the connection, so the request's body and whatever follows it
were the new protocol's, dropped: `curl --http2 -d @request.json` (which proposes h2c) reached
the app with an empty body. The `upgrade` option of a request's Connection header is struck out
before the parser reads it, so the request is plain HTTP/1.1 to either parser, and uvicorn
hands nothing to a WebSocket library; a WebSocket handshake reaches the app as an HTTP request
with its `Upgrade: websocket` header, answered there (app.py).
"""

from __future__ import annotations

import asyncio
import logging
import re
import socket
from typing import Any

logger = logging.getLogger("edgeserve.http")

_CONNECTION_UPGRADE = re.compile(rb"(?im)^(connection[ \t]*:[^\r\n]*?)\bupgrade\b")


def without_upgrade(data: bytes) -> bytes:
    """`data`, the start of a request (its headers, perhaps more), with the `upgrade` option of
    its Connection header struck out; the same object when it has none (nearly every request:
    one search of the headers' bytes in lower case)."""
    end = data.find(b"\r\n\r\n")
    head = data if end < 0 else data[:end]
    if b"upgrade" not in head.lower():
        return data
    return _CONNECTION_UPGRADE.sub(rb"\1", head) + data[len(head) :]


class IgnoredUpgrade:
    """Mixed into a uvicorn protocol class: an Upgrade whose headers came split over several
    reads (not struck out) is still ignored by uvicorn, which logged it as a warning, with
    advice to install a WebSocket library; the app answers it (app.py)."""

    def _unsupported_upgrade_warning(self) -> None:
        logger.debug("an Upgrade request served as HTTP/1.1")


class Pipelined:
    """Mixed into a uvicorn protocol class: a lost connection reaches every request of it.

    uvicorn marks only the request parsed last as disconnected. With requests pipelined, one
    that was running or queued then wrote its answer on the closed transport, and uvicorn
    logged an "Exception in ASGI application" for a client that had simply left (httptools
    calls `on_headers_complete` once per request: each is noted there; h11 parses the next
    request only once the last is answered)."""

    cycle: Any
    _cycles: list[Any] | None = None

    def on_headers_complete(self) -> None:
        super().on_headers_complete()  # type: ignore[misc]
        self._cycles = [c for c in self._cycles or () if not c.response_complete] + [self.cycle]

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)  # type: ignore[misc]
        for cycle in self._cycles or ():
            if not cycle.response_complete:
                cycle.disconnected = True
                cycle.message_event.set()

    def pending(self) -> list[Any]:
        """The requests parsed and not yet answered, oldest first."""
        cycles = self._cycles if self._cycles is not None else [self.cycle]
        return [c for c in cycles if c is not None and not c.response_complete]


PROBE_AFTER_S = 0.02
"""How long a request of a half-closed connection runs before the client is probed: as long as
the inference routes wait before watching for a disconnect (inference.WATCH_AFTER_S)."""
RESET_CHECKS_S = (0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5)
"""The waits, from the probe on, between looks at the socket for a client's reset (0.9 s in
all: a round trip, with room for a busy machine)."""
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


class HalfClosed(Pipelined):
    """Mixed into a uvicorn protocol class: a client that closes its sending side once its
    request is sent (`shutdown(SHUT_WR)`, `ncat` at the end of its input) gets its answer.

    uvicorn closed the connection at the first end of input (asyncio closes a transport whose
    protocol's `eof_received` returns false; uvicorn issue 1264), so the request was answered
    to no one and the client read nothing. A half-close and a client that left both arrive as
    one FIN, so the connection stays open for writing, and a request that runs longer than
    PROBE_AFTER_S is probed: an HTTP/1.1 client is sent an interim `100 Continue`, which every
    HTTP/1.1 client reads past (RFC 9110, 15.2); one that has left answers it with a reset,
    which asyncio does not see on a socket it no longer reads, so the socket's error is looked
    at a few times (RESET_CHECKS_S). A reset drops the connection as before: the batcher drops
    its items. Not seen: an HTTP/1.0 client that left (no 1xx may go to one), or a client that
    leaves after the checks; their items run, and the answer goes nowhere. Once every request
    is answered, the connection closes.
    """

    transport: asyncio.Transport
    loop: asyncio.AbstractEventLoop
    _half_closed = False

    def eof_received(self) -> bool:
        if not self.pending():
            return False  # nothing to answer: closed, as uvicorn does
        self._half_closed = True
        self.loop.call_later(PROBE_AFTER_S, self._probe)
        return True

    def on_response_complete(self) -> None:
        super().on_response_complete()  # type: ignore[misc]
        if self._half_closed and not self.pending() and not self.transport.is_closing():
            self.transport.close()

    def _probe(self) -> None:
        pending = self.pending()
        if self.transport.is_closing() or not pending:
            return
        if any(c.response_started for c in pending):  # a 100 inside an answer would break it
            return
        if all(c.scope["http_version"] == "1.1" for c in pending):
            self.transport.write(CONTINUE)
            self.loop.call_later(RESET_CHECKS_S[0], self._look_for_reset, RESET_CHECKS_S[1:])

    def _look_for_reset(self, later: tuple[float, ...]) -> None:
        """Drop the connection if the client reset it; else look again after `later[0]`."""
        if self.transport.is_closing():
            return
        sock = self.transport.get_extra_info("socket")
        if sock is not None and sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
            self.transport.abort()  # the client is gone: its requests are disconnected
        elif later:
            self.loop.call_later(later[0], self._look_for_reset, later[1:])
