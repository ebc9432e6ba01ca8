"""Admission: where a request waits, its body unread, until the batcher's queue has room.

A request enters at once while the queue has room and nobody waits before it. Otherwise it
waits in line (first come, first in) until rows are freed, for at most `DOOR_WAIT_S` and never
past its deadline; then it is refused with 503 and Retry-After, its body still unread. A request
let in holds a row of the room until it queues (`queued()`) or its task ends: a burst that
reached an empty queue all at once walked in together, read and decoded every body, and all
but a queue's worth were refused then (192 of 200 at max_queue_size 8).

Why wait at all instead of refusing at once: a client that re-sends the moment it is refused
(a closed loop, perf_analyzer, most retry loops) turns instant refusals into a spin that eats
the cores the model needs. Measured on 2 cores (docs/performance.md, "Overload"): with
instant refusals, good answers at 256 connections fell to a fraction of the 16-connection
figure; waiting at the door costs a timer, not a core.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable

from edgeserve.errors import Unavailable

DOOR_WAIT_S = 1.0
"""The longest a request waits for room: Retry-After's own unit, so a refused client that
honours it comes back when the server said it would have waited anyway."""


class Door:
    """The line in front of one queue; `room()` says how many rows the queue can take now."""

    def __init__(self, room: Callable[[], int], limit: int, wait_s: float = DOOR_WAIT_S) -> None:
        self._room = room
        self._limit = limit
        self._wait_s = wait_s
        self._line: deque[asyncio.Future[None]] = deque()
        self._entering = 0  # let in from the line, their tasks not yet resumed
        self._entered: set[asyncio.Task[object]] = set()  # let in, not yet queued
        self._closed: str | None = None
        self.let_in_elsewhere: Callable[[], int] = lambda: 0
        """Requests other doors let in for this queue, bodies not queued yet (a server's fronts
        take the way straight in without asking this one: workers/front.py)."""

    @property
    def waiting(self) -> int:
        return len(self._line)

    @property
    def at_door(self) -> int:
        """Requests in line, and those let in from it whose tasks have not resumed yet."""
        return len(self._line) + self._entering

    def enter_now(self) -> bool:
        """Let the request in if nobody waits and the queue has room (`enter`'s first step, for
        a caller that must take it under a lock of its own); False: it would wait."""
        if self._closed is not None:
            raise Unavailable(self._closed)
        if self._line or self._free() <= 0:
            return False
        self._hold()
        return True

    async def enter(self, deadline: float) -> None:
        """Return once the request may read its body and queue; else raise Unavailable."""
        if self.enter_now():
            return
        waiter = asyncio.get_running_loop().create_future()
        self._line.append(waiter)
        wait_s = min(self._wait_s, deadline - time.monotonic())
        try:
            await asyncio.wait_for(asyncio.shield(waiter), max(wait_s, 0.0))
        except TimeoutError:
            self.open()  # rows held by requests that ended without queueing are free again
            if not waiter.done():  # nobody let it in meanwhile
                ahead = self.let_in_elsewhere() + self._entering + len(self._entered)
                raise Unavailable(
                    f"queue full: {self._limit - self._room()} of {self._limit} rows waiting"
                    + (f" and {ahead} requests let in ahead" if ahead else "")
                    + f", no room within {wait_s:.2f} s",
                    retry_after_s=self._wait_s,
                ) from None
        finally:
            if waiter in self._line:
                self._line.remove(waiter)
            elif waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                self._entering -= 1
        waiter.result()  # the door closed while it waited: Unavailable
        self._hold()

    def queued(self) -> None:
        """The current task's request has reached the queue (or been refused there): the row it
        held at the door is the queue's to count now."""
        task = asyncio.current_task()
        if task is not None:
            self._entered.discard(task)

    def _hold(self) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._entered.add(task)

    def _free(self) -> int:
        """Rows the door may still let in. A request let in that ended without queueing (a bad
        body, a client gone) holds its row until the door runs short and looks: a set add and
        discard a request, no callback on every task."""
        free = self._room() - self.let_in_elsewhere() - self._entering - len(self._entered)
        if free <= 0 and self._entered:
            self._entered = {task for task in self._entered if not task.done()}
            free = self._room() - self.let_in_elsewhere() - self._entering - len(self._entered)
        return free

    def open(self) -> None:
        """Rows were freed: let in as many as now fit, first come first (counted once: each
        one let in takes one row)."""
        for _ in range(min(len(self._line), self._free()) if self._line else 0):
            self._line.popleft().set_result(None)
            self._entering += 1

    def close(self, reason: str) -> None:
        """Draining: refuse newcomers and everyone waiting."""
        self._closed = reason
        while self._line:
            self._line.popleft().set_exception(Unavailable(reason))
