"""A discrete-event simulation of one batcher worker driven by the real `plan_batch`.

Poisson arrivals, a batch cost a + c*b known exactly (as if learned), no HTTP: it isolates the
planner's decisions from a shared machine's noise, so fixed max_queue_delay settings and the SLO
can be compared exactly, rate by rate.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from edgeserve.batchcost import Outlook
from edgeserve.batchplan import BatchPolicy, plan_batch

FIXED_COST_S = 0.002
ROW_COST_S = 0.0025
MAX_BATCH = 32


@dataclass(frozen=True, eq=False)
class Item:
    enqueued: float
    rows: int = 1
    key: str = "x"
    deadline: float = math.inf


@dataclass(frozen=True)
class Outcome:
    served_per_s: float
    p99_ms: float
    shed: float  # share of arrivals refused


def cost(rows: int) -> float:
    return FIXED_COST_S + ROW_COST_S * rows


def capacity() -> float:
    return max(b / cost(b) for b in range(1, MAX_BATCH + 1))


def simulate(policy: BatchPolicy, rate: float, seconds: float = 20.0, seed: int = 0) -> Outcome:
    """Run the worker loop against Poisson arrivals; latencies are enqueue -> batch end."""
    rng = random.Random(seed)
    arrivals, t = [], 0.0
    while (t := t + rng.expovariate(rate)) < seconds:
        arrivals.append(Item(t))
    outlook = Outlook(tuple(cost(b) for b in range(1, MAX_BATCH + 1)), rate)
    queue: list[Item] = []
    latencies: list[float] = []
    shed, now, next_arrival = 0, 0.0, 0
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
            continue
        upcoming = arrivals[next_arrival].enqueued if next_arrival < len(arrivals) else math.inf
        now = min(upcoming, plan.wake_at if plan.wake_at is not None else math.inf)
    latencies.sort()
    p99 = latencies[int(0.99 * (len(latencies) - 1))] * 1000 if latencies else math.nan
    return Outcome(len(latencies) / seconds, p99, shed / max(len(arrivals), 1))


def fixed(delay_ms: float) -> BatchPolicy:
    return BatchPolicy(MAX_BATCH, (), delay_ms / 1000, 100_000, 1)


def with_slo(slo_ms: float) -> BatchPolicy:
    return BatchPolicy(MAX_BATCH, (), 0.002, 100_000, 1, latency_slo_s=slo_ms / 1000)
