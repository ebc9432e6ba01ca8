"""What the batcher learns online from its own batches: the cost of a batch, the arrival rate,
and whether waiting for company has been paying off.

All three are updated from events the batcher sees anyway (a batch ran, a request arrived, a
wait ended), never by polling. The planner reads them as one frozen `Outlook`, so planning
stays a pure function of (queue, policy, clock, outlook).

The cost of a batch of b rows is predicted from an EWMA of the batches of exactly b rows when
there were some, else from cost(b) = a + c*b fitted by recursive least squares over all
batches (a: the fixed cost of a batch, c: the cost per row).
"""

from __future__ import annotations

import math
from typing import NamedTuple

EWMA_WEIGHT = 0.2
"""Weight of the newest observation in every moving average here."""
FORGETTING = 0.99
"""RLS forgetting factor: the fit follows a machine whose speed changes (shared cores)."""
SPIKE_CAP = 3.0
"""An observation counts as at most 3x the current estimate: spikes pass, a slowdown still shows."""
REFRESH_EVERY = 32
"""The table is rebuilt on a new size and every 32nd batch: cheap at thousands of batches/s."""
GAIN_FLOOR = 0.5
"""Waits gathering fewer extra items than this on average are not worth their latency."""


class Outlook(NamedTuple):
    """What the planner knows of the near future; `cost[b - 1]` is seconds for b rows.
    (A named tuple: one is made for every decision, and a frozen dataclass costs 5x more.)"""

    cost: tuple[float, ...] = ()
    arrival_rate: float = 0.0
    waiting_pays: bool = True

    def cost_of(self, rows: int) -> float:
        """Predicted seconds for a batch of `rows` (0.0 while nothing is known)."""
        if not self.cost:
            return 0.0
        if rows <= len(self.cost):
            return self.cost[max(rows, 1) - 1]
        return self.cost[-1] * rows / len(self.cost)

    def backlog_s(self, rows: int, max_rows: int, instances: int) -> float:
        """Predicted seconds to run `rows` queued rows: full batches spread over the instances."""
        full, rest = divmod(rows, max(max_rows, 1))
        tail = self.cost_of(rest) if rest else 0.0
        return full * self.cost_of(max_rows) / max(instances, 1) + tail

    def rows_to_keep_up(self, max_rows: int, headroom: float) -> int:
        """The smallest batch whose throughput beats the arrival rate by `headroom` (or max)."""
        for rows in range(1, max_rows + 1):
            if rows >= self.arrival_rate * headroom * self.cost_of(rows):
                return rows
        return max_rows


class CostModel:
    """Seconds per batch by size: per-size EWMA, and a linear RLS fit for unseen sizes."""

    def __init__(self, max_rows: int) -> None:
        self._max_rows = max(max_rows, 1)
        self._seen: dict[int, float] = {}
        self._theta = [0.0, 0.0]  # a, c
        self._p = [[1e3, 0.0], [0.0, 1e3]]  # covariance of the fit, large: know nothing yet
        self._count = 0
        self.table: tuple[float, ...] = ()

    def observe(self, rows: int, seconds: float) -> None:
        """Learn from one batch that ran; refreshes `table`."""
        if rows < 1 or not math.isfinite(seconds) or seconds < 0:
            return
        old = self._seen.get(rows)
        if old is not None:  # one preempted batch on a shared machine must not poison the table
            seconds = min(seconds, SPIKE_CAP * old)
        self._seen[rows] = seconds if old is None else old + EWMA_WEIGHT * (seconds - old)
        self._fit(float(rows), seconds)
        self._count += 1
        if old is None or self._count % REFRESH_EVERY == 0:
            self.table = tuple(self.predict(b) for b in range(1, self._max_rows + 1))

    def predict(self, rows: int) -> float:
        """Seconds for `rows`: measured at that size if ever, else the fitted line (>= 0)."""
        if rows in self._seen:
            return self._seen[rows]
        a, c = self._theta
        fitted = a + c * rows
        nearest = min(self._seen, key=lambda seen: abs(seen - rows), default=None)
        if nearest is None:
            return max(fitted, 0.0)
        return max(fitted, self._seen[nearest] * min(1.0, rows / nearest))

    def _fit(self, x: float, y: float) -> None:
        """One step of recursive least squares on y = a + c*x with forgetting."""
        (p00, p01), (p10, p11) = self._p
        a, c = self._theta
        px0, px1 = p00 + p01 * x, p10 + p11 * x
        denominator = FORGETTING + px0 + x * px1
        g0, g1 = px0 / denominator, px1 / denominator
        error = y - (a + c * x)
        self._theta = [a + g0 * error, c + g1 * error]
        q0, q1 = p00 + x * p10, p01 + x * p11
        self._p = [
            [(p00 - g0 * q0) / FORGETTING, (p01 - g0 * q1) / FORGETTING],
            [(p10 - g1 * q0) / FORGETTING, (p11 - g1 * q1) / FORGETTING],
        ]


class ArrivalMeter:
    """Items per second arriving, as an EWMA of the gaps between arrivals."""

    def __init__(self) -> None:
        self._last: float | None = None
        self._gap = 0.0

    def arrived(self, now: float, items: int) -> None:
        if self._last is not None:
            gap = (now - self._last) / max(items, 1)
            self._gap = gap if not self._gap else self._gap + EWMA_WEIGHT * (gap - self._gap)
        self._last = now

    @property
    def rate(self) -> float:
        return 1.0 / self._gap if self._gap > 0 else 0.0


class WaitMeter:
    """Whether waiting for company gathers anyone: an EWMA of extra items per finished wait.

    A wait that gathers nobody (one client at a time, a closed loop at concurrency 1) is pure
    latency. Once waits stop paying, only a probe waits now and then, to notice when traffic
    comes back; a probe that gathers nobody doubles the gap to the next (up to `max_gap`).
    """

    def __init__(self, probe_every: int = 16, max_gap: int = 1024) -> None:
        self._gain = 1.0
        self._skipped = 0
        self._min_gap = self._gap = probe_every
        self._max_gap = max_gap
        self._probing = False

    def waited(self, extra_items: int) -> None:
        self._gain += EWMA_WEIGHT * (extra_items - self._gain)
        if extra_items > 0:
            self._gap = self._min_gap
        elif self._probing:
            self._gap = min(self._gap * 2, self._max_gap)
        self._probing = False

    def pays(self) -> bool:
        """True when waits have been gathering company (or it is time for a probe); ask only
        when there is something to wait with."""
        if self._gain >= GAIN_FLOOR:
            return True
        self._skipped += 1
        if self._skipped >= self._gap:
            self._skipped = 0
            self._probing = True
            return True
        return False
