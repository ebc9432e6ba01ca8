"""The batcher's decisions as pure functions: the policy, and what runs next (`plan_batch`).

Triton's dynamic batching rules, plus what Triton lacks: with `latency_slo_s` the plan sheds
what cannot make its deadline and sizes batches from the learned batch cost (`Outlook`).
Nothing here touches asyncio or the clock: tests drive it with tables.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from edgeserve.batching.cost import Outlook
from edgeserve.manifest import BatchingSection

SLO_MARGIN = 0.25
"""Share of latency_slo_ms kept back for what the batcher does not see (HTTP, decoding, jitter)."""
KEEP_UP_HEADROOM = 1.25
"""With an SLO, a batch closes once it is large enough to serve 1.25x the current arrival rate."""


@dataclass(frozen=True)
class BatchPolicy:
    """How items are grouped; sizes count rows (axis 0). max_batch_size 0: never batched."""

    max_batch_size: int
    preferred_batch_sizes: tuple[int, ...] = ()
    max_queue_delay_s: float = 0.0
    max_queue_size: int = 1024
    instances: int = 1
    latency_slo_s: float | None = None

    @property
    def budget_s(self) -> float | None:
        """Time an item may spend queued and computing under the SLO (None: no SLO)."""
        return self.latency_slo_s * (1 - SLO_MARGIN) if self.latency_slo_s else None

    @classmethod
    def from_manifest(cls, section: BatchingSection, batched: bool) -> BatchPolicy:
        """An unbatchable model (Triton's auto-complete rule) runs every request alone."""
        max_batch_size = section.max_batch_size if batched else 0
        return cls(
            max_batch_size=max_batch_size,
            preferred_batch_sizes=tuple(sorted(set(section.preferred_batch_sizes)))
            if max_batch_size
            else (),
            max_queue_delay_s=section.max_queue_delay_ms / 1000,
            max_queue_size=section.max_queue_size,
            instances=section.instances,
            latency_slo_s=section.latency_slo_ms / 1000 if section.latency_slo_ms else None,
        )


class Alone:
    """A batch key equal to no other: its item runs in a batch of its own, and at once, since
    waiting would gather no company (a request sending an input without the batch axis)."""


class Pending(Protocol):
    """What the planner needs to know of a queued item."""

    @property
    def rows(self) -> int: ...
    @property
    def key(self) -> Hashable: ...
    @property
    def enqueued(self) -> float: ...
    @property
    def arrived(self) -> float: ...
    @property
    def deadline(self) -> float: ...


P = TypeVar("P", bound=Pending)


@dataclass(frozen=True)
class Plan(Generic[P]):
    """Run `batch` now if not empty, fail `expired` (504) and `shed` (503: cannot make the
    SLO); else plan again at `wake_at` or on arrival."""

    batch: tuple[P, ...]
    expired: tuple[P, ...]
    wake_at: float | None = None
    shed: tuple[P, ...] = ()


def plan_batch(
    pending: Sequence[P], policy: BatchPolicy, now: float, outlook: Outlook | None = None
) -> Plan[P]:
    """Decide at `now` what runs next, the way Triton's dynamic batcher does.

    Items with the oldest item's shape key are taken in FIFO order up to max_batch_size. The
    largest prefix hitting a preferred size goes at once; everything taken goes when the next
    item would not fit, when the preferred sizes are exceeded, when the oldest item has waited
    max_queue_delay, or when that delay is 0. Otherwise wait for the delay or the next deadline.
    When the outlook says waiting has not been gathering company, the delay counts as 0.
    With latency_slo_s the SLO decides instead (`_plan_for_slo`).
    """
    outlook = outlook or Outlook()
    expired = tuple(item for item in pending if item.deadline <= now)
    live = [item for item in pending if item.deadline > now]
    if not live:
        return Plan((), expired)
    if policy.max_batch_size == 0 or isinstance(live[0].key, Alone):
        return Plan((live[0],), expired)
    if policy.budget_s is not None:
        return _plan_for_slo(live, expired, policy, now, outlook)
    batch, full = _fill(live, policy.max_batch_size)
    preferred = policy.preferred_batch_sizes or (policy.max_batch_size,)
    delay = policy.max_queue_delay_s if outlook.waiting_pays else 0.0
    late = delay > 0 and now - live[0].enqueued >= delay
    best = _preferred_prefix(batch, preferred)
    if best and not late:
        return Plan(tuple(batch[:best]), expired)
    if full or late or delay == 0 or sum(item.rows for item in batch) >= max(preferred):
        return Plan(tuple(batch), expired)
    wake_at = min(live[0].enqueued + delay, min(item.deadline for item in live))
    return Plan((), expired, wake_at)


def _plan_for_slo(
    live: list[P], expired: tuple[P, ...], policy: BatchPolicy, now: float, outlook: Outlook
) -> Plan[P]:
    """Under an SLO: shed what cannot finish in its budget even if run now; run the FIFO run of
    items that serves the most in time (`_best_window`); wait only while that batch is too small
    to keep up with the arrival rate and its oldest item can still afford the wait."""
    budget = policy.budget_s or 0.0
    hopeless = [now + outlook.cost_of(item.rows) > item.arrived + budget for item in live]
    shed = tuple(item for item, lost in zip(live, hopeless, strict=True) if lost)
    keep = [item for item, lost in zip(live, hopeless, strict=True) if not lost]
    if not keep:
        return Plan((), expired, shed=shed)
    group = sorted((item for item in keep if item.key == keep[0].key), key=_arrival)
    skip, batch = _best_window(group, policy.max_batch_size, now, budget, outlook)
    shed += tuple(group[:skip])
    rows = sum(item.rows for item in batch)
    behind = skip + len(batch) < len(group)
    target = outlook.rows_to_keep_up(policy.max_batch_size, KEEP_UP_HEADROOM)
    latest = batch[0].arrived + budget - outlook.cost_of(target)
    if behind or rows >= target or not outlook.waiting_pays or latest <= now:
        return Plan(tuple(batch), expired, shed=shed)
    return Plan((), expired, min(latest, min(item.deadline for item in keep)), shed)


def _best_window(
    group: list[P], max_rows: int, now: float, budget: float, outlook: Outlook
) -> tuple[int, list[P]]:
    """(skip, batch): the FIFO run `group[skip:skip + n]` finishing within every member's budget
    if run now that maximizes n - skip (served now minus shed now). Under overload this sheds a
    few nearly-late items for a full batch, where serving the most urgent alone would collapse
    throughput; with slack to spare it is simply the oldest items (skip 0)."""
    dues = [item.arrived + budget for item in group]  # in order of arrival: non-decreasing
    best: tuple[int, int] = (1, 0)  # (n, skip): the oldest alone always fits (not hopeless)
    for n in range(2, min(len(group), max_rows) + 1):
        skip = bisect.bisect_left(dues, now + outlook.cost_of(n))
        window = group[skip : skip + n]
        rows = sum(item.rows for item in window)
        fits = len(window) == n and rows <= max_rows and now + outlook.cost_of(rows) <= dues[skip]
        if fits and n - skip > best[0] - best[1]:
            best = (n, skip)
    n, skip = best
    return skip, group[skip : skip + n]


def _arrival(item: Pending) -> float:
    return item.arrived


def _fill(live: list[P], max_rows: int) -> tuple[list[P], bool]:
    """The oldest item's group in FIFO order up to max_rows; True when the next one won't fit."""
    key, rows, batch = live[0].key, 0, list[P]()
    for item in live:
        if item.key != key:
            continue
        if rows + item.rows > max_rows:
            return batch, True
        rows += item.rows
        batch.append(item)
    return batch, False


def _preferred_prefix(batch: list[P], preferred: Sequence[int]) -> int:
    """How many items make the largest prefix whose rows are a preferred size (0: none)."""
    sums = itertools.accumulate(item.rows for item in batch)
    return max((n for n, rows in enumerate(sums, 1) if rows in preferred), default=0)
