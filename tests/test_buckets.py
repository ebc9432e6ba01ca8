"""Buckets: the shapes a GPU session is kept warm for, and bound buffers that batches are built in.

The bucket logic is pure, and the ONNX Runtime backend takes `buckets=True` on the CPU too, so
that "no request opens a session after load" (no cuDNN re-plan on a GPU) is checked here without
a GPU; the GPU tests at the end run the same on CUDA, with pinned buffers, where one is present.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from edgeserve.backends import load_backend
from edgeserve.backends.buckets import PAD_LADDER, Buckets, buckets_for, pad_buckets, row_buckets
from edgeserve.batching import Batcher, BatchPolicy
from edgeserve.batching.rows import stack_rows
from edgeserve.dataplane import InputChecks
from edgeserve.errors import InvalidInput, ModelRefused
from edgeserve.manifest import ModelSection
from edgeserve.shapes import ShapeRange, shape_profile
from edgeserve.signature import read_signature
from tests.models import (
    conv_model,
    even_rows_model,
    reshaping_model,
    tokens_model,
    top_model,
    varlen_model,
)

NO_CUDA = "CUDAExecutionProvider" not in ort.get_available_providers()


@pytest.mark.parametrize(
    ("highest", "rows"),
    [(1, (1,)), (8, (1, 2, 4, 8)), (32, (1, 2, 4, 8, 16, 32)), (24, (1, 2, 4, 8, 16, 24))],
)
def test_row_buckets_are_powers_of_two_up_to_the_max(highest: int, rows: tuple) -> None:
    assert row_buckets(highest) == rows


@pytest.mark.parametrize(
    ("low", "high", "sizes"),
    [
        (1, -1, PAD_LADDER),
        (1, 300, (64, 96, 128, 192, 256, 300)),
        (100, 200, (128, 192, 200)),
        (1, 40, (40,)),
    ],
)
def test_pad_buckets_climb_the_ladder_and_end_at_the_max(low: int, high: int, sizes: tuple) -> None:
    assert pad_buckets(low, high) == sizes


def test_a_shape_runs_at_the_smallest_bucket_that_holds_it() -> None:
    buckets = Buckets(rows=(1, 2, 4, 8), padded={"image": {3: (64, 128, 256)}})
    assert buckets.shape("image", (3, 1, 32, 100)) == (4, 1, 32, 128)
    assert buckets.shape("image", (8, 1, 32, 64)) == (8, 1, 32, 64)
    assert buckets.shape("image", (9, 1, 32, 64)) is None  # more rows than any bucket
    assert buckets.shape("image", (1, 1, 32, 300)) is None  # wider than any bucket
    assert buckets.shapes({"image": (5, 1, 32, 1)}) == {"image": (8, 1, 32, 64)}


def test_every_bucket_combination_is_listed_once_for_warm_up() -> None:
    buckets = Buckets(rows=(1, 2), padded={"x": {1: (4, 8, 16)}})
    every = list(buckets.every({"x": (-1, -1)}))
    assert sorted(s["x"] for s in every) == [(r, w) for r in (1, 2) for w in (4, 8, 16)]


def test_buckets_come_from_the_profile_and_the_pad_axes(tmp_path: Path) -> None:
    model = varlen_model(tmp_path / "varlen.onnx")
    signature = read_signature(model, _padded("x", 1))
    buckets = buckets_for(signature, shape_profile(signature, 8))
    assert buckets == Buckets((1, 2, 4, 8), {"x": {1: PAD_LADDER}})
    assert buckets_for(signature, None) == Buckets()
    plain = read_signature(model, ModelSection())
    assert buckets_for(plain, shape_profile(plain, 8)).padded == {}


def _padded(name: str, axis: int) -> ModelSection:
    return ModelSection.model_validate({"inputs": {name: {"pad_axis": axis}}})


def _varlen_backend(tmp_path: Path, device: str = "cpu", max_len: int = 300):
    model = varlen_model(tmp_path / "varlen.onnx")
    signature = read_signature(model, _padded("x", 1))
    profile = shape_profile(signature, 8)
    profile["x"] = ShapeRange((1, 1), (8, 64), (8, max_len))
    return load_backend(
        "onnxruntime", model, signature=signature, device=device, profile=profile, buckets=True
    )


def _check_widths_never_open_a_session(backend, rng: np.random.Generator) -> None:
    opened = backend.plans
    assert opened == 4 * 6  # rows 1, 2, 4, 8 x widths 64, 96, 128, 192, 256, 300
    for _ in range(40):
        parts = [
            {"x": rng.normal(size=(int(rng.integers(1, 3)), int(rng.integers(1, 301))))}
            for _ in range(int(rng.integers(1, 4)))
        ]
        parts = [{"x": part["x"].astype(np.float32)} for part in parts]
        outputs = backend.infer(backend.assemble(parts, {"x": 0.0}))
        expected = stack_rows(parts, {"x": 0.0})["x"]
        np.testing.assert_allclose(outputs["total"], expected.sum(axis=1), rtol=1e-5, atol=1e-4)
        width = expected.shape[1]
        np.testing.assert_array_equal(outputs["doubled"][:, :width], 2 * expected)
        assert not outputs["doubled"][:, width:].any()  # the bucket's padding, zeros in and out
    assert backend.plans == opened


def test_width_buckets_never_open_a_session_after_load(tmp_path: Path) -> None:
    backend = _varlen_backend(tmp_path)
    _check_widths_never_open_a_session(backend, np.random.default_rng(3))
    backend.close()


def test_a_batch_beyond_the_buckets_runs_in_one_shared_session(tmp_path: Path) -> None:
    backend = _varlen_backend(tmp_path, max_len=100)  # widths 64, 96, 100
    x = np.ones((1, 400), np.float32)  # wider than the profile allows: refused at the door
    door = InputChecks(backend.signature, backend.profile, batching=True)
    with pytest.raises(InvalidInput, match="outside the range"):
        door({"x": x})
    assert backend.plans == 4 * 3
    backend.close()


def test_a_buckets_rows_past_the_batch_hold_the_fill_not_an_earlier_batch(tmp_path: Path) -> None:
    """The model runs the whole bucket: its rows past the batch were left as the buffer held
    them (uninitialized memory, or the rows of the batch before), which a model reading a
    value from them (an index, a size) fails on or answers otherwise."""
    backend = _varlen_backend(tmp_path)
    staged = backend.assemble([{"x": np.full((3, 5), 7.0, np.float32)}], {"x": -1.0})
    buffer = staged.binding.inputs["x"]
    assert buffer.shape[0] == 4 and (buffer[3] == -1.0).all()  # not what the warm-up left
    backend.assemble([{"x": np.full((4, 5), 7.0, np.float32)}], {"x": -1.0})
    again = backend.assemble([{"x": np.full((3, 5), 2.0, np.float32)}], {"x": -1.0})
    assert again.binding is staged.binding
    assert (buffer[:3, :5] == 2.0).all() and (buffer[3] == -1.0).all()
    backend.close()


def test_a_model_failing_on_its_buckets_warm_up_values_is_served_at_its_own_shapes(
    tmp_path: Path,
) -> None:
    """Buckets are warmed at load on made-up values (ones for integers), which a Reshape to
    the width an input gives fails on: on CUDA, where every model has buckets, such a model
    never started ("server did not start"). It now runs each batch at its own shapes; a
    request the model fails on is refused as the model's (a 422), the others answered."""
    model = reshaping_model(tmp_path / "model.onnx")
    signature = read_signature(model, ModelSection())
    profile = shape_profile(signature, 8)
    backend = load_backend("onnxruntime", model, signature=signature, profile=profile, buckets=True)
    assert backend.buckets == ()
    x = np.arange(12, dtype=np.float32).reshape(2, 6)
    answer = backend.infer({"x": x, "cols": np.array([[6], [6]], np.int64)})
    np.testing.assert_array_equal(answer["y"], x)
    with pytest.raises(ModelRefused, match="Reshape"):
        backend.infer({"x": x, "cols": np.array([[7], [6]], np.int64)})
    backend.close()


def test_a_bucket_the_model_fails_on_is_dropped_alone(tmp_path: Path) -> None:
    """A model that takes an even number of rows only fails on the 1-row bucket's warm-up:
    that turned every bucket off, so every batch ran at its own shapes (on CUDA, a cuDNN
    re-plan at each new one). Now buckets 2, 4 and 8 stay bound and warm; a batch of one
    row runs at its own shape, as it would without buckets (the model's refusal, a 422)."""
    model = even_rows_model(tmp_path / "model.onnx")
    signature = read_signature(model, ModelSection())
    profile = shape_profile(signature, 8)
    backend = load_backend("onnxruntime", model, signature=signature, profile=profile, buckets=True)
    opened = backend.plans
    assert opened == 3 + 1  # buckets of 2, 4 and 8 rows, and one session for any shape
    for rows in (2, 3, 6, 8):  # 3 rows run in the bucket of 4, padded
        x = np.arange(rows * 3, dtype=np.float32).reshape(rows, 3)
        staged = backend.assemble([{"x": x}], {"x": 0.0})
        assert hasattr(staged, "binding"), rows  # in a bucket's bound buffers
        np.testing.assert_array_equal(backend.infer(staged)["y"], x)
    with pytest.raises(ModelRefused, match="Reshape"):
        backend.infer({"x": np.ones((1, 3), np.float32)})
    assert backend.plans == opened
    backend.close()


def test_bound_outputs_are_not_overwritten_by_the_next_batch(tmp_path: Path) -> None:
    backend = _varlen_backend(tmp_path)
    first = backend.infer({"x": np.ones((2, 10), np.float32)})
    backend.infer({"x": np.full((2, 10), 5.0, np.float32)})
    np.testing.assert_array_equal(first["total"], [10.0, 10.0])
    backend.close()


@pytest.mark.gpu
@pytest.mark.skipif(NO_CUDA, reason="needs onnxruntime-gpu with CUDA and an NVIDIA GPU")
def test_width_buckets_never_open_a_session_on_cuda(tmp_path: Path) -> None:
    backend = _varlen_backend(tmp_path, device="cuda:0")
    assert backend.providers[0] == "CUDAExecutionProvider"
    _check_widths_never_open_a_session(backend, np.random.default_rng(5))
    backend.close()


@pytest.mark.gpu
@pytest.mark.skipif(NO_CUDA, reason="needs onnxruntime-gpu with CUDA and an NVIDIA GPU")
def test_no_width_is_slow_once_warm_on_cuda(tmp_path: Path) -> None:
    """A re-plan costs tens of milliseconds (67-190 ms for a CRNN on an H100): none may happen."""
    from benchmarks.models import crnn

    model = crnn(tmp_path / "crnn.onnx")
    signature = read_signature(model, _padded("image", 3))
    profile = shape_profile(signature, 8)
    profile["image"] = ShapeRange((1, 1, 32, 16), (8, 1, 32, 256), (8, 1, 32, 1024))
    backend = load_backend(
        "onnxruntime", model, signature=signature, device="cuda:0", profile=profile
    )
    opened = backend.plans
    slowest = 0.0
    for width in (700, 40, 1000, 130, 333, 90, 512, 1024, 16):
        x = np.zeros((3, 1, 32, width), np.float32)
        started = time.perf_counter()
        backend.infer({"image": x})
        slowest = max(slowest, time.perf_counter() - started)
    assert backend.plans == opened
    assert slowest < 0.03, f"a batch took {slowest * 1e3:.0f} ms: a re-plan?"
    backend.close()


@pytest.mark.gpu
@pytest.mark.skipif(NO_CUDA, reason="needs onnxruntime-gpu with CUDA and an NVIDIA GPU")
def test_cuda_buckets_pad_and_cut_back_every_batch_size(tmp_path: Path) -> None:
    model = conv_model(tmp_path / "conv.onnx")
    signature = read_signature(model, ModelSection())
    backend = load_backend(
        "onnxruntime", model, device="cuda:0", profile=shape_profile(signature, 8)
    )
    reference = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    for rows in (1, 3, 5, 8):
        x = np.random.default_rng(rows).normal(size=(rows, 3, 16, 16)).astype(np.float32)
        got = backend.infer({"image": x})["logits"]
        np.testing.assert_allclose(got, reference.run(None, {"image": x})[0], rtol=1e-4, atol=1e-5)
    assert backend.plans == 4  # rows 1, 2, 4, 8
    backend.close()


@pytest.mark.parametrize(
    "device",
    [
        "cpu",
        pytest.param(
            "cuda:0",
            marks=[pytest.mark.gpu, pytest.mark.skipif(NO_CUDA, reason="needs a GPU and CUDA")],
        ),
    ],
)
def test_outputs_whose_shapes_follow_values_leave_the_bound_buffers(
    tmp_path: Path, device: str
) -> None:
    """A TopK of the k a request sends: the output's width is a value, which no buffer sized at
    the warm-up holds, and ONNX Runtime refused every batch (on CUDA, where buckets are the
    default, every request was answered 422). The bindings now go and batches run at their
    own shapes, each answer as the model gives it."""
    model = top_model(tmp_path / "top.onnx")
    signature = read_signature(model, ModelSection())
    backend = load_backend(
        "onnxruntime",
        model,
        signature=signature,
        device=device,
        profile=shape_profile(signature, 8),
        buckets=True,
    )
    assert backend.shapes.rows
    reference = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    for k in (2, 4, 1, 3):
        feeds = {"x": np.tile(np.float32([3, 1, 4, 2]), (3, 1)), "k": np.full((3, 1), k)}
        answer = backend.infer(backend.assemble([feeds], {}))
        np.testing.assert_array_equal(answer["top"], reference.run(["top"], feeds)[0])
    assert not backend.shapes.rows
    backend.close()


def test_a_bucketed_batch_answers_each_request_at_its_own_length(tmp_path: Path) -> None:
    """Requests of many lengths share batches padded to a bucket (past the widest of them):
    each answer equals the model run on that request alone, shape included."""
    model = tokens_model(tmp_path / "tokens.onnx")
    section = ModelSection.model_validate(
        {
            "inputs": {"tokens": {"pad_axis": 1}},
            "outputs": {
                "embedded": {"pad_axis": 1},
                "pooled": {"pad_axis": 1, "follows": "tokens", "ratio": 0.5},
            },
        }
    )
    signature = read_signature(model, section)
    profile = shape_profile(signature, 8)
    profile["tokens"] = ShapeRange((1, 1), (8, 64), (8, 100))
    backend = load_backend("onnxruntime", model, signature=signature, profile=profile, buckets=True)
    opened = backend.plans
    policy = BatchPolicy(8, max_queue_delay_s=0.02)
    batcher = Batcher(backend.infer, signature, policy, None, backend.assemble)
    rng = np.random.default_rng(11)
    requests = [rng.integers(0, 50, (1, length), dtype=np.int64) for length in range(2, 40, 3)]

    async def all_at_once() -> list[dict[str, np.ndarray]]:
        await batcher.start()
        deadline = time.monotonic() + 30
        answers = await asyncio.gather(
            *(batcher.submit({"tokens": tokens}, deadline) for tokens in requests)
        )
        await batcher.stop()
        return answers

    reference = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    for tokens, answer in zip(requests, asyncio.run(all_at_once()), strict=True):
        embedded, pooled = reference.run(None, {"tokens": tokens})
        np.testing.assert_array_equal(answer["embedded"], embedded)
        np.testing.assert_array_equal(answer["pooled"], pooled)
    assert backend.plans == opened
    backend.close()
