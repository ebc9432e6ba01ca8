"""Statistics of a server of several processes, kept on the board (board.py).

Every front's `/v2/models/stats` and `/metrics` show the whole server: batches summed over the
inference processes, requests summed over the fronts, as one Triton server reports them. The
Prometheus view adds per front (requests answered, in flight) and per inference process
(`instance`, `device`: inferences, executions, rows held and queued, restarts, up).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Sequence

import numpy as np
from prometheus_client.metrics_core import Metric

from edgeserve.stats import HOOKS, Counters, Duration, ModelStats, Phases
from edgeserve.types import ComputeTimes
from edgeserve.workers.board import (
    CLOSED,
    FIXED,
    HANDED,
    HOOKS_AT,
    IN_FLIGHT,
    INSTANCE_PID,
    PER_SIZE,
    PID,
    QUEUED,
    RESTARTS,
    Board,
)


class SharedStats(ModelStats):
    """ModelStats on the board: batches from the inference process `instance`, requests from
    the front `front` (None in an inference process), read as the sum of every process."""

    def __init__(
        self,
        model: str,
        version: str,
        board: Board,
        devices: Sequence[str],
        *,
        front: int | None = None,
        instance: int | None = None,
    ) -> None:
        super().__init__(model, version)
        self.board = board
        self._front = None if front is None else board.slot(front)
        self._batches = None if instance is None else board.batch_section(instance)
        if front is not None:
            board.front_started(front, os.getpid())
        if instance is not None:
            board.instance(instance)[INSTANCE_PID] = os.getpid()
        labels = {"model": model, "version": version}
        self.registry.register(_ProcessCollector(board, labels, list(devices)))

    def batch_done(
        self, size: int, queue_ns: Sequence[int], compute: ComputeTimes, ok: bool
    ) -> None:
        """As ModelStats.batch_done, on the board (called on the inference process's loop)."""
        cells, items = self._batches, len(queue_ns)
        assert cells is not None, "batches run only in an inference process"
        cells[0] += 1  # odd: writing
        cells[4] += items
        cells[5] += sum(queue_ns)
        if ok:
            cells[1] += size
            cells[2] += 1
            cells[3] = time.time_ns() // 1_000_000
            by_size = FIXED + PER_SIZE * min(size, self.board.sizes - 1)
            for phase, ns in enumerate(compute):
                cells[6 + 2 * phase] += items
                cells[7 + 2 * phase] += ns * items
                cells[by_size + 2 * phase] += 1
                cells[by_size + 2 * phase + 1] += ns
        cells[0] += 1  # even: consistent

    def request_started(self) -> None:
        if self._front is not None:
            self._front[IN_FLIGHT] += 1

    def handler_done(self, hook: str, duration_ns: int) -> None:
        if self._front is None:
            return
        at = HOOKS_AT + 2 * HOOKS.index(hook)
        self._front[at] += 1
        self._front[at + 1] += duration_ns

    def request_done(self, ok: bool, duration_ns: int) -> None:
        if self._front is None:
            return
        at = 0 if ok else 2
        self._front[at] += 1
        self._front[at + 1] += duration_ns
        self._front[IN_FLIGHT] -= 1

    def snapshot(self) -> Counters:
        sections = self.board.batch_sections()
        batch = np.sum(sections, axis=0)
        slots = self.board.slots().sum(0)
        pairs = [Duration(int(c), int(ns)) for c, ns in batch[4:].reshape(-1, 2)]
        queue, compute_input, compute_infer, compute_output = pairs[:4]
        by_size = [pairs[4 + 3 * size : 7 + 3 * size] for size in range(self.board.sizes)]
        return Counters(
            int(batch[1]),
            int(batch[2]),
            max(int(section[3]) for section in sections),
            Duration(int(slots[0]), int(slots[1])),
            Duration(int(slots[2]), int(slots[3])),
            queue,
            compute_input,
            compute_infer,
            compute_output,
            {size: Phases(*phases) for size, phases in enumerate(by_size) if phases[1].count},
            {
                hook: Duration(int(slots[HOOKS_AT + 2 * i]), int(slots[HOOKS_AT + 2 * i + 1]))
                for i, hook in enumerate(HOOKS)
                if slots[HOOKS_AT + 2 * i]
            },
        )


class _ProcessCollector:
    """Per front and per inference process, read from the board at scrape time."""

    def __init__(self, board: Board, labels: dict[str, str], devices: list[str]) -> None:
        self._board = board
        self._labels = labels
        self._devices = devices

    def collect(self) -> Iterator[Metric]:
        yield from self._fronts()
        yield from self._instances()

    def _fronts(self) -> Iterator[Metric]:
        answered = Metric("edgeserve_front_requests", "Requests answered, per front", "unknown")
        in_flight = Metric("edgeserve_front_in_flight", "Requests in flight, per front", "gauge")
        connections = Metric(
            "edgeserve_front_connections", "Client connections open, per front", "gauge"
        )
        for index, slot in enumerate(self._board.slots()):
            labels = {**self._labels, "front": str(index), "pid": str(slot[PID])}
            answered.add_sample("edgeserve_front_requests", labels, int(slot[0] + slot[2]))
            in_flight.add_sample("edgeserve_front_in_flight", labels, int(slot[IN_FLIGHT]))
            open_now = int(slot[HANDED] - slot[CLOSED])
            connections.add_sample("edgeserve_front_connections", labels, open_now)
        yield from (answered, in_flight, connections)

    def _instances(self) -> Iterator[Metric]:
        slots, held = self._board.instance_slots(), self._board.held_rows()
        sections = self._board.batch_sections()
        families = {
            "inferences": ("Rows inferred, per inference process", "unknown"),
            "executions": ("Batches run, per inference process", "unknown"),
            "held_rows": ("Rows sent by the fronts, not answered yet", "gauge"),
            "queued_rows": ("Rows waiting in the batcher", "gauge"),
            "restarts": ("Restarts, per inference process", "unknown"),
        }
        metrics = {
            key: Metric(f"edgeserve_instance_{key}", *about) for key, about in families.items()
        }
        for index, (slot, device) in enumerate(zip(slots, self._devices, strict=True)):
            labels = {**self._labels, "instance": str(index), "device": device}
            labels["pid"] = str(slot[INSTANCE_PID])
            values = {
                "inferences": sections[index][1],
                "executions": sections[index][2],
                "held_rows": held[index],
                "queued_rows": slot[QUEUED],
                "restarts": slot[RESTARTS],
            }
            for key, value in values.items():
                metrics[key].add_sample(f"edgeserve_instance_{key}", labels, int(value))
        restarts = Metric(
            "edgeserve_inference_restarts", "Restarts, all inference processes", "unknown"
        )
        restarts.add_sample(
            "edgeserve_inference_restarts", self._labels, int(slots[:, RESTARTS].sum())
        )
        yield from (*metrics.values(), restarts)
