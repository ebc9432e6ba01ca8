"""A discrete-event simulation of one batcher worker driven by the real `plan_batch`.

Poisson arrivals, a batch cost a + c*b known exactly (as if learned), no HTTP: it isolates the
planner's decisions from a shared machine's noise, so fixed max_queue_delay settings and the SLO
can be compared exactly, rate by rate.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from edgeserve.batching.cost import Outlook
from edgeserve.batching.plan import BatchPolicy, plan_batch

FIXED_COST_S = 0.002
ROW_COST_S = 0.0025
MAX_BATCH = 32


@dataclass(frozen=True, eq=False)
class Item:
    enqueued: float
    rows: int = 1
    key: str = "x"
    deadline: float = math.inf

    @property
    def arrived(self) -> float:  # reached the batcher as it reached the server
        return self.enqueued


@dataclass(frozen=True)
class Outcome:
    """Answered per second within the window, p99 of all answered (the queue left at the end
    included), answered within `slo_ms` per second of window (goodput), share refused."""

    served_per_s: float
    p99_ms: float
    goodput_per_s: float
    shed: float


def cost(rows: int) -> float:
    return FIXED_COST_S + ROW_COST_S * rows


def capacity() -> float:
    return max(b / cost(b) for b in range(1, MAX_BATCH + 1))


def simulate(
    policy: BatchPolicy, rate: float, slo_ms: float, seconds: float = 20.0, seed: int = 0
) -> Outcome:
    """Run the worker loop against Poisson arrivals; latencies are enqueue -> batch end. The
    queue is drained at the end, so late answers of an overloaded queue count as late."""
    rng = random.Random(seed)
    arrivals, t = [], 0.0
    while (t := t + rng.expovariate(rate)) < seconds:
        arrivals.append(Item(t))
    outlook = Outlook(tuple(cost(b) for b in range(1, MAX_BATCH + 1)), rate)
    queue: list[Item] = []
    latencies: list[float] = []
    shed, now, next_arrival, in_window = 0, 0.0, 0, 0
    while next_arrival < len(arrivals) or queue:
        while next_arrival < len(arrivals) and arrivals[next_arrival].enqueued <= now:
            queue.append(arrivals[next_arrival])
            next_arrival += 1
        plan = plan_batch(queue, policy, now, outlook)
        gone = set(map(id, plan.batch + plan.shed + plan.expired))
        queue = [item for item in queue if id(item) not in gone]
        shed += len(plan.shed) + len(plan.expired)
        if plan.batch:
            now += cost(sum(item.rows for item in plan.batch))
            latencies += [now - item.enqueued for item in plan.batch]
            in_window += len(plan.batch) if now <= seconds else 0
            continue
        upcoming = arrivals[next_arrival].enqueued if next_arrival < len(arrivals) else math.inf
        wake = plan.wake_at if plan.wake_at is not None else math.inf
        now = max(min(upcoming, wake), now + 1e-9)  # float sums may land a hair before a delay
    latencies.sort()
    p99 = latencies[int(0.99 * (len(latencies) - 1))] * 1000 if latencies else math.nan
    good = sum(1 for latency in latencies if latency * 1000 <= slo_ms)
    return Outcome(in_window / seconds, p99, good / seconds, shed / max(len(arrivals), 1))


def fixed(delay_ms: float) -> BatchPolicy:
    return BatchPolicy(MAX_BATCH, (), delay_ms / 1000, 100_000, 1)


def with_slo(slo_ms: float) -> BatchPolicy:
    return BatchPolicy(MAX_BATCH, (), 0.002, 100_000, 1, latency_slo_s=slo_ms / 1000)
