"""How many requests a pod should hold, derived from the function's batching settings.

The batcher only pays off when enough requests are in flight to fill batches; beyond that,
requests queue inside the pod, where no other pod can take them. So, per pod:

    target = instances x max_batch_size      (1 when the model cannot batch)
        every instance runs full batches: the throughput knee. The autoscaler aims at
        target x utilization (70 % by default), so new pods start *before* a pod saturates
        and a queue forms, not after (users' complaint with queue-based autoscaling).
    limit  = min(2 x target, max_queue_size, 1000)  (Knative's containerConcurrency, a hard
        limit) one batch computing and one forming per instance; the rest wait in Knative's
        activator / queue-proxy, where a new pod can take them, instead of in this pod's
        batcher queue. Never above max_queue_size, or the pod would answer 503 itself, nor
        above Knative's default container-concurrency-max-limit (limits.py).

A request counts once however many items it carries; a function whose requests carry several
items (OCR: one item per text line) may set `target` and `container_concurrency` in the
profile instead.
"""

from __future__ import annotations

from dataclasses import dataclass

from edgeserve.kubernetes.limits import KNATIVE_MAX_CONCURRENCY
from edgeserve.manifest import BatchingSection


@dataclass(frozen=True)
class Concurrency:
    """Per-pod concurrency: the autoscaler's soft target and the hard limit (0 = none)."""

    target: int
    limit: int


def derive_concurrency(batching: BatchingSection, batched: bool) -> Concurrency:
    """The formula of this module's docstring."""
    per_instance = batching.max_batch_size if batched and batching.max_batch_size > 1 else 1
    target = batching.instances * per_instance
    limit = min(2 * target, batching.max_queue_size, KNATIVE_MAX_CONCURRENCY)
    return Concurrency(target=min(target, limit), limit=limit)


def concurrency_for(
    batching: BatchingSection, batched: bool, target: int | None, limit: int | None
) -> Concurrency:
    """The derived values, each replaced by the profile's where it sets one."""
    derived = derive_concurrency(batching, batched)
    return Concurrency(
        target=derived.target if target is None else target,
        limit=derived.limit if limit is None else limit,
    )
