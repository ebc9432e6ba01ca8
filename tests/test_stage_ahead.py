"""Stage-ahead (batching/device.py): on a GPU the next batch is assembled while one runs.

The scheduling test uses plain functions as the model (their sleeps release the GIL, as
copies and ONNX Runtime's runs do); the last test runs ONNX Runtime's real bound buffers, one
set per thread, with batches assembled while others run, and checks every answer. The GPU
figures are in benchmarks/RESULTS-gpu.md.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from edgeserve.backends import load_backend
from edgeserve.backends.binding import FirstUses
from edgeserve.batching import Batcher, BatchPolicy
from edgeserve.batching.rows import stack_rows
from edgeserve.manifest import ModelSection
from edgeserve.shapes import shape_profile
from edgeserve.signature import read_signature
from edgeserve.types import ComputeTimes, Signature, TensorDict, TensorSpec
from tests.models import conv_model

NO_CUDA = "CUDAExecutionProvider" not in ort.get_available_providers()

SIG = Signature(
    inputs=(TensorSpec("x", "FP32", (-1, 2)),),
    outputs=(TensorSpec("y", "FP32", (-1, 2)),),
    batched=True,
)
STEP_S = 0.04


class Timeline:
    """When each assembly and each run happened, and how many runs were at once at most."""

    def __init__(self) -> None:
        self.assembled: list[tuple[float, float]] = []
        self.ran: list[tuple[float, float]] = []
        self.most_running = 0
        self._running = 0
        self._lock = threading.Lock()

    def assemble(self, parts: Sequence[TensorDict], fills: Mapping[str, float]) -> TensorDict:
        started = time.perf_counter()
        time.sleep(STEP_S)
        self.assembled.append((started, time.perf_counter()))
        return stack_rows(parts, fills)

    def run(self, inputs: TensorDict) -> TensorDict:
        with self._lock:
            self._running += 1
            self.most_running = max(self.most_running, self._running)
        started = time.perf_counter()
        time.sleep(STEP_S)
        self.ran.append((started, time.perf_counter()))
        with self._lock:
            self._running -= 1
        return {"y": inputs["x"] * 2}


class Observer:
    def __init__(self) -> None:
        self.compute: list[ComputeTimes] = []
        self.queue_ns: list[int] = []

    def batch_done(
        self, size: int, queue_ns: Sequence[int], compute: ComputeTimes, ok: bool
    ) -> None:
        self.compute.append(compute)
        self.queue_ns.extend(queue_ns)


def serve_all(
    batcher: Batcher, requests: list[TensorDict], each_thread: Callable[[], object] | None = None
) -> list[TensorDict]:
    async def all_at_once() -> list[TensorDict]:
        await batcher.start(each_thread)
        deadline = time.monotonic() + 30
        try:
            return await asyncio.gather(*(batcher.submit(r, deadline) for r in requests))
        finally:
            await batcher.stop()

    return asyncio.run(all_at_once())


def overlaps(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def test_the_next_batch_is_assembled_while_one_runs_and_runs_take_turns() -> None:
    timeline, observer = Timeline(), Observer()
    policy = BatchPolicy(4, max_queue_delay_s=0.0, max_queue_size=64, instances=1)
    batcher = Batcher(timeline.run, SIG, policy, observer, timeline.assemble, stage_ahead=True)
    requests = [{"x": np.full((1, 2), i, np.float32)} for i in range(16)]
    answers = serve_all(batcher, requests)
    for request, answer in zip(requests, answers, strict=True):
        np.testing.assert_array_equal(answer["y"], request["x"] * 2)
    assert timeline.most_running == 1  # one device slot: runs never overlap
    assert any(overlaps(a, r) for a in timeline.assembled for r in timeline.ran)
    # the wait for the device is queueing, not assembly: no input phase holds a whole run
    assert all(c.input_ns < 1.9 * STEP_S * 1e9 for c in observer.compute), observer.compute
    assert max(observer.queue_ns) > STEP_S * 1e9  # the later batches queued behind the runs


def test_without_stage_ahead_one_worker_assembles_and_runs_in_turn() -> None:
    timeline = Timeline()
    policy = BatchPolicy(4, max_queue_delay_s=0.0, max_queue_size=64, instances=1)
    batcher = Batcher(timeline.run, SIG, policy, None, timeline.assemble)
    serve_all(batcher, [{"x": np.full((1, 2), i, np.float32)} for i in range(12)])
    assert not any(overlaps(a, r) for a in timeline.assembled for r in timeline.ran)


def test_every_batch_thread_is_warmed_one_at_a_time_before_the_first_batch() -> None:
    """A backend's per-thread state (on a GPU: bound buffers, cuDNN's plans) is made on each
    worker thread before any batch, never beside another thread's work: a first run beside a
    running batch failed on an H100 with "operation not permitted when stream is capturing"."""
    timeline = Timeline()
    warmed: list[tuple[int, float, float]] = []
    ran: list[tuple[int, float]] = []  # thread, when

    def warm_up() -> None:
        started = time.perf_counter()
        time.sleep(STEP_S)
        warmed.append((threading.get_ident(), started, time.perf_counter()))

    def run(inputs: TensorDict) -> TensorDict:
        ran.append((threading.get_ident(), time.perf_counter()))
        return {"y": inputs["x"] * 2}

    policy = BatchPolicy(4, max_queue_delay_s=0.0, max_queue_size=64, instances=2)
    batcher = Batcher(run, SIG, policy, None, timeline.assemble, stage_ahead=True)

    async def serve() -> None:
        await batcher.start(warm_up)
        deadline = time.monotonic() + 30
        requests = [{"x": np.full((1, 2), i, np.float32)} for i in range(24)]
        await asyncio.gather(*(batcher.submit(r, deadline) for r in requests))
        await batcher.stop()

    asyncio.run(serve())
    threads = {ident for ident, _, _ in warmed}
    assert len(warmed) == len(threads) == 4  # two instances, two workers each
    spans = sorted((start, end) for _, start, end in warmed)
    assert all(earlier[1] <= later[0] for earlier, later in itertools.pairwise(spans))
    assert {ident for ident, _ in ran} <= threads  # batches ran on warmed threads
    assert min(at for _, at in ran) > spans[-1][1]  # ... after every warm-up


@pytest.mark.parametrize(
    "device",
    [
        "cpu",
        pytest.param(
            "cuda:0",
            marks=[
                pytest.mark.gpu,
                pytest.mark.skipif(NO_CUDA, reason="needs onnxruntime-gpu with an NVIDIA GPU"),
            ],
        ),
    ],
)
def test_bound_buffers_of_two_threads_give_every_request_its_own_answer(
    tmp_path: Path, device: str
) -> None:
    """ONNX Runtime's bound buffers (buckets; on a GPU device buffers filled from pinned memory,
    each thread's run a CUDA graph of its own) with stage-ahead: a batch is written into one
    thread's buffers while another thread's batch runs, and every answer is its own request's,
    not a neighbour's nor a stale one."""
    model = conv_model(tmp_path / "conv.onnx")
    signature = read_signature(model, ModelSection())
    profile = shape_profile(signature, 4)
    backend = load_backend(
        "onnxruntime",
        model,
        signature=signature,
        profile=profile,
        buckets=True,
        device=device,
        cuda_graphs=True,  # each thread's buffers captured in a graph of its own (on CUDA)
    )
    policy = BatchPolicy(4, max_queue_delay_s=0.001, max_queue_size=256, instances=1)
    batcher = Batcher(backend.infer, signature, policy, None, backend.assemble, stage_ahead=True)
    rng = np.random.default_rng(5)
    requests = [{"image": rng.normal(size=(1, 3, 16, 16)).astype(np.float32)} for _ in range(256)]
    answers = serve_all(batcher, requests, backend.warm_thread)  # as LocalEngine starts it
    reference = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    for request, answer in zip(requests, answers, strict=True):
        expected = reference.run(None, request)[0]
        np.testing.assert_allclose(answer["logits"], expected, rtol=1e-4, atol=1e-5)
    backend.close()


def test_a_first_use_waits_for_the_runs_in_flight_and_holds_the_next_back() -> None:
    """FirstUses: runs share the device; a first use (a new bucket's session and binding) has
    it alone, and runs that arrive while it waits go after it."""
    uses = FirstUses()
    log: list[str] = []
    released = {name: threading.Event() for name in ("a", "b", "first", "c")}
    entered = {name: threading.Event() for name in released}

    def run(name: str, kind: str) -> None:
        with uses.run() if kind == "run" else uses.alone():
            log.append(name)
            entered[name].set()
            released[name].wait(10)

    threads = [threading.Thread(target=run, args=(name, kind)) for name, kind in
               (("a", "run"), ("b", "run"), ("first", "alone"), ("c", "run"))]  # fmt: skip
    for thread in threads[:2]:
        thread.start()
    assert entered["a"].wait(5) and entered["b"].wait(5)  # two runs at once
    threads[2].start()
    assert not entered["first"].wait(0.2)  # waits for both runs in flight
    threads[3].start()
    assert not entered["c"].wait(0.2)  # a run arriving now waits behind the first use
    released["a"].set()
    assert not entered["first"].wait(0.1)
    released["b"].set()
    assert entered["first"].wait(5)
    assert not entered["c"].wait(0.2)  # ... until it is done
    released["first"].set()
    assert entered["c"].wait(5)
    released["c"].set()
    for thread in threads:
        thread.join(5)
    assert log == ["a", "b", "first", "c"] or log == ["b", "a", "first", "c"]


@pytest.mark.gpu
@pytest.mark.skipif(NO_CUDA, reason="needs onnxruntime-gpu with an NVIDIA GPU")
def test_new_widths_met_while_serving_never_fail_the_runs_beside_them(tmp_path: Path) -> None:
    """A width no bucket fixes (the CRNN declares no pad axis) opens a session and warms a
    binding on its first use while other threads run: on an H100 that failed the runs beside it
    ("operation not permitted when stream is capturing") until first uses had the device alone."""
    from benchmarks.models import crnn

    model = crnn(tmp_path / "crnn.onnx")
    signature = read_signature(model, ModelSection())
    backend = load_backend(
        "onnxruntime", model, signature=signature, profile=shape_profile(signature, 32),
        buckets=True, device="cuda:0", instances=2,
    )  # fmt: skip
    reference = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    failures: list[BaseException] = []

    def serve(seed: int) -> None:
        rng = np.random.default_rng(seed)
        try:
            backend.warm_thread()
            for _ in range(24):
                rows, width = int(rng.integers(1, 33)), int(rng.choice([64, 96, 128, 160, 192]))
                image = rng.random((rows, 1, 32, width)).astype(np.float32)
                parts = [{"image": image[i : i + 1]} for i in range(rows)]
                logits = backend.infer(backend.assemble(parts, {"image": 0.0}))["logits"]
                assert logits.shape == (rows, width // 4, 83)
                expected = reference.run(None, {"image": image[:1]})[0]
                np.testing.assert_allclose(logits[:1], expected, rtol=1e-3, atol=1e-3)
        except BaseException as exc:  # collected: the test names every failure
            failures.append(exc)

    threads = [threading.Thread(target=serve, args=(seed,)) for seed in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    backend.close()
    assert not failures, [str(exc)[:300] for exc in failures]
