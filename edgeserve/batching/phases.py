"""What a batch reports: its three compute phases, timed, and the observer told of them."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Protocol

from edgeserve.types import ComputeTimes


class BatchObserver(Protocol):
    """Told about every batch that ran: rows, each item's queue time, compute time, success."""

    def batch_done(
        self, size: int, queue_ns: Sequence[int], compute: ComputeTimes, ok: bool
    ) -> None: ...


class PhaseClock:
    """Laps of one execution: gathering inputs, running the model, handing out outputs."""

    __slots__ = ("_laps",)

    def __init__(self) -> None:
        self._laps = [time.perf_counter_ns()]

    def lap(self, waited_ns: int = 0) -> None:
        """End the current phase; `waited_ns` of it were spent waiting (for the device), not
        computing: the phase counts as having started that much later."""
        self._laps[-1] += waited_ns
        self._laps.append(time.perf_counter_ns())

    def times(self) -> ComputeTimes:
        """The three phases; a batch that failed early has the missing ones as 0."""
        laps = self._laps + [self._laps[-1]] * (4 - len(self._laps))
        return ComputeTimes(laps[1] - laps[0], laps[2] - laps[1], laps[3] - laps[2])
