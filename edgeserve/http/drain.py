"""Shutting down within a bound: stop taking work, and at the bound answer what is left 503.

begin(bound_s)  new requests get 503 with Retry-After before their body is read; the runtime
                stops (readiness 503) and runs what is queued at once, no waiting for company
at the bound    every request still in flight (reading its body, queued, in a handler) is
                answered 503 with Retry-After by its own task, so the server has nothing left
                and exits then: no client gets uvicorn's plain-text 500, and the process is
                gone at the bound rather than the bound plus uvicorn's graceful timeout
"""

from __future__ import annotations

import asyncio

from edgeserve.errors import Unavailable

RETRY_AFTER_S = 1.0
"""What a client refused while draining should wait before retrying (another instance)."""


class Drain:
    """The drain state of one app: the requests in flight, and whether the bound has passed."""

    def __init__(self) -> None:
        self.started = False
        self.expired = False
        self.tasks: set[asyncio.Task[None]] = set()

    def begin(self, bound_s: float) -> None:
        """Start draining; at `bound_s` from now, cancel every request still in flight."""
        if not self.started:
            self.started = True
            asyncio.get_running_loop().call_later(bound_s, self._expire)

    def check_open(self) -> None:
        """Refuse a new request once draining has started."""
        if self.started:
            raise Unavailable("the server is shutting down; retry", RETRY_AFTER_S)

    def answer(self, cancelled: asyncio.CancelledError) -> Unavailable:
        """The 503 for a request cancelled by the bound (any other cancellation propagates)."""
        task = asyncio.current_task()
        if not self.expired or task is None:
            raise cancelled
        task.uncancel()
        return Unavailable(
            "the server shut down before the request could be answered; retry", RETRY_AFTER_S
        )

    def _expire(self) -> None:
        self.expired = True
        for task in self.tasks:
            task.cancel()
