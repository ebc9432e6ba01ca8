"""The micro-batcher: Triton's dynamic batching inside the function's own process.

batcher.py   the queue, its workers and their futures (the only part touching asyncio)
plan.py      what runs next: a pure function of queue, policy, clock and outlook
cost.py      what the batcher learns from its own batches (cost, arrival rate, waits)
rows.py      stacking requests into a batch and splitting results back (pure)
door.py      admission: requests wait, bodies unread, for room in the queue (bounded)
item.py      what the queue holds: one request's rows, and the token tying a request's items
phases.py    a batch's three compute phases, timed, and the observer told of them
"""

from edgeserve.batching.batcher import Batcher
from edgeserve.batching.cost import EWMA_WEIGHT
from edgeserve.batching.item import ONE_REQUEST, REQUEST_NUMBERS
from edgeserve.batching.phases import BatchObserver
from edgeserve.batching.plan import BatchPolicy, Plan, plan_batch
from edgeserve.batching.rows import split_rows, stack_rows

__all__ = [
    "EWMA_WEIGHT",
    "ONE_REQUEST",
    "REQUEST_NUMBERS",
    "BatchObserver",
    "BatchPolicy",
    "Batcher",
    "Plan",
    "plan_batch",
    "split_rows",
    "stack_rows",
]
