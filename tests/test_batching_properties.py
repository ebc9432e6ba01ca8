"""Properties of the batcher's pure parts (and one end to end): rows never cross requests."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import ml_dtypes
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from edgeserve.batching import Batcher, BatchPolicy, plan_batch, split_rows, stack_rows
from edgeserve.batching.rows import HELD_COPY_BYTES, copy_rows
from edgeserve.types import Signature, TensorDict, TensorSpec

FILL = -1.0


def request(rid: int, rows: int, width: int) -> TensorDict:
    """Every value of `tag` is the request id; `row` numbers its rows; `seq` varies in width."""
    return {
        "tag": np.full((rows, 2), rid, np.int64),
        "row": np.arange(rows, dtype=np.int64),
        "seq": np.tile(np.arange(1, width + 1, dtype=np.float32) + 100 * rid, (rows, 1)),
    }


requests = st.lists(st.tuples(st.integers(1, 5), st.integers(1, 6)), min_size=1, max_size=8).map(
    lambda shapes: [request(rid, rows, width) for rid, (rows, width) in enumerate(shapes)]
)


@given(requests)
def test_stack_then_split_gives_each_request_its_own_rows(parts: list[TensorDict]) -> None:
    merged = stack_rows(parts, {"seq": FILL})
    widest = max(part["seq"].shape[1] for part in parts)
    assert merged["seq"].shape == (sum(len(p["row"]) for p in parts), widest)
    back = split_rows(merged, [len(part["row"]) for part in parts])
    for part, got in zip(parts, back, strict=True):
        np.testing.assert_array_equal(got["tag"], part["tag"])
        np.testing.assert_array_equal(got["row"], part["row"])
        width = part["seq"].shape[1]
        np.testing.assert_array_equal(got["seq"][:, :width], part["seq"])
        assert (got["seq"][:, width:] == FILL).all()


@given(st.integers(1, 40), st.data())
def test_split_then_stack_is_the_identity_and_slices_are_views(
    rows: int, data: st.DataObject
) -> None:
    cuts = sorted(data.draw(st.sets(st.integers(1, rows - 1), max_size=5)) if rows > 1 else set())
    sizes = [hi - lo for lo, hi in zip([0, *cuts], [*cuts, rows], strict=True)]
    tensors = request(3, rows, 4)
    parts = split_rows(tensors, sizes)
    assert [len(part["row"]) for part in parts] == sizes
    assert all(np.shares_memory(part["seq"], tensors["seq"]) for part in parts)
    for name, array in stack_rows(parts, {}).items():
        np.testing.assert_array_equal(array, tensors[name])


DTYPES = ["float32", "float16", "bfloat16", ">f4", "bool", "int8", "uint64", "S5", "U3", "O"]


@settings(max_examples=80)
@given(
    st.sampled_from(DTYPES),
    st.integers(0, 3),
    st.sampled_from([5, 700, HELD_COPY_BYTES // 8 + 3]),  # kept by numpy, held, let go
    st.booleans(),
)
def test_held_copies_copy_every_type_and_layout_as_numpy_does(
    dtype: str, rows: int, width: int, strided: bool
) -> None:
    """Copies that keep the GIL (memoryview) and numpy's must agree, whatever the buffer
    protocol can take: one part into a region, and parts stacked."""
    dtype_ = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
    source = (np.arange(rows * width) % 120).reshape(rows, width).astype(dtype_)
    out = np.zeros((rows, width + 2 if strided else width), dtype_)
    copy_rows(out[:, :width], source)
    expected = np.zeros_like(out)
    expected[:, :width] = source
    np.testing.assert_array_equal(out, expected)
    parts = [{"x": source}, {"x": source[::-1]}, {"x": out[:, :width]}]
    stacked = stack_rows(parts, {})["x"]
    np.testing.assert_array_equal(stacked, np.concatenate([part["x"] for part in parts]))


@dataclass(frozen=True)
class Entry:
    rows: int
    key: int
    enqueued: float
    deadline: float

    @property
    def arrived(self) -> float:  # reached the batcher as it reached the server
        return self.enqueued


entries = st.lists(
    st.builds(
        Entry,
        rows=st.integers(1, 4),
        key=st.integers(0, 2),
        enqueued=st.floats(0, 1),
        deadline=st.floats(0, 2),
    ),
    max_size=12,
).map(lambda items: sorted(items, key=lambda e: e.enqueued))

policies = st.builds(
    BatchPolicy,
    max_batch_size=st.integers(4, 8),
    preferred_batch_sizes=st.lists(st.integers(1, 4), unique=True, max_size=3).map(
        lambda s: tuple(sorted(s))
    ),
    max_queue_delay_s=st.sampled_from([0.0, 0.01, 0.5]),
)


@given(entries, policies, st.floats(0, 2))
def test_plan_invariants(pending: list[Entry], policy: BatchPolicy, now: float) -> None:
    plan = plan_batch(pending, policy, now)
    live = [e for e in pending if e.deadline > now]
    assert list(plan.expired) == [e for e in pending if e.deadline <= now]
    assert sum(e.rows for e in plan.batch) <= policy.max_batch_size
    order = [next(i for i, e in enumerate(pending) if e is item) for item in plan.batch]
    assert order == sorted(order)  # FIFO, no item twice
    assert all(item in live and item.key == live[0].key for item in plan.batch)
    if plan.batch:
        assert plan.batch[0] is live[0]
    if live and policy.max_queue_delay_s == 0:
        assert plan.batch
    if live and not plan.batch:
        assert (
            plan.wake_at is not None
            and now < plan.wake_at <= live[0].enqueued + policy.max_queue_delay_s
        )


SIGNATURE = Signature(
    inputs=(
        TensorSpec("tag", "INT64", (-1, 2)),
        TensorSpec("row", "INT64", (-1,)),
        TensorSpec("seq", "FP32", (-1, -1), pad_axis=1, pad_value=FILL),
    ),
    outputs=(TensorSpec("tag", "INT64", (-1, 2)), TensorSpec("row", "INT64", (-1,))),
    batched=True,
)


@settings(max_examples=30, deadline=None)
@given(requests, st.integers(1, 6))
def test_batcher_answers_every_request_with_exactly_its_rows(
    parts: list[TensorDict], max_rows: int
) -> None:
    batches: list[int] = []

    def echo(inputs: TensorDict) -> TensorDict:
        batches.append(len(inputs["row"]))
        return {"tag": inputs["tag"], "row": inputs["row"]}

    async def scenario() -> list[TensorDict]:
        batcher = Batcher(echo, SIGNATURE, BatchPolicy(max_rows, (), 0.0, max_queue_size=1000))
        await batcher.start()
        deadline = time.monotonic() + 5
        answers = await asyncio.gather(*(batcher.submit(part, deadline) for part in parts))
        await batcher.stop()
        return answers

    answers = asyncio.run(asyncio.wait_for(scenario(), 10))
    assert max(batches) <= max_rows
    assert sum(batches) == sum(len(part["row"]) for part in parts)
    for part, answer in zip(parts, answers, strict=True):
        np.testing.assert_array_equal(answer["tag"], part["tag"])
        np.testing.assert_array_equal(answer["row"], part["row"])
