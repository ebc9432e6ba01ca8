"""The micro-batcher: Triton's dynamic batching inside the function's own process.

Requests queue as items (a request larger than max_batch_size becomes several); `instances`
workers each take the next batch when they are free, so batches grow while workers are busy.
What to run next is decided by `plan.plan_batch`, a pure function of the queue, the clock
and what the batcher has learned (`cost`: batch cost by size, arrival rate, whether waits
gather company); stacking and slicing tensors are the pure functions of `rows`.
Only the worker loop touches asyncio, and only the thread pool runs the model.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine, Hashable, Mapping, Sequence
from dataclasses import replace
from functools import partial
from typing import Any

from edgeserve.batching.cost import EWMA_WEIGHT, ArrivalMeter, CostModel, Outlook, WaitMeter
from edgeserve.batching.device import Device
from edgeserve.batching.door import Door
from edgeserve.batching.item import ONE_REQUEST, Item
from edgeserve.batching.padding import Padding
from edgeserve.batching.phases import BatchObserver, PhaseClock
from edgeserve.batching.plan import BatchPolicy, plan_batch
from edgeserve.batching.rows import batch_key, request_parts, rows_of, split_outputs, stack_rows
from edgeserve.errors import DeadlineExceeded, PayloadTooLarge, Unavailable
from edgeserve.types import ComputeTimes, Signature, TensorDict

logger = logging.getLogger(__name__)

INLINE_S = 0.0005
"""A batch learned to take less than this runs on the event loop itself: handing it to a worker
thread and back would cost more than the batch (and, on few cores, wait for a free core)."""


Assemble = Callable[[Sequence[TensorDict], Mapping[str, float]], TensorDict]
"""Parts (one per queued item) -> the batch: `stack_rows`, or a backend's own into bound buffers."""


class Batcher:
    """Queues requests, runs them in batches on `instances` threads, answers each exactly once."""

    def __init__(
        self,
        run_batch: Callable[[TensorDict], TensorDict],
        signature: Signature,
        policy: BatchPolicy,
        observer: BatchObserver | None = None,
        assemble: Assemble = stack_rows,
        stage_ahead: bool = False,
    ) -> None:
        """`stage_ahead`: the backend runs on a GPU, one batch at a time per instance, and
        assembles into per-thread buffers: the next batch is assembled while one runs."""
        self._run_batch, self._observer, self._assemble = run_batch, observer, assemble
        self._device = Device(policy.instances, stage_ahead)
        self._policy = self._planning = policy  # planning drops the delay while draining
        self._padding = Padding.of(signature)
        if self._padding.why_not:
            logger.warning(
                "padding is off: %s, so requests of different lengths never share a batch. "
                "Hint: declare [model.outputs.<name>] pad_axis (and follows, ratio)",
                self._padding.why_not,
            )
        self._batched = bool(policy.max_batch_size)
        self._whole = signature.whole  # optional inputs without a batch axis, sent whole
        self._key_of = partial(batch_key, self._padding.axes, self._batched, self._whole)
        self._input_fills = {spec.name: spec.pad_value for spec in signature.inputs}
        self._output_fills = {spec.name: spec.pad_value for spec in signature.outputs}
        self._queue: dict[Item, None] = {}  # insertion-ordered: FIFO with O(1) removal
        self._rows = 0
        self._changed = asyncio.Event()
        self._workers: list[asyncio.Task[None]] = []
        self._stopping = False
        self._cost = CostModel(policy.max_batch_size)
        self._arrivals = ArrivalMeter()
        self._waits = WaitMeter()
        self._busy_until: dict[int, float] = {}  # running batch -> its predicted end
        self._run_s: dict[int, float] = {}  # rows -> EWMA of run_batch alone (no hand-off)
        self._reruns: set[Item] = set()  # items of a failed batch waiting to run one by one
        self._idle = 0  # workers asleep on an empty queue
        self.door = Door(lambda: self._policy.max_queue_size - self._rows, policy.max_queue_size)

    def _outlook(self) -> Outlook:
        """What the batcher has learned so far: batch cost by size, arrival rate, waiting
        (asked only with something queued: each ask counts towards the next probe)."""
        pays = not self._stopping and self._waits.pays()
        return Outlook(self._cost.table, self._arrivals.rate, pays)

    @property
    def policy(self) -> BatchPolicy:
        """The policy as configured (while draining, batches form with no delay)."""
        return self._policy

    def rows_in(self, inputs: TensorDict) -> int:
        """The rows of a request's tensors, as the queue counts them."""
        return rows_of(inputs, self._batched, self._whole)

    @property
    def queued_rows(self) -> int:
        """Rows waiting to run (what max_queue_size bounds)."""
        return self._rows

    def admit(self, deadline: float) -> Coroutine[Any, Any, None]:
        """Wait (bounded) until the queue has room for a request whose body is still unread:
        the server calls this first, so a full queue costs no reading nor decoding (door.py).
        (The door's own coroutine: one frame less on every request's path.)"""
        return self.door.enter(deadline)

    async def start(self, each_thread: Callable[[], object] | None = None) -> None:
        """Start the worker threads (running `each_thread` once on each: a backend's warm-up of
        its per-thread state) and the worker tasks."""
        await self._device.start(each_thread)
        self._workers = [asyncio.create_task(self._work()) for _ in range(self._device.workers)]

    async def submit(
        self, inputs: TensorDict, deadline: float, arrived: float | None = None
    ) -> TensorDict:
        """Run one request (all its rows) before `deadline` (time.monotonic()); its outputs.

        `arrived` is when the request reached the server (default: now); latency_slo_ms counts
        from there, so that the time it took to read and decode counts against the SLO too.
        """
        items = self._admit(inputs, deadline, arrived, ONE_REQUEST.get())
        if len(items) > 1:
            self._changed.set()
            return await self._gathered(items)
        try:
            if not await self._ran_now(items[0]):
                self._changed.set()
            return await items[0].future
        finally:
            self._drop(items)

    def submit_soon(
        self, inputs: TensorDict, deadline: float, arrived: float, request: Hashable | None
    ) -> asyncio.Future[TensorDict]:
        """`submit` for a caller that answers from a callback (an inference process, for which a
        task per request is a cost it can measure): the future of the outputs; cancelling it
        withdraws the request. `request` is ONE_REQUEST's token, given instead of read."""
        items = self._admit(inputs, deadline, arrived, request)
        self._changed.set()
        if len(items) > 1:
            return asyncio.ensure_future(self._gathered(items))
        item = items[0]
        item.future.add_done_callback(lambda _: self._dequeue(item))  # withdrawn: not queued
        return item.future

    async def _gathered(self, items: list[Item]) -> TensorDict:
        """The outputs of a request queued as several items, stacked back into one."""
        try:
            parts = await asyncio.gather(*(item.future for item in items))
        finally:
            self._drop(items)
        return stack_rows(parts, self._output_fills)

    async def stop(self, drain_timeout_s: float = 30.0) -> None:
        """Refuse new work, run what is queued within the timeout, fail the rest."""
        self._stopping = True
        self.door.close("batcher is draining: not accepting requests")
        self.hurry()
        if self._workers:
            _, late = await asyncio.wait(self._workers, timeout=drain_timeout_s)
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)
        self._fail(list(self._queue), Unavailable("stopped before the request could run"))
        self._device.stop()

    def hurry(self) -> None:
        """Stop waiting for company (the server is draining: what is queued runs at once)."""
        self._planning = replace(self._policy, max_queue_delay_s=0.0)
        self._changed.set()

    def _admit(
        self, inputs: TensorDict, deadline: float, arrived: float | None, request: object | None
    ) -> list[Item]:
        if self._stopping or not self._workers:
            state = "draining" if self._stopping else "not started"
            raise Unavailable(f"batcher is {state}: not accepting requests")
        now = time.monotonic()
        if deadline <= now:
            raise DeadlineExceeded(f"deadline passed {now - deadline:.3f}s before queueing")
        arrived = now if arrived is None else min(arrived, now)
        rows = rows_of(inputs, self._batched, self._whole)
        self.check_room(rows)
        self._check_slo(rows, now, arrived)
        self._arrivals.arrived(now, rows)
        key, future = self._key_of, asyncio.get_running_loop().create_future
        most = self._policy.max_batch_size
        items = [
            Item(part, size, key(part), now, arrived, deadline, future(), request, index * most)
            for index, (part, size) in enumerate(request_parts(inputs, rows, most, self._whole))
        ]
        self._queue.update(dict.fromkeys(items))
        self._rows += rows
        return items

    async def _ran_now(self, item: Item) -> bool:
        """An idle batcher runs a lone tiny request in the caller's task when the planner would
        run it at once anyway: no wake-up of a worker, no hand-off back."""
        if not self._idle or len(self._queue) != 1 or not self._inline(item.rows, 1.0):
            return False
        if plan_batch([item], self._planning, time.monotonic(), self._outlook()).batch != (item,):
            return False
        self._dequeue(item)
        await self._run([item])
        return True

    def check_room(self, rows: int) -> None:
        """Refuse `rows` now if the queue could never hold them (413) or cannot now (503).
        The request reached the queue: the row it held at the door is released either way."""
        self.door.queued()
        limit = self._policy.max_queue_size
        if rows > limit:
            raise PayloadTooLarge(
                f"request of {rows} rows exceeds max_queue_size ({limit} rows), which the "
                "queue can never hold. Hint: send fewer rows at once, or raise [batching] "
                "max_queue_size in function.toml"
            )
        if self._rows + rows > limit:
            raise Unavailable(
                f"queue full: {self._rows} of {limit} rows waiting",
                retry_after_s=max(
                    self._backlog_s(self._rows), self._policy.max_queue_delay_s, 0.001
                ),
            )

    def _check_slo(self, rows: int, now: float, arrived: float) -> None:
        """Shed at the door a request whose predicted finish already misses latency_slo_ms
        (the SLO itself: the door sheds only clear cases, the planner then keeps the budget)."""
        slo = self._policy.latency_slo_s
        if slo is None or not self._cost.table:
            return
        finish = self._free_at(now) + self._backlog_s(self._rows + rows)
        if finish > arrived + slo:
            raise Unavailable(
                f"cannot answer within latency_slo_ms={slo * 1e3:g}: "
                f"predicted {(finish - arrived) * 1e3:.1f} ms since arrival",
                retry_after_s=max(finish - arrived - slo, 0.001),
            )

    def _backlog_s(self, rows: int) -> float:
        policy = self._policy
        return Outlook(self._cost.table).backlog_s(rows, policy.max_batch_size, policy.instances)

    def _free_at(self, now: float) -> float:
        """When a worker is predicted to be free: now if one idles, else the earliest end."""
        if len(self._busy_until) < self._policy.instances:
            return now
        return max(now, min(self._busy_until.values()))

    def _drop(self, items: list[Item]) -> None:
        """A request that ended (answered, failed or cancelled) leaves nothing queued."""
        for item in items:
            item.future.cancel()  # no-op when answered
            self._dequeue(item)

    def _dequeue(self, item: Item) -> None:
        if item in self._queue:
            del self._queue[item]
            self._rows -= item.rows
            if self.door.waiting:
                self.door.open()

    def _fail(self, items: Sequence[Item], error: Exception) -> None:
        """Fail `items`, and every item still waiting that belongs to one of their requests."""
        failed = {item.request for item in items} - {None}
        waiting = [*self._queue, *self._reruns] if failed else []
        for item in (*items, *(item for item in waiting if item.request in failed)):
            self._dequeue(item)
            if not item.future.done():
                item.future.set_exception(error)

    async def _work(self) -> None:
        while batch := await self._next_batch():
            await self._run(batch)

    async def _next_batch(self) -> list[Item]:
        """Wait until the planner says run; [] when stopping with nothing left."""
        waited_with: int | None = None  # queue length when this batch started waiting
        while True:
            now = time.monotonic()
            pending = [item for item in self._queue if not item.future.done()]
            if not pending and not self._stopping:  # nothing to plan: sleep until an arrival
                self._changed.clear()
                self._idle += 1
                try:
                    await self._changed.wait()
                finally:
                    self._idle -= 1
                continue
            plan = plan_batch(pending, self._planning, now, self._outlook())
            if plan.expired:
                self._fail(plan.expired, DeadlineExceeded("deadline passed while queued; not run"))
            if plan.shed:
                self._fail(plan.shed, Unavailable(self._shed_message(), retry_after_s=0.001))
            for item in plan.batch:
                self._dequeue(item)
            if plan.batch:
                if waited_with is not None:
                    self._waits.waited(len(plan.batch) - waited_with)
                return list(plan.batch)
            if pending and waited_with is None:
                waited_with = len(pending)
            if self._stopping and not pending:
                return []
            self._changed.clear()
            timeout = None if plan.wake_at is None else plan.wake_at - now
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._changed.wait(), timeout)

    def _shed_message(self) -> str:
        slo = (self._policy.latency_slo_s or 0) * 1e3
        return f"shed: cannot finish within latency_slo_ms={slo:g} even if run now"

    async def _run(self, batch: list[Item]) -> None:
        """Run one batch (in the pool unless it is tiny); its outcome goes to its own items only."""
        start = time.monotonic()
        rows = sum(item.rows for item in batch)
        token = id(batch)
        self._busy_until[token] = start + Outlook(self._cost.table).cost_of(rows)
        clock = PhaseClock()
        waited_ns = 0
        alone: list[Item] = []  # to run one by one: the batch failed, maybe for one item
        try:
            parts = [item.inputs for item in batch]
            if self._inline(rows, INLINE_S):
                outputs, run_s, padded, waited_ns = self._timed(parts, clock)
            else:
                outputs, run_s, padded, waited_ns = await self._device.run(
                    self._timed, parts, clock
                )
            old = self._run_s.get(rows, run_s)
            self._run_s[rows] = old + EWMA_WEIGHT * (run_s - old)
            parts = split_outputs(outputs, [item.rows for item in batch], self._batched)
            parts = self._padding.cut_all(parts, [item.inputs for item in batch], padded)
        except asyncio.CancelledError:
            self._fail(batch, Unavailable("stopped while the request was running"))
            raise
        except Exception as exc:
            if len(batch) > 1:
                alone = [item for item in batch if not item.future.done()]
            else:
                self._fail(batch, batch[0].error_of(exc, self._whole))
            ok = False
        else:
            for item, part in zip(batch, parts, strict=True):
                if not item.future.done():
                    item.future.set_result(part)
            ok = True
        finally:
            del self._busy_until[token]
        clock.lap()
        self._report(batch, rows, start + waited_ns / 1e9, clock.times(), ok)
        self._reruns.update(alone)
        for item in alone:  # only a request that fails alone gets the error
            self._reruns.discard(item)
            if not item.future.done():  # not withdrawn meanwhile
                await self._run([item])

    def _timed(
        self, parts: list[TensorDict], clock: PhaseClock
    ) -> tuple[TensorDict, float, dict[str, int], int]:
        """Assemble and run a batch (on a worker thread: a large copy stays off the loop);
        also the lengths the batch was padded to (a backend's bucket may pad past its widest),
        and the nanoseconds it waited for the device once assembled (not compute: queueing).

        The model's phase ends here, where the run returns, as Triton times compute_infer
        around the model alone: the hop back to the event loop, which may be busy with other
        requests, is part of handing out the outputs (compute_output)."""
        start = time.perf_counter_ns()
        merged = self._assemble(parts, self._input_fills)
        with self._device.slot() as waited_ns:
            clock.lap(waited_ns)
            outputs = self._run_batch(merged)
            clock.lap()
        run_s = (time.perf_counter_ns() - start - waited_ns) / 1e9
        return outputs, run_s, self._padding.lengths(merged), waited_ns

    def _inline(self, rows: int, unknown_s: float) -> bool:
        """Whether a batch of `rows` is quick enough to run on the event loop (never where
        batches take turns on a device: the loop would wait for the turn)."""
        return not self._device.stage_ahead and self._run_s.get(rows, unknown_s) < INLINE_S

    def _report(
        self, batch: list[Item], rows: int, start: float, compute: ComputeTimes, ok: bool
    ) -> None:
        if ok:
            self._cost.observe(rows, sum(compute) / 1e9)
        if self._observer is None:
            return
        queue_ns = [int((start - item.enqueued) * 1e9) for item in batch]
        try:
            self._observer.batch_done(rows, queue_ns, compute, ok)
        except Exception:
            logger.exception("batch observer failed; batching goes on")
