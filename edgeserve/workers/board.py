"""The board: int64 counters in shared memory that every process of one server reads.

    one slot per inference process   rows queued in its batcher and requests at its door
                                     (admission: waiting, or let in and not yet taken by
                                     their front), its restarts, its pid, and how many of
                                     the rows the fronts counted as sent it has received
    one batch section per inference  its batch statistics, behind a sequence lock (one writer:
    process                          that inference process of the moment, adding to what it finds)
    one slot per front               its requests: success count and ns, failure count and ns,
                                     in flight now, its pid; its connections handed (written by
                                     the supervisor) and closed, whether it accepts (handoff.py);
                                     count and ns of each handler hook (stats.HOOKS); then per
                                     inference process the rows it sent there that are not
                                     answered yet (the routing's load), then per inference
                                     process the requests it let in for that queue whose
                                     bodies are not queued yet (admission's places), then per
                                     inference process how many of its door's grants the
                                     front has taken and how many rows it has sent there, ever
                                     (what is on its way is what the other end has not counted)

The supervisor creates it (a memfd inherited by every child), so the counters outlive a
restarted process: statistics stay cumulative, as Triton's are. Each cell has one writer, and
aligned 8-byte stores are atomic on the machines edgeserve runs on (x86-64, aarch64). What no
store makes atomic, a look at the queues and the taking of a place there (by a front, or by an
inference process's door letting a WAIT in at once), is done under a lock on the board's first
byte (`admitting`).
"""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NamedTuple

import numpy as np

# in an inference process's slot
QUEUED, WAITING, RESTARTS, INSTANCE_PID, RECEIVED = 0, 1, 2, 3, 4
IN_FLIGHT, PID = 4, 5  # in a front's slot, after its success and failure durations
HANDED, CLOSED, ACCEPTING = 6, 7, 8  # a front's connections (handoff.py)
HOOKS_AT = 9  # a front's handler hooks: count, ns of each, in stats.HOOKS order
_INSTANCE = 5
FIXED = 12  # seq, inference_count, execution_count, last_ms, then count/ns of the queue and
# of the three compute phases (input, infer, output)
PER_SIZE = 6  # per batch size: count/ns of each compute phase
_FRONT = HOOKS_AT + 2 * 2
_SEQ_TRIES = 1000
LOCK_WAIT_S = 0.005
"""The longest a process waits for the admission lock (held for microseconds at a time)."""


class Queues(NamedTuple):
    """Per inference process: rows taken (queued, on their way, let in), rows the fronts hold
    there (the routing's load), requests waiting at its door."""

    taken: np.ndarray
    held: np.ndarray
    waiting: np.ndarray


class Board:
    """The counters of one server; `cells` is the int64 array over the shared memory."""

    def __init__(self, fd: int, fronts: int, instances: int, max_batch_size: int) -> None:
        self.fd = fd
        self.fronts = fronts
        self.instances = instances
        self.sizes = max(max_batch_size, 1) + 1  # batch sizes 0..max
        self.section = FIXED + PER_SIZE * self.sizes
        self.sections_at = _INSTANCE * instances
        self.slots_at = self.sections_at + self.section * instances
        self.slot_cells = _FRONT + 4 * instances
        count = _cells(fronts, instances, max_batch_size)
        self._map = mmap.mmap(fd, count * 8)
        self.cells = np.frombuffer(self._map, np.int64, count)

    @classmethod
    def create(cls, fronts: int, instances: int, max_batch_size: int) -> Board:
        fd = os.memfd_create("edgeserve-board", 0)  # inherited by the children (pass_fds)
        os.ftruncate(fd, 8 * _cells(fronts, instances, max_batch_size))
        return cls(fd, fronts, instances, max_batch_size)

    def instance(self, index: int) -> np.ndarray:
        """Inference process `index`'s slot (a view)."""
        return self.cells[_INSTANCE * index : _INSTANCE * (index + 1)]

    def instance_slots(self) -> np.ndarray:
        """Every inference process's slot, one row each (a copy)."""
        return self.cells[: self.sections_at].reshape(self.instances, _INSTANCE).copy()

    def publish_queue(self, instance: int, rows: int, waiting: int, received: int) -> None:
        slot = self.instance(instance)
        slot[QUEUED] = rows
        slot[WAITING] = waiting
        slot[RECEIVED] = received

    def queues(self) -> Queues:
        """Each inference process's queue as admission sees it: its rows queued, the rows on
        their way to it (sent by the fronts, not yet received as it last said), and the
        requests let in for it whose bodies are being read."""
        # Read in the order that never misses a request moving between the counts (each
        # moves it by two stores, the count it enters first): an inference process's received
        # before its queued rows, a front's places before its rows sent.
        received = self.cells[RECEIVED : self.sections_at : _INSTANCE].copy()
        slots, n = self.instance_slots(), self.instances
        parts = self._front_cells()[:, _FRONT:].reshape(self.fronts, 4, n)  # one view, 3 sums
        held, let_in = parts[:, 0].sum(0), parts[:, 1].sum(0)
        on_their_way = np.maximum(parts[:, 3].sum(0) - received, 0)
        return Queues(slots[:, QUEUED] + on_their_way + let_in, held, slots[:, WAITING])

    @contextmanager
    def admitting(self) -> Iterator[None]:
        """One process at a time looks for room and takes a place: two fronts (or a front and
        an inference process's door) that each saw the queue's last free row let a request in
        each, and one was refused once its body had been read. A POSIX record lock, held by a
        process for a few µs a request, and waited for at most LOCK_WAIT_S: an event loop never
        hangs on a holder that was stopped (SIGSTOP, a debugger) while holding it; past the
        bound the request goes on unlocked, the race back for that one look."""
        held = self._lock()
        try:
            yield
        finally:
            if held:
                fcntl.lockf(self.fd, fcntl.LOCK_UN, 1)

    def _lock(self) -> bool:
        deadline = time.monotonic() + LOCK_WAIT_S
        while True:
            try:
                fcntl.lockf(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1)
                return True
            except OSError as exc:
                if exc.errno not in (errno.EACCES, errno.EAGAIN):
                    raise
            if time.monotonic() > deadline:
                return False
            os.sched_yield()  # the holder may be waiting for this core

    def batch_section(self, instance: int) -> np.ndarray:
        """Inference process `instance`'s batch statistics (a view; the first cell is its seq)."""
        start = self.sections_at + self.section * instance
        return self.cells[start : start + self.section]

    def batch_sections(self) -> list[np.ndarray]:
        """A consistent copy of every batch section (a writer holds one only for a few stores)."""
        return [_consistent(self.batch_section(i)) for i in range(self.instances)]

    def slot(self, front: int) -> np.ndarray:
        """Front `front`'s slot (a view)."""
        start = self.slots_at + self.slot_cells * front
        return self.cells[start : start + self.slot_cells]

    def slots(self) -> np.ndarray:
        """Every front's slot, one row each (a copy)."""
        return self._front_cells().copy()

    def front_started(self, front: int, pid: int) -> None:
        """A front (re)started: its predecessor's requests and rows died with it."""
        slot = self.slot(front)
        slot[IN_FLIGHT], slot[PID] = 0, pid
        slot[_FRONT:] = 0

    def held(self, front: int) -> np.ndarray:
        """Rows front `front` sent to each inference process and has no answer for (a view)."""
        return self._part(front, 0)

    def held_rows(self) -> np.ndarray:
        """Rows each inference process holds for all fronts (sent, not answered yet)."""
        return self._summed(0)

    def let_in(self, front: int) -> np.ndarray:
        """Requests front `front` let in for each inference process's queue, their bodies not
        queued yet (a view)."""
        return self._part(front, 1)

    def let_in_rows(self) -> np.ndarray:
        """Requests every front let in for each inference process's queue, not queued yet."""
        return self._summed(1)

    def taken(self, front: int) -> np.ndarray:
        """Grants of each inference process's door that front `front` has taken (a view)."""
        return self._part(front, 2)

    def sent(self, front: int) -> np.ndarray:
        """Rows front `front` has sent to each inference process, ever (a view)."""
        return self._part(front, 3)

    def taken_from(self, instance: int) -> np.ndarray:
        """Grants of inference process `instance`'s door that each front has taken (a copy)."""
        return self._column(2, instance)

    def sent_to(self, instance: int) -> np.ndarray:
        """Rows each front has sent to inference process `instance`, ever (a copy)."""
        return self._column(3, instance)

    def _part(self, front: int, part: int) -> np.ndarray:
        """Part `part` (0 held, 1 let in, 2 taken, 3 sent) of a front's cells, one per inference
        process."""
        start = _FRONT + part * self.instances
        return self.slot(front)[start : start + self.instances]

    def _summed(self, part: int) -> np.ndarray:
        """Part `part` of every front's cells, summed per inference process."""
        start = _FRONT + part * self.instances
        summed: np.ndarray = self._front_cells()[:, start : start + self.instances].sum(0)
        return summed

    def _column(self, part: int, instance: int) -> np.ndarray:
        """Part `part` of every front's cells for inference process `instance` (a copy)."""
        column: np.ndarray = self._front_cells()[:, _FRONT + part * self.instances + instance]
        return column.copy()

    def _front_cells(self) -> np.ndarray:
        return self.cells[self.slots_at :].reshape(self.fronts, self.slot_cells)


def _cells(fronts: int, instances: int, max_batch_size: int) -> int:
    section = FIXED + PER_SIZE * (max(max_batch_size, 1) + 1)
    return (_INSTANCE + section) * instances + (_FRONT + 4 * instances) * fronts


def _consistent(section: np.ndarray) -> np.ndarray:
    for _ in range(_SEQ_TRIES):
        seq = int(section[0])
        copy = section.copy()
        if seq % 2 == 0 and int(section[0]) == seq:
            return copy
    return copy
