"""Time bounds on slow clients, kept by uvicorn's own HTTP protocol (h11 or httptools).

    header_timeout_s  from a connection's start, or the end of its previous response, until the
                      next request's headers are complete; some bytes but not all by then: 408
                      and close; nothing at all: close (there is no request to answer)
    body_timeout_s    from a request's headers until its body is complete: 408 and close,
                      unless the app has answered already
    idle_timeout_s    a kept-alive connection with no new request is closed (uvicorn's
                      timeout_keep_alive)

Headers are also capped in size (MAX_HEADER_BYTES: 431), and bytes uvicorn cannot parse as HTTP
get a JSON 400 rather than its plain-text one. A client that closes its sending side (FIN) part
way through a request's headers or body gets a JSON 400 saying so: nothing more of it can come.
A request answered before its body is in (a 413 on its Content-Length, a 503 at the door) has
the rest of its body read and dropped under the body bound, so that a client sending it whole
before reading (tritonclient) reads the answer and its connection serves on; one waiting for a
`100 Continue` that never came is closed. With CORS on, these answers carry the headers the
CORS layer adds (cors.py) when the request's Origin is known and allowed: a browser otherwise
shows the page an opaque CORS failure.

uvicorn bounds only the idle time; a connection that sends nothing, or half its headers or half
its body, would hold a slot for ever. The bounds live in the protocol rather than the app so that
the inference path pays nothing for them: a request that arrives whole never arms a body timer.
"""

from __future__ import annotations

import asyncio
import re
import sys
from dataclasses import dataclass
from typing import Any

from edgeserve.errors import EdgeserveError, HeadersTooLarge, InvalidInput, RequestTimeout, echo
from edgeserve.http.connection import HalfClosed, IgnoredUpgrade, without_upgrade
from edgeserve.http.cors import Cors
from edgeserve.http.errors import raw_response
from edgeserve.manifest import ResourcesSection

MAX_HEADER_BYTES = 64 * 1024
"""A request's line and headers together (nginx allows 32 KiB, uvicorn's h11 16 KiB)."""


@dataclass(frozen=True)
class Timeouts:
    """The bounds a server keeps, in seconds (defaults: the manifest's [resources])."""

    header_s: float
    body_s: float
    idle_s: float
    drain_s: float

    @classmethod
    def from_resources(cls, resources: ResourcesSection, **overrides: float | None) -> Timeouts:
        """The manifest's values, each replaced by an override that is not None (CLI flags)."""
        chosen = {
            "header_s": resources.header_timeout_s,
            "body_s": resources.body_timeout_s,
            "idle_s": resources.idle_timeout_s,
            "drain_s": resources.drain_timeout_s,
        }
        chosen.update({name: value for name, value in overrides.items() if value is not None})
        return cls(**chosen)


def protocol_class(
    timeouts: Timeouts, http: str = "auto", cors: Cors | None = None
) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol `http` ("auto": httptools, else h11) keeping the header and body
    bounds, with connection.py's ways with a connection (pipelined requests, a half-close, an
    Upgrade); its own error answers carry `cors`'s headers."""
    from uvicorn.config import HTTP_PROTOCOLS
    from uvicorn.importer import import_from_string

    base = import_from_string(HTTP_PROTOCOLS[http])
    attributes = {
        "header_timeout_s": timeouts.header_s,
        "body_timeout_s": timeouts.body_s,
        "cors": cors,
    }
    bases = (_Bounded, HalfClosed, IgnoredUpgrade, base)  # HalfClosed is also Pipelined
    return type(f"Bounded{base.__name__}", bases, attributes)


class _Bounded:
    """Mixed into a uvicorn protocol class: one timer per connection, re-armed per phase.

    A request's headers are complete once uvicorn has made a new request cycle (`self.cycle`);
    its body once that cycle has no `more_body`. Arming a phase only moves its deadline: the
    one timer wakes at the earliest deadline set and, if the deadline has moved on since, goes
    back to sleep until it. So a request pays for no timer of its own (scheduling and
    cancelling one per phase cost more than the rest of this class on a small request).
    """

    header_timeout_s: float
    body_timeout_s: float
    cors: Cors | None
    cycle: Any
    transport: asyncio.Transport
    loop: asyncio.AbstractEventLoop
    _timer: asyncio.TimerHandle | None = None
    _timer_at = 0.0  # when the timer wakes (loop time)
    _deadline = 0.0  # when the phase awaited ends (loop time)
    _phase: str | None = None  # "header", "body" or None (nothing to wait for)
    _watched: Any = None  # the cycle before the awaited headers, or the one whose body is awaited
    _header_bytes = 0  # bytes of the awaited headers received so far
    _body_bytes = 0  # bytes received after the awaited body's headers (in reads of their own)
    _header_tail = b""  # their last 3 bytes: a blank line may span two reads
    _header_seen: bytearray | None = None  # their bytes, in several reads, with CORS on
    _reading = b""  # the read being parsed in the header phase (its Origin, for a 400)

    def connection_made(self, transport: asyncio.Transport) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        self._await_headers()

    def data_received(self, data: bytes) -> None:
        phase = self._phase
        if phase == "header":
            if not self._whole_headers_in(data) and self._headers_past_cap(data):
                if not self.transport.is_closing():
                    self._refuse(HeadersTooLarge(f"request headers: over {MAX_HEADER_BYTES} bytes"))
                return  # never parsed: no request cycle starts
            self._reading = data
            super().data_received(without_upgrade(data))  # type: ignore[misc]
            self._reading = b""
            if self.cycle is not self._watched:  # the headers are complete
                self._await_body()
            return
        super().data_received(data)  # type: ignore[misc]
        if phase == "body":
            self._body_bytes += len(data)
            if self.cycle is not self._watched:  # h11: the next request, after an answered one
                self._await_body()
            elif not self._watched.more_body:
                self._phase = None

    def _whole_headers_in(self, data: bytes) -> bool:
        """Whether `data` is the first read of the awaited headers and holds all of them within
        the cap (most requests: nothing more to count)."""
        return not self._header_bytes and 0 <= data.find(b"\r\n\r\n") <= MAX_HEADER_BYTES - 4

    def _headers_past_cap(self, data: bytes) -> bool:
        """Whether the awaited headers, counted up to their blank line when `data` holds it,
        pass MAX_HEADER_BYTES; headers that arrive whole in one read count too."""
        seen = self._header_tail + data if self._header_tail else data  # no copy of a whole read
        end = seen.find(b"\r\n\r\n")
        counted = len(data) if end < 0 else end + 4 - len(self._header_tail)
        past = self._header_bytes + counted > MAX_HEADER_BYTES
        if self.cors is not None:  # their Origin, should they be refused
            if self._header_seen is None:
                self._header_seen = bytearray()
            self._header_seen += data[:counted]
        self._header_bytes += len(data)
        self._header_tail = seen[-3:]
        return past

    def on_response_complete(self) -> None:
        super().on_response_complete()  # type: ignore[misc]
        if self.transport.is_closing():
            return
        if self._phase == "body" and self._watched is self.cycle and self.cycle.more_body:
            # Answered before its body was in (413, 503): uvicorn reads the rest and drops it,
            # under the body bound; its bytes are no next request's headers (they were counted
            # so: a 431 and a reset, where the client, still sending, was to read a 413). A body
            # that waits for `100 Continue`, which never came, never will: closed.
            nothing_sent = not self._body_bytes and not self.cycle.body
            if nothing_sent and _expects_continue(self.cycle.scope["headers"]):
                self.transport.close()
            return
        self._await_headers()

    def on_message_complete(self) -> None:
        """httptools: the end of a request's body; of an answered one, the next headers are due."""
        super().on_message_complete()  # type: ignore[misc]
        if self._phase == "body" and self._watched.response_complete:
            self._await_headers()

    def eof_received(self) -> bool | None:
        """The client closed its sending side: a request it had begun can never be complete."""
        phase = self._phase
        if phase == "header" and self._header_bytes:
            self._refuse(_cut("headers end before their blank line"))
            return None
        if phase == "body" and not self._watched.response_started:
            self._watched.disconnected = True  # the app's receive() sees a disconnect
            self._watched.message_event.set()
            self._refuse(_cut("body ends before its length (Content-Length or chunks)"))
            return None
        return super().eof_received()  # type: ignore[misc]

    def connection_lost(self, exc: Exception | None) -> None:
        self._phase = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        super().connection_lost(exc)  # type: ignore[misc]

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to bytes that are not HTTP, in JSON like every other error, with
        what the parser found wrong: uvicorn calls this while it handles the parser's error,
        and says only "Invalid HTTP request received." itself."""
        self._refuse(InvalidInput(f"not a valid HTTP/1.1 request: {echo(_parser_says(msg))}"))

    def _await_body(self) -> None:
        """The headers of `self.cycle` are complete: await its body, if it has more."""
        if self.cycle.more_body:
            self._watched, self._body_bytes = self.cycle, 0
            self._arm("body", self.body_timeout_s)
        else:
            self._phase = None

    def _await_headers(self) -> None:
        self._watched, self._header_bytes, self._header_tail = self.cycle, 0, b""
        self._header_seen = None
        self._arm("header", self.header_timeout_s)

    def _arm(self, phase: str | None, delay_s: float = 0.0) -> None:
        """Await `phase` for `delay_s` from now (None: nothing is awaited)."""
        self._phase = phase
        if phase is None:
            return  # a timer still set finds no phase when it wakes
        self._deadline = deadline = self.loop.time() + delay_s
        if self._timer is None or deadline < self._timer_at:
            if self._timer is not None:
                self._timer.cancel()
            self._timer_at = deadline
            self._timer = self.loop.call_at(deadline, self._wake)

    def _wake(self) -> None:
        self._timer = None
        if self._phase is None:
            return
        if self._deadline > self._timer_at:  # the phase was re-armed since: sleep on
            self._timer_at = self._deadline
            self._timer = self.loop.call_at(self._deadline, self._wake)
            return
        self._expired()

    def _expired(self) -> None:
        phase = self._phase
        if self.transport.is_closing():
            return
        if phase == "header" and self._header_bytes:
            self._refuse(_late("headers", "header", self.header_timeout_s))
        elif phase == "body" and not self._watched.response_started:
            self._watched.disconnected = True  # the app's receive() sees a disconnect
            self._watched.message_event.set()
            self._refuse(_late("body", "body", self.body_timeout_s))
        self.transport.close()

    def _refuse(self, error: EdgeserveError) -> None:
        """Answer `error` and close: the request can't be read any further."""
        origin = self._origin() if self.cors is not None else None
        added = self.cors.answer_headers(origin) if self.cors and origin is not None else []
        self.transport.write(raw_response(error, added))
        self.transport.close()

    def _origin(self) -> str | None:
        """The Origin of the request being refused, where it is known: from its headers once
        they are parsed, else from a whole Origin line among its bytes received so far. Not
        known (None, no CORS header) when that line has not arrived whole: the request line
        never finished, or the headers stopped before the Origin line; the browser then shows
        the page a CORS failure, as it would for a connection that was simply closed."""
        if self._phase == "body":
            for name, value in self._watched.scope["headers"]:
                if name == b"origin":
                    return str(value.decode("latin-1"))
            return None
        if self._phase != "header":
            return None  # a request that follows an answered one on its connection: unknown
        seen = self._reading if self._header_seen is None else bytes(self._header_seen)
        blank = seen.find(b"\r\n\r\n")
        found = _ORIGIN_LINE.search(seen, 0, len(seen) if blank < 0 else blank + 2)
        return None if found is None else found[1].decode("latin-1")


def _expects_continue(headers: list[tuple[bytes, bytes]]) -> bool:
    return any(name == b"expect" and value.lower() == b"100-continue" for name, value in headers)


_ORIGIN_LINE = re.compile(rb"(?i)\r\norigin[ \t]*:[ \t]*([^\r\n]*?)[ \t]*\r\n")
"""A whole Origin header line (not the request line: it follows a line's end)."""


def _parser_says(msg: str) -> str:
    """What the HTTP parser found wrong, from the error being handled (uvicorn's `msg` else):
    the error a parser callback raised rather than "User callback error", and an HTTP/2
    preface named as such rather than llhttp's "Pause on PRI/Upgrade"."""
    found = sys.exc_info()[1]
    if found is None or not str(found):
        return msg
    if "PRI" in str(found):
        return "an HTTP/2 preface: HTTP/1.1 here (gRPC: serve --grpc-port)"
    if "callback error" in str(found) and found.__context__ is not None:
        return str(found.__context__) or str(found)
    return str(found)


def _cut(what: str) -> InvalidInput:
    return InvalidInput(
        f"the request's {what}: the client closed its side of the connection (a FIN) before "
        "sending the rest; the connection is closed"
    )


def _late(part: str, setting: str, bound_s: float) -> RequestTimeout:
    return RequestTimeout(
        f"the request's {part} did not arrive within {bound_s:g} s ([resources] "
        f"{setting}_timeout_s of the function); the connection is closed"
    )
