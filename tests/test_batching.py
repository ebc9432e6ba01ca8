"""The micro-batcher: the pure planner table-driven, then the real Batcher with real models."""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

from edgeserve.batching import Batcher, BatchPolicy, plan_batch
from edgeserve.batching.cost import Outlook
from edgeserve.errors import (
    BackendError,
    DeadlineExceeded,
    InvalidInput,
    PayloadTooLarge,
    Unavailable,
)
from edgeserve.manifest import BatchingSection
from edgeserve.types import ComputeTimes, Signature, TensorDict, TensorSpec
from tests.models import mlp_model, varlen_model

INF = math.inf


@dataclass(frozen=True)
class Entry:
    name: str
    rows: int = 1
    key: str = "a"
    enqueued: float = 0.0
    deadline: float = INF

    @property
    def arrived(self) -> float:  # reached the batcher as it reached the server
        return self.enqueued


def policy(
    max_batch: int = 8, preferred: tuple[int, ...] = (), delay: float = 0.010
) -> BatchPolicy:
    return BatchPolicy(max_batch, preferred, delay, max_queue_size=64, instances=1)


def ones(n: int, **fields: Any) -> list[Entry]:
    return [Entry(f"e{i}", **fields) for i in range(n)]


PLANS = [
    # (why, policy, pending, now, expected batch, expected expired, expected wake_at)
    ("empty queue waits for arrivals", policy(), [], 0.0, [], [], None),
    (
        "preferred size reached",
        policy(preferred=(4,)),
        ones(5),
        0.001,
        ["e0", "e1", "e2", "e3"],
        [],
        None,
    ),
    (
        "largest preferred prefix",
        policy(preferred=(2, 4)),
        ones(5),
        0.001,
        ["e0", "e1", "e2", "e3"],
        [],
        None,
    ),
    ("preferred 2 only", policy(preferred=(2, 4)), ones(3), 0.001, ["e0", "e1"], [], None),
    (
        "rows step over the preferred size: saturated, send all",
        policy(preferred=(4,)),
        [Entry("a", 3), Entry("b", 3)],
        0.001,
        ["a", "b"],
        [],
        None,
    ),
    (
        "below preferred: wait for the oldest's delay",
        policy(preferred=(4,)),
        ones(3),
        0.001,
        [],
        [],
        0.010,
    ),
    (
        "delay counts from the oldest item",
        policy(),
        [Entry("old", enqueued=0.0), Entry("new", enqueued=0.009)],
        0.010,
        ["old", "new"],
        [],
        None,
    ),
    (
        "max_batch_size reached (no preferred sizes)",
        policy(max_batch=4, delay=1.0),
        ones(6),
        0.0,
        ["e0", "e1", "e2", "e3"],
        [],
        None,
    ),
    (
        "next item would not fit: send now",
        policy(max_batch=4, delay=1.0),
        [Entry("a", 3), Entry("b", 2)],
        0.0,
        ["a"],
        [],
        None,
    ),
    (
        "delay 0 sends whatever is queued",
        policy(delay=0.0),
        ones(3),
        0.0,
        ["e0", "e1", "e2"],
        [],
        None,
    ),
    (
        "delay 0 still prefers a preferred prefix",
        policy(preferred=(2,), delay=0.0),
        ones(3),
        0.0,
        ["e0", "e1"],
        [],
        None,
    ),
    (
        "delay passed: send all, not only the preferred prefix",
        policy(preferred=(2,)),
        ones(3),
        0.5,
        ["e0", "e1", "e2"],
        [],
        None,
    ),
    (
        "only the oldest item's shape group is stacked",
        policy(delay=0.0),
        [Entry("a1", key="a"), Entry("b1", key="b"), Entry("a2", key="a"), Entry("b2", key="b")],
        0.0,
        ["a1", "a2"],
        [],
        None,
    ),
    (
        "a padded group (one key) stacks together",
        policy(max_batch=4, delay=1.0),
        [Entry("short", 2, key="x[-1]"), Entry("long", 2, key="x[-1]")],
        0.0,
        ["short", "long"],
        [],
        None,
    ),
    (
        "expired items fail, the rest is planned",
        policy(delay=0.0),
        [Entry("gone", deadline=1.0), Entry("ok", deadline=5.0)],
        1.0,
        ["ok"],
        ["gone"],
        None,
    ),
    ("all expired", policy(), [Entry("gone", deadline=0.5)], 1.0, [], ["gone"], None),
    (
        "wake at the earliest deadline when it comes before the delay",
        policy(delay=1.0),
        [Entry("a"), Entry("b", key="b", deadline=0.25)],
        0.0,
        [],
        [],
        0.25,
    ),
    (
        "unbatched model: one request alone",
        policy(max_batch=0, delay=1.0),
        ones(3),
        0.0,
        ["e0"],
        [],
        None,
    ),
]


@pytest.mark.parametrize(
    ("pol", "pending", "now", "batch", "expired", "wake_at"),
    [case[1:] for case in PLANS],
    ids=[case[0] for case in PLANS],
)
def test_plan_batch(
    pol: BatchPolicy,
    pending: list[Entry],
    now: float,
    batch: list[str],
    expired: list[str],
    wake_at: float | None,
) -> None:
    plan = plan_batch(pending, pol, now)
    assert [e.name for e in plan.batch] == batch
    assert [e.name for e in plan.expired] == expired
    assert plan.wake_at == wake_at


def test_fixed_delay_counts_as_zero_when_waits_gathered_nobody() -> None:
    idle = Outlook(waiting_pays=False)
    plan = plan_batch(ones(2), policy(preferred=(4,), delay=1.0), 0.0, idle)
    assert [e.name for e in plan.batch] == ["e0", "e1"]


def slo(max_batch: int = 8) -> BatchPolicy:
    """latency_slo 100 ms: the batcher budgets 75 ms of queue + compute per item."""
    return BatchPolicy(max_batch, (), 0.010, 64, 1, latency_slo_s=0.100)


LINE = Outlook(cost=tuple(0.010 + 0.010 * b for b in range(1, 9)))  # 20 ms + 10 ms per extra row
FLAT = tuple(0.010 + 0.001 * (b - 1) for b in range(1, 9))  # 10 ms + 1 ms per extra row

SLO_PLANS = [
    # (why, outlook, pending, now, expected batch, expected shed, expected wake_at)
    ("nothing learned yet: run at once", Outlook(), ones(2), 0.0, ["e0", "e1"], [], None),
    (
        "an item that cannot make its budget even alone is shed, not run late",
        Outlook(cost=FLAT),
        [Entry("old", enqueued=0.0), Entry("new", enqueued=0.06)],
        0.07,
        ["new"],
        ["old"],
        None,
    ),
    (
        "the batch is cut to what the oldest item's budget allows",
        LINE,
        ones(5),
        0.04,  # 35 ms left of 75: 2 rows (30 ms) fit, 3 rows (40 ms) do not
        ["e0", "e1"],
        [],
        None,
    ),
    (
        "overload: two nearly-late items are shed for a batch of six that all make it",
        Outlook(cost=FLAT),
        [Entry("late0", enqueued=-0.01), Entry("late1", enqueued=-0.01)]
        + [Entry(f"e{i}", enqueued=0.05) for i in range(6)],
        0.054,  # the late pair could only go as a pair; six fresh ones fit after shedding them
        [f"e{i}" for i in range(6)],
        ["late0", "late1"],
        None,
    ),
    (
        "large enough to keep up with arrivals: run now",
        Outlook(cost=FLAT, arrival_rate=120.0),
        ones(2),
        0.0,
        ["e0", "e1"],
        [],
        None,
    ),
    (
        "too small to keep up: wait until the oldest item's latest start",
        Outlook(cost=FLAT, arrival_rate=120.0),
        ones(1),
        0.0,
        [],
        [],
        0.075 - 0.011,
    ),
    (
        "latest start reached: run what there is",
        Outlook(cost=FLAT, arrival_rate=120.0),
        ones(1),
        0.065,
        ["e0"],
        [],
        None,
    ),
    (
        "waits have gathered nobody: run now",
        Outlook(cost=FLAT, arrival_rate=120.0, waiting_pays=False),
        ones(1),
        0.0,
        ["e0"],
        [],
        None,
    ),
    (
        "full batch runs at once",
        Outlook(cost=FLAT, arrival_rate=1e6),
        ones(9),
        0.0,
        [f"e{i}" for i in range(8)],
        [],
        None,
    ),
]


@pytest.mark.parametrize(
    ("outlook", "pending", "now", "batch", "shed", "wake_at"),
    [case[1:] for case in SLO_PLANS],
    ids=[case[0] for case in SLO_PLANS],
)
def test_plan_batch_under_an_slo(
    outlook: Outlook,
    pending: list[Entry],
    now: float,
    batch: list[str],
    shed: list[str],
    wake_at: float | None,
) -> None:
    plan = plan_batch(pending, slo(), now, outlook)
    assert [e.name for e in plan.batch] == batch
    assert [e.name for e in plan.shed] == shed
    assert plan.wake_at == (pytest.approx(wake_at) if wake_at is not None else None)
    assert plan.expired == ()


def test_policy_from_manifest() -> None:
    section = BatchingSection(
        max_batch_size=8,
        preferred_batch_sizes=(4, 2, 4),
        max_queue_delay_ms=5,
        max_queue_size=100,
        instances=2,
    )
    assert BatchPolicy.from_manifest(section, batched=True) == BatchPolicy(8, (2, 4), 0.005, 100, 2)
    assert BatchPolicy.from_manifest(section, batched=False) == BatchPolicy(0, (), 0.005, 100, 2)
    with_slo = section.model_copy(update={"latency_slo_ms": 40.0})
    assert BatchPolicy.from_manifest(with_slo, batched=True).latency_slo_s == 0.040


# --- the Batcher, driven with real run_batch functions --------------------------------------

SIG = Signature(
    inputs=(TensorSpec("x", "FP32", (-1, 2)),),
    outputs=(TensorSpec("y", "FP32", (-1, 2)),),
    batched=True,
)


class Affine:
    """A real run_batch (y = 2x + 1) that records what it ran; may hold on a gate, fail on x < 0."""

    def __init__(self, gate: threading.Event | None = None) -> None:
        self.ran: list[np.ndarray] = []
        self.started = threading.Event()
        self.gate = gate

    def __call__(self, inputs: TensorDict) -> TensorDict:
        self.started.set()
        if self.gate is not None:
            self.gate.wait(5)
        x = inputs["x"]
        self.ran.append(x.copy())
        if (x < 0).any():
            raise ValueError("negative input")
        return {"y": x * 2 + 1}

    def tags(self) -> list[float]:
        return [float(v) for batch in self.ran for v in batch[:, 0]]


def tagged(tag: float, rows: int = 1) -> TensorDict:
    return {"x": np.stack([np.full(rows, tag), np.arange(rows)], axis=1).astype(np.float32)}


def soon(seconds: float = 5.0) -> float:
    return time.monotonic() + seconds


def in_loop(scenario: Callable[[], Coroutine[Any, Any, None]]) -> Callable[[], None]:
    def test() -> None:
        asyncio.run(asyncio.wait_for(scenario(), 10))

    return test


@asynccontextmanager
async def serving(
    run_batch: Callable[[TensorDict], TensorDict],
    pol: BatchPolicy,
    signature: Signature = SIG,
    observer: Any = None,
) -> AsyncIterator[Batcher]:
    batcher = Batcher(run_batch, signature, pol, observer)
    await batcher.start()
    try:
        yield batcher
    finally:
        await batcher.stop(drain_timeout_s=2)


async def started(model: Affine) -> None:
    assert await asyncio.to_thread(model.started.wait, 5)


class Observer:
    def __init__(self) -> None:
        self.calls: list[tuple[int, Sequence[int], ComputeTimes, bool]] = []

    def batch_done(
        self, size: int, queue_ns: Sequence[int], compute: ComputeTimes, ok: bool
    ) -> None:
        self.calls.append((size, queue_ns, compute, ok))


def test_concurrent_requests_batch_on_onnxruntime(tmp_path: Path) -> None:
    session = ort.InferenceSession(
        str(mlp_model(tmp_path / "mlp.onnx")), providers=["CPUExecutionProvider"]
    )
    sizes: list[int] = []

    def run_batch(inputs: TensorDict) -> TensorDict:
        sizes.append(len(inputs["x"]))
        return {"y": session.run(None, inputs)[0]}

    signature = Signature(
        (TensorSpec("x", "FP32", (-1, 16)),), (TensorSpec("y", "FP32", (-1, 4)),), True
    )
    rng = np.random.default_rng(1)
    requests = [{"x": rng.normal(size=(1 + i % 3, 16)).astype(np.float32)} for i in range(32)]
    observer = Observer()

    async def scenario() -> list[TensorDict]:
        async with serving(
            run_batch, policy(max_batch=16, delay=0.005), signature, observer
        ) as batcher:
            return await asyncio.gather(*(batcher.submit(r, soon()) for r in requests))

    answers = asyncio.run(scenario())
    assert max(sizes) > 1
    assert sum(sizes) == sum(len(r["x"]) for r in requests)
    for request, answer in zip(requests, answers, strict=True):
        np.testing.assert_allclose(answer["y"], session.run(None, request)[0], rtol=1e-5)
    assert [call[0] for call in observer.calls] == sizes
    assert all(
        call[3] and min(call[2]) > 0 and all(ns >= 0 for ns in call[1]) for call in observer.calls
    )


@in_loop
async def test_oversize_request_is_split_and_reassembled_in_order() -> None:
    model = Affine()
    async with serving(model, policy(max_batch=4, delay=0.0)) as batcher:
        request = tagged(7.0, rows=10)
        answer = await batcher.submit(request, soon())
    assert [len(batch) for batch in model.ran] == [4, 4, 2]
    np.testing.assert_array_equal(answer["y"], request["x"] * 2 + 1)


@in_loop
async def test_lone_request_waits_for_the_queue_delay() -> None:
    async with serving(Affine(), policy(delay=0.05)) as batcher:
        begin = time.monotonic()
        await batcher.submit(tagged(1.0), soon())
        assert time.monotonic() - begin >= 0.05


@in_loop
async def test_full_queue_answers_unavailable_with_retry_after() -> None:
    gate = threading.Event()
    model = Affine(gate)
    try:
        async with serving(model, BatchPolicy(2, (), 0.0, max_queue_size=4)) as batcher:
            running = asyncio.create_task(batcher.submit(tagged(0.0), soon()))
            await started(model)
            queued = [
                asyncio.create_task(batcher.submit(tagged(1.0, rows=2), soon())) for _ in range(2)
            ]
            await asyncio.sleep(0)
            with pytest.raises(Unavailable, match="queue full") as info:
                await batcher.submit(tagged(2.0), soon())
            assert info.value.retry_after_s > 0
            with pytest.raises(PayloadTooLarge, match="max_queue_size"):
                await batcher.submit(tagged(3.0, rows=5), soon())
            gate.set()
            await asyncio.gather(running, *queued)
    finally:
        gate.set()
    assert sorted(set(model.tags())) == [0.0, 1.0]


@in_loop
async def test_expired_item_fails_with_504_and_never_runs() -> None:
    gate = threading.Event()
    model = Affine(gate)
    try:
        async with serving(model, policy(max_batch=2, delay=0.0)) as batcher:
            running = asyncio.create_task(batcher.submit(tagged(0.0), soon()))
            await started(model)
            late = asyncio.create_task(batcher.submit(tagged(1.0), time.monotonic() + 0.02))
            await asyncio.sleep(0.05)
            gate.set()
            await running
            with pytest.raises(DeadlineExceeded, match="not run"):
                await late
            with pytest.raises(DeadlineExceeded, match="before queueing"):
                await batcher.submit(tagged(2.0), time.monotonic() - 1)
    finally:
        gate.set()
    assert model.tags() == [0.0]


@in_loop
async def test_idle_batcher_fails_an_item_at_its_deadline() -> None:
    model = Affine()
    async with serving(model, policy(delay=5.0)) as batcher:
        begin = time.monotonic()
        with pytest.raises(DeadlineExceeded):
            await batcher.submit(tagged(1.0), begin + 0.03)
        assert time.monotonic() - begin < 1.0
    assert model.ran == []


@in_loop
async def test_failing_batch_fails_only_its_own_requests() -> None:
    model = Affine()
    async with serving(model, policy(max_batch=4, delay=0.0)) as batcher:
        bad = {"x": -np.ones((1, 3), np.float32)}  # another shape: a batch of its own
        results = await asyncio.gather(
            batcher.submit(bad, soon()),
            *(batcher.submit(tagged(float(i)), soon()) for i in range(3)),
            return_exceptions=True,
        )
        assert isinstance(results[0], BackendError)
        assert "ValueError: negative input" in str(results[0])
        for i, result in enumerate(results[1:]):
            assert isinstance(result, dict)
            np.testing.assert_array_equal(result["y"], tagged(float(i))["x"] * 2 + 1)
        after = await batcher.submit(tagged(9.0), soon())
        np.testing.assert_array_equal(after["y"], [[19.0, 1.0]])


@in_loop
async def test_a_batch_the_backend_fails_reruns_its_requests_alone() -> None:
    """Any backend failure, not only a refused value: the requests beside the one that fails
    alone get their answers (a non-UTF-8 string failed every request of its batch with a 500)."""
    model = Affine()
    async with serving(model, policy(max_batch=4, delay=0.05)) as batcher:
        bad = tagged(-1.0)  # the same shape: it joins the others' batch
        results = await asyncio.gather(
            *(batcher.submit(tagged(float(i)), soon()) for i in range(3)),
            batcher.submit(bad, soon()),
            return_exceptions=True,
        )
        assert len(model.ran[0]) == 4  # they did share a batch
        assert isinstance(results[3], BackendError) and "negative input" in str(results[3])
        for i, result in enumerate(results[:3]):
            assert isinstance(result, dict)
            np.testing.assert_array_equal(result["y"], tagged(float(i))["x"] * 2 + 1)


@in_loop
async def test_edgeserve_errors_from_run_batch_pass_through() -> None:
    def refuse(inputs: TensorDict) -> TensorDict:
        raise InvalidInput("tensor `x`: expected values in [0, 1]")

    async with serving(refuse, policy(delay=0.0)) as batcher:
        with pytest.raises(InvalidInput, match="expected values"):
            await batcher.submit(tagged(2.0), soon())


@in_loop
async def test_outputs_with_the_wrong_number_of_rows_fail_the_batch() -> None:
    def broken(inputs: TensorDict) -> TensorDict:
        return {"y": inputs["x"][:1]}

    async with serving(broken, policy(delay=0.0)) as batcher:
        with pytest.raises(BackendError, match="expected 3 rows"):
            await batcher.submit(tagged(1.0, rows=3), soon())


class BrokenObserver:
    def batch_done(
        self, size: int, queue_ns: Sequence[int], compute: ComputeTimes, ok: bool
    ) -> None:
        raise RuntimeError("metrics backend down")


@in_loop
async def test_a_failing_observer_does_not_stop_batching() -> None:
    async with serving(Affine(), policy(delay=0.0), observer=BrokenObserver()) as batcher:
        for tag in (1.0, 2.0):
            answer = await batcher.submit(tagged(tag), soon())
            assert float(answer["y"][0, 0]) == 2 * tag + 1


@in_loop
async def test_cancelled_request_is_dropped_before_it_runs() -> None:
    gate = threading.Event()
    model = Affine(gate)
    try:
        async with serving(model, BatchPolicy(4, (), 0.0, max_queue_size=6)) as batcher:
            running = asyncio.create_task(batcher.submit(tagged(0.0), soon()))
            await started(model)
            gone = asyncio.create_task(batcher.submit(tagged(1.0, rows=6), soon()))
            await asyncio.sleep(0)
            gone.cancel()
            gate.set()
            await running
            await batcher.submit(tagged(2.0, rows=6), soon())  # the dropped rows left the queue
            assert gone.cancelled()
    finally:
        gate.set()
    assert model.tags() == [0.0] + [2.0] * 6


@in_loop
async def test_stop_drains_queued_work_then_refuses() -> None:
    model = Affine()
    batcher = Batcher(model, SIG, policy(max_batch=2, delay=5.0))
    with pytest.raises(Unavailable, match="not started"):
        await batcher.submit(tagged(0.0), soon())
    await batcher.start()
    pending = [asyncio.create_task(batcher.submit(tagged(float(i)), soon())) for i in range(3)]
    await asyncio.sleep(0)
    await batcher.stop(drain_timeout_s=2)
    answers = await asyncio.gather(*pending)
    assert batcher.policy == policy(max_batch=2, delay=5.0)
    assert [float(a["y"][0, 0]) for a in answers] == [1.0, 3.0, 5.0]
    with pytest.raises(Unavailable, match="draining"):
        await batcher.submit(tagged(9.0), soon())


@in_loop
async def test_stop_fails_what_did_not_finish_within_the_drain_timeout() -> None:
    gate = threading.Event()
    model = Affine(gate)
    try:
        batcher = Batcher(model, SIG, policy(max_batch=1, delay=0.0))
        await batcher.start()
        running = asyncio.create_task(batcher.submit(tagged(0.0), soon()))
        await started(model)
        queued = asyncio.create_task(batcher.submit(tagged(1.0), soon()))
        await asyncio.sleep(0)
        await batcher.stop(drain_timeout_s=0.02)
        for task in (running, queued):
            with pytest.raises(Unavailable, match="stopped"):
                await task
    finally:
        gate.set()


@in_loop
async def test_unbatched_model_runs_each_request_alone_as_given() -> None:
    seen: list[tuple[int, ...]] = []

    def run_batch(inputs: TensorDict) -> TensorDict:
        seen.append(inputs["x"].shape)
        return {"y": inputs["x"].sum(keepdims=True)}

    signature = Signature((TensorSpec("x", "FP32", (3,)),), (TensorSpec("y", "FP32", (1,)),), False)
    async with serving(run_batch, BatchPolicy(0, (), 0.01), signature) as batcher:
        answers = await asyncio.gather(
            *(batcher.submit({"x": np.full(3, i, np.float32)}, soon()) for i in range(4))
        )
    assert seen == [(3,)] * 4
    assert [float(a["y"][0]) for a in answers] == [0.0, 3.0, 6.0, 9.0]


def test_padded_inputs_share_a_batch_on_onnxruntime(tmp_path: Path) -> None:
    session = ort.InferenceSession(
        str(varlen_model(tmp_path / "v.onnx")), providers=["CPUExecutionProvider"]
    )
    shapes: list[tuple[int, ...]] = []

    def run_batch(inputs: TensorDict) -> TensorDict:
        shapes.append(inputs["x"].shape)
        return dict(zip(["total", "doubled"], session.run(None, inputs), strict=True))

    signature = Signature(
        (TensorSpec("x", "FP32", (-1, -1), pad_axis=1, pad_value=0.0),),
        (
            TensorSpec("total", "FP32", (-1,)),
            TensorSpec("doubled", "FP32", (-1, -1), pad_axis=1, follows="x"),
        ),
        True,
    )
    requests = [{"x": np.arange(1, 1 + n * 2, dtype=np.float32).reshape(2, n)} for n in (3, 5, 1)]

    async def scenario() -> list[TensorDict]:
        async with serving(run_batch, policy(max_batch=8, delay=0.0), signature) as batcher:
            return await asyncio.gather(*(batcher.submit(r, soon()) for r in requests))

    answers = asyncio.run(scenario())
    assert shapes == [(6, 5)]
    for request, answer in zip(requests, answers, strict=True):
        np.testing.assert_array_equal(answer["total"], request["x"].sum(axis=1))
        np.testing.assert_array_equal(answer["doubled"], request["x"] * 2)  # its own length


@in_loop
async def test_different_shapes_without_a_pad_axis_never_stack() -> None:
    shapes: list[tuple[int, ...]] = []

    def run_batch(inputs: TensorDict) -> TensorDict:
        shapes.append(inputs["x"].shape)
        return {"y": inputs["x"].sum(axis=1)}

    async with serving(run_batch, policy(max_batch=8, delay=0.0)) as batcher:
        requests = [np.ones((1, n), np.float32) for n in (2, 3, 2, 3)]
        answers = await asyncio.gather(*(batcher.submit({"x": x}, soon()) for x in requests))
    assert sorted(shapes) == [(2, 2), (2, 3)]
    assert [float(a["y"][0]) for a in answers] == [2.0, 3.0, 2.0, 3.0]


class Sleeper:
    """A run_batch with a real cost: sleeps (GIL released) 20 ms + 2 ms per row, y = x."""

    def __init__(self) -> None:
        self.sizes: list[int] = []

    def __call__(self, inputs: TensorDict) -> TensorDict:
        self.sizes.append(len(inputs["x"]))
        time.sleep(0.020 + 0.002 * len(inputs["x"]))
        return {"y": inputs["x"]}


async def timed(batcher: Batcher, tag: float) -> tuple[float, str]:
    begin = time.monotonic()
    try:
        await batcher.submit(tagged(tag), soon())
    except Unavailable as exc:
        return time.monotonic() - begin, exc.message
    return time.monotonic() - begin, "ok"


@in_loop
async def test_slo_sheds_early_what_cannot_make_it_and_answers_the_rest_in_time() -> None:
    model = Sleeper()
    pol = BatchPolicy(4, (), 0.0, 1024, 1, latency_slo_s=0.150)
    async with serving(model, pol) as batcher:
        await batcher.submit(tagged(0.0), soon())  # one batch teaches the cost
        outcomes = await asyncio.gather(*(timed(batcher, float(i)) for i in range(60)))
    served = [seconds for seconds, what in outcomes if what == "ok"]
    shed = [seconds for seconds, what in outcomes if what != "ok"]
    assert served and shed
    assert max(served) < 0.150
    assert max(shed) < 0.150  # shed at the door or in the queue, never after a long wait
    assert all("latency_slo_ms=150" in what for _, what in outcomes if what != "ok")
    assert max(model.sizes) == 4


@in_loop
async def test_the_slo_counts_from_when_the_request_arrived_not_from_when_it_queued() -> None:
    model = Sleeper()
    pol = BatchPolicy(4, (), 0.0, 1024, 1, latency_slo_s=0.150)
    async with serving(model, pol) as batcher:
        now = time.monotonic()
        fresh = await batcher.submit(tagged(1.0), soon(), arrived=now - 0.010)
        with pytest.raises(Unavailable, match="latency_slo_ms=150"):
            await batcher.submit(tagged(2.0), soon(), arrived=now - 0.140)  # decoding took long
    assert fresh["y"][:, 0].tolist() == [1.0]
    assert model.sizes == [1]  # the late request never ran


@in_loop
async def test_an_idle_batcher_stops_waiting_when_waits_gather_nobody() -> None:
    async with serving(Affine(), policy(delay=0.040)) as batcher:
        latencies = [(await timed(batcher, float(i)))[0] for i in range(8)]
    assert min(latencies[:2]) >= 0.040  # Triton's wait, while it might pay
    assert max(latencies[-3:]) < 0.020  # learned: a lone client gains nothing from waiting


@in_loop
async def test_tiny_batches_run_on_the_event_loop_and_slow_ones_on_the_pool() -> None:
    threads: list[str] = []

    def run_batch(inputs: TensorDict) -> TensorDict:
        threads.append(threading.current_thread().name)
        if inputs["x"][0, 0] < 0:
            time.sleep(0.005)
        return {"y": inputs["x"]}

    async with serving(run_batch, policy(delay=0.0)) as batcher:
        for _ in range(3):
            await batcher.submit(tagged(1.0), soon())
        fast = list(threads)
        threads.clear()
        for _ in range(3):
            await batcher.submit(tagged(-1.0), soon())
    assert fast[0].startswith("edgeserve-batch")  # nothing learned yet: the pool
    assert fast[-1] == threading.main_thread().name  # learned: tiny, run in place
    assert threads[-1].startswith("edgeserve-batch")  # learned again: slow, back to the pool


@in_loop
async def test_compute_infer_is_the_run_and_a_busy_loop_counts_as_handing_out() -> None:
    """Triton times compute_infer around the model alone: a batch whose run took 20 ms on its
    thread reports about that, while the event loop, busy when the run ends, delays only the
    outputs' hand-out (compute_output)."""
    run_s, busy_s = 0.020, 0.120
    observer = Observer()

    def run_batch(inputs: TensorDict) -> TensorDict:
        time.sleep(run_s)
        return {"y": inputs["x"]}

    async with serving(run_batch, policy(delay=0.0), observer=observer) as batcher:
        answer = asyncio.ensure_future(batcher.submit(tagged(1.0), soon()))
        await asyncio.sleep(0.005)  # the batch is on its thread
        time.sleep(busy_s)  # the loop holds on past the run's end
        await answer
    ((_, _, (_, infer_ns, output_ns), ok),) = observer.calls
    assert ok
    assert run_s <= infer_ns / 1e9 < run_s + 0.040
    assert output_ns / 1e9 >= busy_s - run_s - 0.010
