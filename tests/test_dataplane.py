"""The data plane: the checks at the door, request parameters, the one lifecycle owner, and the
batch-neighbour case (a request over the shape profile is refused alone; its batch neighbours,
padded with it before, now succeed) on the real batcher with real OpenVINO, and through HTTP."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import numpy as np
import pytest

from edgeserve import Bundle, Runtime, build
from edgeserve.backends import load_backend
from edgeserve.batching import BatchPolicy
from edgeserve.dataplane import InputChecks, Parameters, serving
from edgeserve.engine import LocalEngine
from edgeserve.errors import ConfigError, InvalidInput
from edgeserve.http.app import create_app
from edgeserve.shapes import ShapeProfile, shape_profile
from edgeserve.stats import ModelStats
from edgeserve.types import Backend, Signature, TensorDict, TensorSpec
from tests.models import masked_tokens_model, mlp_model, varlen_model, write_function
from tests.threaded_server import serving as served_over_http

MLP = Signature((TensorSpec("x", "FP32", (-1, 16)),), (TensorSpec("y", "FP32", (-1, 4)),), True)
TWO = Signature(
    (TensorSpec("x", "FP32", (-1, 2)), TensorSpec("z", "FP32", (-1, 2))),
    (TensorSpec("y", "FP32", (-1, 2)),),
    True,
)
WIDEST = 2048
"""The widest `x` the varlen model below is compiled for (OpenVINO, bounded reshape)."""
VARLEN = """
[function]
name = "varlen"
[model.inputs.x]
pad_axis = 1
[batching]
max_batch_size = 4
preferred_batch_sizes = [2]
max_queue_delay_ms = 2000
"""


EXPECTED = r"tensor `x`: expected \[-1, 16\] FP32, got "


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        ({"x": np.zeros((2, 5), np.float32)}, EXPECTED + r"\[2, 5\] FP32$"),
        ({"x": np.zeros((2, 16))}, EXPECTED + r"\[2, 16\] FP64$"),
        (
            {"x": np.zeros(16, np.float32)},
            EXPECTED + r"\[16\] FP32. Hint: the first dim is the batch axis.*one row is \[1, 16\]",
        ),
        ({"z": np.zeros((2, 16), np.float32)}, r"expected \['x'\]; unknown \['z'\]; missing"),
    ],
)
def test_bad_inputs_are_refused_at_the_door(inputs: TensorDict, message: str) -> None:
    door = InputChecks(MLP, shape_profile(MLP, max_batch_size=8), batching=True)
    with pytest.raises(InvalidInput, match=message):
        door(inputs)
    assert door({"x": np.zeros((1, 16), np.float32)})["x"].shape == (1, 16)


def test_rows_must_agree_across_inputs_and_number_at_least_one() -> None:
    door = InputChecks(TWO, None, batching=True)
    with pytest.raises(InvalidInput) as differ:
        door({"x": np.zeros((2, 2), np.float32), "z": np.zeros((3, 2), np.float32)})
    assert differ.value.message == (  # it read "inputs {'x': 2, 'z': 3}: expected every ..."
        "inputs `x` (2 rows) and `z` (3 rows): every input must have the same number of rows "
        "(axis 0, the batch axis), at least 1"
    )
    with pytest.raises(InvalidInput, match=r"^inputs `x`, `z` \(0 rows\): every .*at least 1$"):
        door({"x": np.zeros((0, 2), np.float32), "z": np.zeros((0, 2), np.float32)})


def test_a_backend_holding_optional_inputs_at_their_defaults_refuses_them_sent() -> None:
    """TensorRT's parser takes an input that has an initializer for a weight: a request that
    sends it is refused at the door, saying so, where it would fail in the engine."""
    signature = Signature(
        (TensorSpec("x", "FP32", (-1, 2)), TensorSpec("w", "FP32", (2, 2), optional=True)),
        (TensorSpec("y", "FP32", (-1, 2)),),
        True,
    )
    door = InputChecks(signature, None, True, ("tensorrt", None), optional=False)
    x, w = np.zeros((3, 2), np.float32), np.eye(2, dtype=np.float32)
    assert door({"x": x}).keys() == {"x"}
    with pytest.raises(InvalidInput, match=r"^input `w` is optional, and the tensorrt backend "):
        door({"x": x, "w": w})
    assert InputChecks(signature, None, True)({"x": x, "w": w}).keys() == {"x", "w"}


def test_the_profile_bounds_every_axis_but_the_rows_a_batcher_splits() -> None:
    signature = Signature((TensorSpec("x", "FP32", (-1, -1)),), (), True)
    profile = shape_profile(signature, max_batch_size=4, dynamic_dim=(1, 8, 16))
    door = InputChecks(signature, profile, batching=True)

    assert door({"x": np.zeros((9, 16), np.float32)})["x"].shape == (9, 16)  # split 4 + 4 + 1
    with pytest.raises(InvalidInput) as wide:
        door({"x": np.zeros((1, 17), np.float32)})
    assert wide.value.message == (
        "tensor `x`: shape [1, 17] is outside the range this model was loaded for: "
        "axis 1 is 17, allowed 1..16 (shapes [1, 1] .. [4, 16])"
    )
    with pytest.raises(InvalidInput, match=r"axis 1 is 0, allowed 1\.\.16"):
        door({"x": np.zeros((1, 0), np.float32)})
    unbatched = InputChecks(signature, profile, batching=False)
    with pytest.raises(InvalidInput, match=r"axis 0 is 9, allowed 1\.\.4"):
        unbatched({"x": np.zeros((9, 16), np.float32)})


def test_bytes_given_as_text_reach_the_batcher_as_objects() -> None:
    signature = Signature((TensorSpec("s", "BYTES", (-1,)),), (), True)
    checked = InputChecks(signature, None, batching=True)({"s": np.array(["a", "bc"])})
    assert checked["s"].dtype == object
    assert checked["s"].tolist() == ["a", "bc"]


def test_request_parameters_are_read_once_with_their_units() -> None:
    assert Parameters.of({}) == Parameters(None, 0)
    assert Parameters.of({"timeout": 250_000, "priority": 2, "custom": "kept"}) == Parameters(
        0.25, 2
    )
    assert Parameters.of({"timeout": 0}) == Parameters(None, 0)  # Triton's "no timeout"
    with pytest.raises(InvalidInput, match=r"parameters\.timeout: expected a non-negative integ"):
        Parameters.of({"timeout": 1.5})
    with pytest.raises(InvalidInput, match=r"parameters\.priority: expected a non-negative"):
        Parameters.of({"priority": -1})


def test_the_runtime_starts_with_the_first_front_and_stops_after_the_last(
    tmp_path: Path,
) -> None:
    bundle = build(
        write_function(tmp_path / "fn", mlp_model, '[function]\nname = "mlp"\n'), tmp_path / "b"
    )
    runtime = Runtime.load(bundle, backend="onnxruntime")

    async def two_fronts() -> list[bool]:
        seen = [runtime.ready]
        async with serving(runtime):
            seen.append(runtime.ready)
            async with serving(runtime):
                seen.append(runtime.ready)
            seen.append(runtime.ready)  # one front still serves it
        return [*seen, runtime.ready]

    assert asyncio.run(two_fronts()) == [False, True, True, True, False]


class Recorded:
    """A real backend, with the shape of every batch it ran noted (to see who shared one)."""

    def __init__(self, backend: Backend) -> None:
        self.backend, self.name, self.buckets = backend, backend.name, backend.buckets
        self.batches: list[tuple[int, ...]] = []

    @property
    def profile(self) -> ShapeProfile | None:
        return self.backend.profile

    def infer(self, inputs: TensorDict) -> TensorDict:
        self.batches.append(inputs["x"].shape)
        return self.backend.infer(inputs)

    def close(self) -> None:
        self.backend.close()


@pytest.fixture
def varlen_bundle(tmp_path: Path) -> Bundle:
    return build(write_function(tmp_path / "fn", varlen_model, VARLEN), tmp_path / "bundle")


def bounded_runtime(bundle: Bundle) -> tuple[Runtime, Recorded]:
    """The function on OpenVINO compiled for x up to WIDEST wide (as TensorRT caps a dynamic
    dim): a padded batch wider than that cannot run."""
    policy = BatchPolicy.from_manifest(bundle.manifest.batching, batched=True)
    profile = shape_profile(bundle.signature, 4, (2,), dynamic_dim=(1, 64, WIDEST))
    backend = load_backend(
        "openvino", bundle.model_path, signature=bundle.signature, profile=profile
    )
    recorded = Recorded(backend)
    stats = ModelStats(bundle.name, bundle.manifest.function.model_version)
    return Runtime(bundle, LocalEngine(recorded, bundle.signature, policy, stats), stats), recorded


def rows(width: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).random((1, width)).astype(np.float32)


def test_a_request_over_the_profile_fails_alone_on_the_batcher(varlen_bundle: Bundle) -> None:
    runtime, recorded = bounded_runtime(varlen_bundle)
    small, wide, other = rows(100, 1), rows(3000, 2), rows(100, 3)

    async def three_at_once() -> list[object]:
        async with serving(runtime):
            recorded.batches.clear()  # forget the warm-up
            return await asyncio.gather(
                runtime.infer({"x": small}),
                runtime.infer({"x": wide}),
                runtime.infer({"x": other}),
                return_exceptions=True,
            )

    first, refused, third = asyncio.run(three_at_once())
    assert isinstance(refused, InvalidInput)
    assert "tensor `x`" in refused.message and "axis 1 is 3000, allowed 1..2048" in refused.message
    assert isinstance(first, dict) and isinstance(third, dict)
    np.testing.assert_allclose(first["total"], small.sum(axis=1), rtol=1e-5)
    np.testing.assert_allclose(third["total"], other.sum(axis=1), rtol=1e-5)
    assert recorded.batches == [(2, 100)]  # the neighbours shared one batch, without it


def test_a_request_over_the_profile_gets_a_400_and_its_neighbours_200_over_http(
    varlen_bundle: Bundle,
) -> None:
    runtime, recorded = bounded_runtime(varlen_bundle)

    sent = [rows(100, 1), rows(3000, 2), rows(100, 3)]

    def body(x: np.ndarray) -> dict[str, object]:
        tensor = {"name": "x", "datatype": "FP32", "shape": list(x.shape)}
        return {"inputs": [{**tensor, "data": x.ravel().tolist()}]}

    async def three_at_once(url: str) -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            posts = [client.post("/v2/models/varlen/infer", json=body(x)) for x in sent]
            return await asyncio.gather(*posts)

    with served_over_http(create_app(runtime)) as url:
        recorded.batches.clear()
        small, wide, other = asyncio.run(three_at_once(url))

    assert (small.status_code, wide.status_code, other.status_code) == (200, 400, 200)
    error = wide.json()["error"]
    assert "tensor `x`" in error and "axis 1 is 3000, allowed 1..2048" in error
    totals = [r.json()["outputs"][0]["data"] for r in (small, other)]
    np.testing.assert_allclose(totals, [sent[0].sum(axis=1), sent[2].sum(axis=1)], rtol=1e-5)
    assert recorded.batches == [(2, 100)]


def test_sizes_declared_in_the_manifest_bound_the_door_on_both_backends(tmp_path: Path) -> None:
    """[model.inputs.x] min_dims and max_dims: a request outside them is a 400 naming the
    allowed sizes (a model that pools by 4 is given nothing narrower than 4), on every backend;
    one inside is served."""
    manifest = VARLEN.replace("pad_axis = 1\n", "min_dims = [-1, 3]\nmax_dims = [-1, 6]\n")
    bundle = build(write_function(tmp_path / "fn", varlen_model, manifest), tmp_path / "b")
    assert bundle.signature.inputs[0].min_dims == (-1, 3)  # kept in the bundle
    for backend in ("onnxruntime", "openvino"):
        with served_over_http(create_app(Runtime.load(bundle, backend=backend))) as url:
            for width, status in ((2, 400), (7, 400), (3, 200), (6, 200)):
                tensor = {"name": "x", "datatype": "FP32", "shape": [1, width]}
                answer = httpx.post(
                    f"{url}/v2/models/varlen/infer",
                    json={"inputs": [{**tensor, "data": [1.0] * width}]},
                    timeout=30,
                )
                assert answer.status_code == status, (backend, width, answer.text)
                if status == 400:
                    assert f"axis 1 is {width}, allowed 3..6" in answer.json()["error"]
                else:
                    assert answer.json()["outputs"][0]["data"] == [width]


@pytest.mark.parametrize(
    ("table", "words"),
    [
        ("min_dims = [-1, 3, 1]\n", r"expected one size >= 0 per axis of the dims \[-1, -1\]"),
        ("max_dims = [-1, 0]\n", "expected one size >= 1 per axis"),  # min_dims may say 0
        ("min_dims = [2, 3]\n", "axis 0 is the batch axis"),
        ("min_dims = [-1, 6]\nmax_dims = [-1, 3]\n", r"min_dims \[-1, 6\] exceed max_dims"),
    ],
)
def test_bad_size_bounds_fail_the_build(tmp_path: Path, table: str, words: str) -> None:
    manifest = VARLEN.replace("pad_axis = 1\n", table)
    with pytest.raises(ConfigError, match=words):
        build(write_function(tmp_path / "fn", varlen_model, manifest), tmp_path / "b")


def test_size_bounds_are_for_inputs(tmp_path: Path) -> None:
    manifest = VARLEN + "[model.outputs.total]\nmin_dims = [-1]\n"
    with pytest.raises(ConfigError, match="`min_dims` and `max_dims` bound inputs only"):
        build(write_function(tmp_path / "fn", varlen_model, manifest), tmp_path / "b")


MASKED = """
[function]
name = "masked"
[model.inputs.input_ids]
pad_axis = 1
[model.inputs.attention_mask]
pad_axis = 1
[batching]
max_batch_size = 4
preferred_batch_sizes = [3]
max_queue_delay_ms = 500
"""


def test_inputs_sharing_a_named_dim_must_agree_there_and_the_rest_of_the_batch_is_served(
    tmp_path: Path,
) -> None:
    """`input_ids` 3 long with an `attention_mask` 2 long: before, a 500 alone, and in a batch
    padding made them agree (a 200 with a wrong total) or failed its neighbours too."""
    bundle = build(write_function(tmp_path / "fn", masked_tokens_model, MASKED), tmp_path / "b")
    assert [(tie.name, tie.axes) for tie in bundle.signature.tied] == [
        ("seq", (("input_ids", 1), ("attention_mask", 1)))
    ]
    sent = [([1, 2, 3], [1, 1, 0]), ([1, 2, 3], [1, 1]), ([4, 5, 6, 7, 8], [1, 0, 1, 0, 1])]

    async def three_at_once(url: str) -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            posts = [
                client.post("/invoke", json={"input_ids": [ids], "attention_mask": [mask]})
                for ids, mask in sent
            ]
            return await asyncio.gather(*posts)

    for backend in ("onnxruntime", "openvino"):
        with served_over_http(create_app(Runtime.load(bundle, backend=backend))) as url:
            first, mismatched, third = asyncio.run(three_at_once(url))
        assert (first.status_code, mismatched.status_code, third.status_code) == (200, 400, 200)
        assert mismatched.json()["error"] == (
            "inputs `input_ids` axis 1: 3, `attention_mask` axis 1: 2: the model names these "
            "axes `seq`, one size: expected the same size on each"
        )
        assert (first.json()["total"], third.json()["total"]) == ([3], [18])
