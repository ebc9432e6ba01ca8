"""The micro-batcher: Triton's dynamic batching inside the function's own process.

Requests queue as items (a request larger than max_batch_size becomes several); `instances`
workers each take the next batch when they are free, so batches grow while workers are busy.
What to run next is decided by `plan_batch`, a pure function of the queue and the clock;
stacking and slicing tensors are the pure `stack_rows` and `split_rows`. Only the worker loop
touches asyncio, and only the thread pool runs the model.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Generic, Protocol, TypeVar

import numpy as np

from edgeserve.errors import (
    BackendError,
    DeadlineExceeded,
    EdgeserveError,
    InvalidInput,
    PayloadTooLarge,
    Unavailable,
)
from edgeserve.manifest import BatchingSection
from edgeserve.types import Signature, TensorDict

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class BatchPolicy:
    """How items are grouped; sizes count rows (axis 0). max_batch_size 0: never batched."""

    max_batch_size: int
    preferred_batch_sizes: tuple[int, ...] = ()
    max_queue_delay_s: float = 0.0
    max_queue_size: int = 1024
    instances: int = 1

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
        )


class Pending(Protocol):
    """What the planner needs to know of a queued item."""

    @property
    def rows(self) -> int: ...
    @property
    def key(self) -> Hashable: ...
    @property
    def enqueued(self) -> float: ...
    @property
    def deadline(self) -> float: ...


P = TypeVar("P", bound=Pending)


@dataclass(frozen=True)
class Plan(Generic[P]):
    """Run `batch` now if not empty, fail `expired`; else plan again at `wake_at` or on arrival."""

    batch: tuple[P, ...]
    expired: tuple[P, ...]
    wake_at: float | None = None


def plan_batch(pending: Sequence[P], policy: BatchPolicy, now: float) -> Plan[P]:
    """Decide at `now` what runs next, the way Triton's dynamic batcher does.

    Items with the oldest item's shape key are taken in FIFO order up to max_batch_size. The
    largest prefix hitting a preferred size goes at once; everything taken goes when the next
    item would not fit, when the preferred sizes are exceeded, when the oldest item has waited
    max_queue_delay, or when that delay is 0. Otherwise wait for the delay or the next deadline.
    """
    expired = tuple(item for item in pending if item.deadline <= now)
    live = [item for item in pending if item.deadline > now]
    if not live:
        return Plan((), expired)
    if policy.max_batch_size == 0:
        return Plan((live[0],), expired)
    batch, full = _fill(live, policy.max_batch_size)
    preferred = policy.preferred_batch_sizes or (policy.max_batch_size,)
    delay = policy.max_queue_delay_s
    late = delay > 0 and now - live[0].enqueued >= delay
    best = _preferred_prefix(batch, preferred)
    if best and not late:
        return Plan(tuple(batch[:best]), expired)
    if full or late or delay == 0 or sum(item.rows for item in batch) >= max(preferred):
        return Plan(tuple(batch), expired)
    wake_at = min(live[0].enqueued + delay, min(item.deadline for item in live))
    return Plan((), expired, wake_at)


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


def stack_rows(parts: Sequence[TensorDict], fills: Mapping[str, float]) -> TensorDict:
    """Stack each tensor along axis 0; shorter non-batch dims are padded with `fills[name]`."""
    if len(parts) == 1:
        return parts[0]
    return {name: _stack([part[name] for part in parts], fills.get(name, 0.0)) for name in parts[0]}


def _stack(arrays: list[np.ndarray], fill: float) -> np.ndarray:
    inner = tuple(max(dims) for dims in zip(*(array.shape[1:] for array in arrays), strict=True))
    if all(array.shape[1:] == inner for array in arrays):
        return np.concatenate(arrays)
    out = np.full((sum(len(array) for array in arrays), *inner), fill, dtype=arrays[0].dtype)
    start = 0
    for array in arrays:
        out[(slice(start, start + len(array)), *(slice(0, dim) for dim in array.shape[1:]))] = array
        start += len(array)
    return out


def split_rows(tensors: TensorDict, sizes: Sequence[int]) -> list[TensorDict]:
    """Slice every tensor along axis 0 into consecutive parts of `sizes` rows (views)."""
    if len(sizes) == 1:
        return [tensors]
    bounds = itertools.pairwise(itertools.accumulate(sizes, initial=0))
    return [{name: array[lo:hi] for name, array in tensors.items()} for lo, hi in bounds]


class BatchObserver(Protocol):
    """Told about every batch that ran: rows, each item's queue time, compute time, success."""

    def batch_done(self, size: int, queue_ns: Sequence[int], compute_ns: int, ok: bool) -> None: ...


@dataclass(eq=False)
class _Item:
    inputs: TensorDict
    rows: int
    key: Hashable
    enqueued: float
    deadline: float
    future: asyncio.Future[TensorDict]


class Batcher:
    """Queues requests, runs them in batches on `instances` threads, answers each exactly once."""

    def __init__(
        self,
        run_batch: Callable[[TensorDict], TensorDict],
        signature: Signature,
        policy: BatchPolicy,
        observer: BatchObserver | None = None,
    ) -> None:
        self._run_batch, self._observer = run_batch, observer
        self._policy = self._planning = policy  # planning drops the delay while draining
        self._pad_axes = {s.name: s.pad_axis for s in signature.inputs if s.pad_axis is not None}
        self._input_fills = {spec.name: spec.pad_value for spec in signature.inputs}
        self._output_fills = {spec.name: spec.pad_value for spec in signature.outputs}
        self._queue: dict[_Item, None] = {}  # insertion-ordered: FIFO with O(1) removal
        self._rows = 0
        self._changed = asyncio.Event()
        self._workers: list[asyncio.Task[None]] = []
        self._executor: ThreadPoolExecutor | None = None
        self._stopping = False
        self._batch_s = 0.0  # moving average of compute time, for Retry-After

    @property
    def policy(self) -> BatchPolicy:
        """The policy as configured (while draining, batches form with no delay)."""
        return self._policy

    async def start(self) -> None:
        """Start the worker tasks and their threads."""
        count = self._policy.instances
        self._executor = ThreadPoolExecutor(count, thread_name_prefix="edgeserve-batch")
        self._workers = [asyncio.create_task(self._work()) for _ in range(count)]

    async def submit(self, inputs: TensorDict, deadline: float) -> TensorDict:
        """Run one request (all its rows) before `deadline` (time.monotonic()); its outputs."""
        items = self._admit(inputs, deadline)
        try:
            parts = await asyncio.gather(*(item.future for item in items))
        finally:
            self._drop(items)
        return stack_rows(parts, self._output_fills)

    async def stop(self, drain_timeout_s: float = 30.0) -> None:
        """Refuse new work, run what is queued within the timeout, fail the rest."""
        self._stopping = True
        self._planning = replace(self._policy, max_queue_delay_s=0.0)
        self._changed.set()
        if self._workers:
            _, late = await asyncio.wait(self._workers, timeout=drain_timeout_s)
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)
        self._fail(list(self._queue), Unavailable("stopped before the request could run"))
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)

    def _admit(self, inputs: TensorDict, deadline: float) -> list[_Item]:
        if self._stopping or not self._workers:
            state = "draining" if self._stopping else "not started"
            raise Unavailable(f"batcher is {state}: not accepting requests")
        now = time.monotonic()
        if deadline <= now:
            raise DeadlineExceeded(f"deadline passed {now - deadline:.3f}s before queueing")
        rows = self._rows_of(inputs)
        self._check_room(rows)
        sizes = _part_sizes(rows, self._policy.max_batch_size)
        loop = asyncio.get_running_loop()
        items = [
            _Item(part, size, self._key(part), now, deadline, loop.create_future())
            for part, size in zip(split_rows(inputs, sizes), sizes, strict=True)
        ]
        self._queue.update(dict.fromkeys(items))
        self._rows += rows
        self._changed.set()
        return items

    def _rows_of(self, inputs: TensorDict) -> int:
        """Rows of a request: 1 for an unbatched model, else the shared length of axis 0."""
        if not self._policy.max_batch_size:
            return 1
        counts = {name: array.shape[0] if array.ndim else 0 for name, array in inputs.items()}
        if len(set(counts.values())) != 1 or 0 in counts.values():
            raise InvalidInput(
                f"inputs {counts}: expected every input to have the same number (>= 1) "
                "of rows on axis 0 (the batch axis)"
            )
        return next(iter(counts.values()))

    def _check_room(self, rows: int) -> None:
        limit = self._policy.max_queue_size
        if rows > limit:
            raise PayloadTooLarge(f"request of {rows} rows exceeds max_queue_size ({limit} rows)")
        if self._rows + rows > limit:
            batches = math.ceil(self._rows / max(1, self._policy.max_batch_size))
            wait = batches * self._batch_s / self._policy.instances
            raise Unavailable(
                f"queue full: {self._rows} of {limit} rows waiting",
                retry_after_s=max(wait, self._policy.max_queue_delay_s, 0.001),
            )

    def _key(self, part: TensorDict) -> Hashable:
        """Items stack when names, dtypes and non-batch dims agree (pad axes excepted)."""
        if not self._policy.max_batch_size:
            return None
        return tuple(
            sorted(
                (name, array.dtype.str, _dims(array.shape, self._pad_axes.get(name)))
                for name, array in part.items()
            )
        )

    def _drop(self, items: list[_Item]) -> None:
        """A request that ended (answered, failed or cancelled) leaves nothing queued."""
        for item in items:
            item.future.cancel()  # no-op when answered
            self._dequeue(item)

    def _dequeue(self, item: _Item) -> None:
        if item in self._queue:
            del self._queue[item]
            self._rows -= item.rows

    def _fail(self, items: Sequence[_Item], error: Exception) -> None:
        for item in items:
            self._dequeue(item)
            if not item.future.done():
                item.future.set_exception(error)

    async def _work(self) -> None:
        while batch := await self._next_batch():
            await self._run(batch)

    async def _next_batch(self) -> list[_Item]:
        """Wait until the planner says run; [] when stopping with nothing left."""
        while True:
            now = time.monotonic()
            pending = [item for item in self._queue if not item.future.done()]
            plan = plan_batch(pending, self._planning, now)
            if plan.expired:
                self._fail(plan.expired, DeadlineExceeded("deadline passed while queued; not run"))
            for item in plan.batch:
                self._dequeue(item)
            if plan.batch:
                return list(plan.batch)
            if self._stopping and not pending:
                return []
            self._changed.clear()
            timeout = None if plan.wake_at is None else plan.wake_at - now
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._changed.wait(), timeout)

    async def _run(self, batch: list[_Item]) -> None:
        """Run one batch in the pool; its outcome goes to its own items only."""
        start = time.monotonic()
        rows = sum(item.rows for item in batch)
        try:
            merged = stack_rows([item.inputs for item in batch], self._input_fills)
            loop = asyncio.get_running_loop()
            outputs = await loop.run_in_executor(self._executor, self._run_batch, merged)
            parts = self._split(outputs, batch)
        except asyncio.CancelledError:
            self._fail(batch, Unavailable("stopped while the request was running"))
            raise
        except Exception as exc:
            self._fail(batch, _as_edgeserve_error(exc, rows))
            ok = False
        else:
            for item, part in zip(batch, parts, strict=True):
                if not item.future.done():
                    item.future.set_result(part)
            ok = True
        self._report(batch, rows, start, ok)

    def _split(self, outputs: TensorDict, batch: list[_Item]) -> list[TensorDict]:
        rows = [item.rows for item in batch]
        if self._policy.max_batch_size:
            wrong = {n: a.shape for n, a in outputs.items() if not a.ndim or len(a) != sum(rows)}
            if wrong:
                raise BackendError(f"outputs {wrong}: expected {sum(rows)} rows for the batch")
        return split_rows(outputs, rows)

    def _report(self, batch: list[_Item], rows: int, start: float, ok: bool) -> None:
        compute_s = time.monotonic() - start
        self._batch_s = compute_s if not self._batch_s else 0.8 * self._batch_s + 0.2 * compute_s
        if self._observer is None:
            return
        queue_ns = [int((start - item.enqueued) * 1e9) for item in batch]
        try:
            self._observer.batch_done(rows, queue_ns, int(compute_s * 1e9), ok)
        except Exception:
            logger.exception("batch observer failed; batching goes on")


def _part_sizes(rows: int, max_rows: int) -> list[int]:
    """A request larger than max_rows is split into parts of at most max_rows."""
    if not max_rows or rows <= max_rows:
        return [rows]
    return [max_rows] * (rows // max_rows) + ([rows % max_rows] if rows % max_rows else [])


def _dims(shape: tuple[int, ...], pad_axis: int | None) -> tuple[int, ...]:
    return tuple(-1 if axis == pad_axis else dim for axis, dim in enumerate(shape) if axis)


def _as_edgeserve_error(exc: Exception, rows: int) -> EdgeserveError:
    if isinstance(exc, EdgeserveError):
        return exc
    return BackendError(f"batch of {rows} rows failed: {type(exc).__name__}: {exc}")
