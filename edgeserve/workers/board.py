"""The board: int64 counters in shared memory that every process of one server reads.

    [0]                      rows queued in the inference process's batcher (admission)
    [1]                      restarts of the inference process
    [2]                      requests waiting at the door for room in the queue (admission)
    [STATS, STATS + n)       the batch statistics, behind a sequence lock (one writer: the
                             inference process of the moment, which adds to what it finds)
    one slot per front       its requests: success count and ns, failure count and ns,
                             in flight now, and its pid

The supervisor creates it (a memfd inherited by every child), so the counters outlive a
restarted process: statistics stay cumulative, as Triton's are. Each cell has one writer, and
aligned 8-byte stores are atomic on the machines edgeserve runs on (x86-64, aarch64).
"""

from __future__ import annotations

import mmap
import os
import time
from collections.abc import Iterator, Sequence

import numpy as np
from prometheus_client.metrics_core import Metric

from edgeserve.stats import Counters, Duration, ModelStats, Phases
from edgeserve.types import ComputeTimes

QUEUED, RESTARTS, WAITING, STATS = 0, 1, 2, 3
IN_FLIGHT, PID = 4, 5  # in a front's slot, after its success and failure durations
_FIXED = 12  # seq, inference_count, execution_count, last_ms, then count/ns of the queue and
# of the three compute phases (input, infer, output)
_PER_SIZE = 6  # per batch size: count/ns of each compute phase
_SLOT = 6
_SEQ_TRIES = 1000


class Board:
    """The counters of one server; `cells` is the int64 array over the shared memory."""

    def __init__(self, fd: int, fronts: int, max_batch_size: int) -> None:
        self.fd = fd
        self.fronts = fronts
        self.sizes = max(max_batch_size, 1) + 1  # batch sizes 0..max
        self.slots_at = STATS + _FIXED + _PER_SIZE * self.sizes
        count = self.slots_at + _SLOT * fronts
        self._map = mmap.mmap(fd, count * 8)
        self.cells = np.frombuffer(self._map, np.int64, count)

    @classmethod
    def create(cls, fronts: int, max_batch_size: int) -> Board:
        fd = os.memfd_create("edgeserve-board", 0)  # inherited by the children (pass_fds)
        sizes = max(max_batch_size, 1) + 1
        os.ftruncate(fd, 8 * (STATS + _FIXED + _PER_SIZE * sizes + _SLOT * fronts))
        return cls(fd, fronts, max_batch_size)

    @property
    def queued_rows(self) -> int:
        return int(self.cells[QUEUED])

    @property
    def waiting(self) -> int:
        return int(self.cells[WAITING])

    def publish_queue(self, rows: int, waiting: int) -> None:
        self.cells[QUEUED] = rows
        self.cells[WAITING] = waiting

    def slot(self, front: int) -> np.ndarray:
        start = self.slots_at + _SLOT * front
        return self.cells[start : start + _SLOT]

    def slots(self) -> np.ndarray:
        """Every front's slot, one row each (a copy)."""
        return self.cells[self.slots_at :].reshape(self.fronts, _SLOT).copy()


class SharedStats(ModelStats):
    """ModelStats kept on the board: batches from the inference process, requests from the
    front `front` (None in the inference process), read as the sum of every front."""

    def __init__(self, model: str, version: str, board: Board, front: int | None) -> None:
        super().__init__(model, version)
        self.board = board
        self._front = None if front is None else board.slot(front)
        if self._front is not None:
            self._front[IN_FLIGHT] = 0  # a restarted front: its predecessor's requests died
            self._front[PID] = os.getpid()
        self.registry.register(_FrontCollector(board, {"model": model, "version": version}))

    def batch_done(
        self, size: int, queue_ns: Sequence[int], compute: ComputeTimes, ok: bool
    ) -> None:
        """As ModelStats.batch_done, on the board (called on the inference process's loop)."""
        cells, base, items = self.board.cells, STATS, len(queue_ns)
        cells[base] += 1  # odd: writing
        cells[base + 4] += items
        cells[base + 5] += sum(queue_ns)
        if ok:
            cells[base + 1] += size
            cells[base + 2] += 1
            cells[base + 3] = time.time_ns() // 1_000_000
            by_size = base + _FIXED + _PER_SIZE * min(size, self.board.sizes - 1)
            for phase, ns in enumerate(compute):
                cells[base + 6 + 2 * phase] += items
                cells[base + 7 + 2 * phase] += ns * items
                cells[by_size + 2 * phase] += 1
                cells[by_size + 2 * phase + 1] += ns
        cells[base] += 1  # even: consistent

    def request_started(self) -> None:
        if self._front is not None:
            self._front[IN_FLIGHT] += 1

    def request_done(self, ok: bool, duration_ns: int) -> None:
        if self._front is None:
            return
        at = 0 if ok else 2
        self._front[at] += 1
        self._front[at + 1] += duration_ns
        self._front[IN_FLIGHT] -= 1

    def snapshot(self) -> Counters:
        batch = self._batch_cells()
        slots = self.board.slots().sum(0)
        pairs = [Duration(int(c), int(ns)) for c, ns in batch[4:].reshape(-1, 2)]
        queue, compute_input, compute_infer, compute_output = pairs[:4]
        by_size = [pairs[4 + 3 * size : 7 + 3 * size] for size in range(self.board.sizes)]
        return Counters(
            int(batch[1]),
            int(batch[2]),
            int(batch[3]),
            Duration(int(slots[0]), int(slots[1])),
            Duration(int(slots[2]), int(slots[3])),
            queue,
            compute_input,
            compute_infer,
            compute_output,
            {size: Phases(*phases) for size, phases in enumerate(by_size) if phases[1].count},
        )

    def _batch_cells(self) -> np.ndarray:
        """A consistent copy of the batch section (the writer holds it only for a few stores)."""
        section = self.board.cells[STATS : self.board.slots_at]
        for _ in range(_SEQ_TRIES):
            seq = int(section[0])
            copy = section.copy()
            if seq % 2 == 0 and int(section[0]) == seq:
                return copy
        return copy


class _FrontCollector:
    """Per front: requests answered and in flight; and the inference process's restarts."""

    def __init__(self, board: Board, labels: dict[str, str]) -> None:
        self._board = board
        self._labels = labels

    def collect(self) -> Iterator[Metric]:
        slots = self._board.slots()
        answered = Metric("edgeserve_front_requests", "Requests answered, per front", "unknown")
        in_flight = Metric("edgeserve_front_in_flight", "Requests in flight, per front", "gauge")
        for index, slot in enumerate(slots):
            labels = {**self._labels, "front": str(index), "pid": str(slot[PID])}
            answered.add_sample("edgeserve_front_requests", labels, int(slot[0] + slot[2]))
            in_flight.add_sample("edgeserve_front_in_flight", labels, int(slot[IN_FLIGHT]))
        restarts = Metric(
            "edgeserve_inference_restarts", "Restarts of the inference process", "unknown"
        )
        restarts.add_sample(
            "edgeserve_inference_restarts", self._labels, int(self._board.cells[RESTARTS])
        )
        yield from (answered, in_flight, restarts)
