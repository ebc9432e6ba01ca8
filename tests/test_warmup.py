"""The warm-up at start, with models that fail on zeros, driven as a user drives them: a
function folder served by `edgeserve serve` (one process, and fronts before an inference
process), its requests over the v2 API. A good model always comes up: warmed on the function's
samples where one fits, else on zeros with ones for integers; where the model fails even then,
the server says so in its log and serves."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from onnx import numpy_helper

from tests.models import divide_model, lookup_model, reshaping_model, top_model, write_function
from tests.server import running

MANIFEST = """
[function]
name = "fn"
[batching]
preferred_batch_sizes = [4]
[backend]
prefer = ["{backend}"]
precision = "fp32"
[resources]
processes_per_device = 1
"""
INFER = "/v2/models/fn/infer"


def tensor(name: str, datatype: str, values: list[Any]) -> dict[str, Any]:
    return {"name": name, "datatype": datatype, "shape": [1, len(values)], "data": values}


def answer(url: str, *inputs: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{url}{INFER}", json={"inputs": list(inputs)}, timeout=30)


@pytest.mark.parametrize(
    ("model", "backend", "request_", "expected"),
    [
        (
            top_model,
            "openvino",
            [tensor("x", "FP32", [3, 1, 4, 2]), tensor("k", "INT64", [2])],
            [4.0, 3.0],
        ),
        (
            divide_model,
            "onnxruntime",
            [tensor("x", "INT32", [8, 6, 4, 2]), tensor("d", "INT32", [2])],
            [4, 3, 2, 1],
        ),
    ],
    ids=["TopK's k on openvino", "a divisor on onnxruntime"],
)
@pytest.mark.parametrize("workers", ["1", "2"], ids=["one process", "front processes"])
def test_a_model_that_fails_on_zeros_comes_up_and_answers(
    tmp_path: Path,
    model: Any,
    backend: str,
    request_: list[dict[str, Any]],
    expected: list[float],
    workers: str,
) -> None:
    """A TopK whose k is an input (OpenVINO: "K (0) must be greater or equal to 1"), an
    integer Div by an input (ONNX Runtime: "Integer division by zero"): the warm-up fed them
    zeros and the server never came up ("Application startup failed"). Warmed on ones where an
    input holds integers, it comes up silent and answers."""
    source = write_function(tmp_path / "fn", model, MANIFEST.format(backend=backend))
    with running(source, "--workers", workers) as (url, server):
        response = answer(url, *request_)
    assert response.status_code == 200, response.text
    assert response.json()["outputs"][0]["data"] == expected
    assert "warm-up:" not in "".join(server.output)


SIX_WIDE = functools.partial(reshaping_model, allowzero=True)
"""A Reshape to the width an input gives, which only 6 fits: no value made up runs it."""
GOOD = [tensor("x", "FP32", [0, 1, 2, 3, 4, 5]), tensor("cols", "INT64", [6])]
BAD = [tensor("x", "FP32", [0, 1, 2, 3, 4, 5]), tensor("cols", "INT64", [7])]


@pytest.mark.parametrize("backend", ["onnxruntime", "openvino"])
def test_a_model_that_fails_on_every_made_up_value_serves_and_says_so(
    tmp_path: Path, backend: str
) -> None:
    """A Reshape to an input's width, which only 6 fits, and no sample: the server never came
    up. Now it logs the failure, naming the inputs and what they held, and serves: a good
    request is answered, a bad one gets the model's words (422)."""
    source = write_function(tmp_path / "fn", SIX_WIDE, MANIFEST.format(backend=backend))
    with running(source, "--workers", "1") as (url, server):
        good, bad = answer(url, *GOOD), answer(url, *BAD)
    assert good.status_code == 200, good.text
    assert good.json()["outputs"][0]["data"] == [0, 1, 2, 3, 4, 5]
    assert bad.status_code == 422, bad.text
    log = " ".join("".join(server.output).split())
    assert (
        "WARNING: warm-up: the model failed on made-up values (`x` zeros, `cols` ones) "
        "(batches of 1, 4 rows): " in log
    )
    assert "Serving anyway: a request with values the model cannot take gets a 422" in log
    assert "Hint: put a v2 infer request with values the model takes in samples/" in log


@pytest.mark.parametrize("workers", ["1", "2"], ids=["one process", "front processes"])
def test_the_warm_up_runs_the_functions_sample(tmp_path: Path, workers: str) -> None:
    """With a sample of a request the model takes (build's samples/), the warm-up runs it, its
    row repeated to each batch size, and has nothing to say: one that does not hold the
    model's inputs (an /invoke payload for a handler it does not have) is passed over."""
    source = write_function(tmp_path / "fn", SIX_WIDE, MANIFEST.format(backend="openvino"))
    (source / "samples").mkdir()
    (source / "samples" / "a-page.json").write_text(json.dumps({"page": "not tensors"}))
    (source / "samples" / "b-row.json").write_text(json.dumps({"inputs": GOOD}))
    with running(source, "--workers", workers) as (url, server):
        good = answer(url, *GOOD)
    assert good.status_code == 200, good.text
    assert "warm-up:" not in "".join(server.output)


@pytest.mark.parametrize("backend", ["onnxruntime", "openvino"])
def test_a_sample_the_door_refuses_is_skipped_saying_why(tmp_path: Path, backend: str) -> None:
    """A sample whose second row holds an id past the model's 32-row embedding table ran at
    warm-up unchecked (ONNX Runtime logged its kernel's warning, OpenVINO computed zeros):
    now it is held to the door a request meets, skipped with a warning naming it and the
    table, and the next sample runs."""
    table = ([numpy_helper.from_array(np.ones((32, 4), np.float32), "table")], [])
    model = functools.partial(lookup_model, table=table)
    source = write_function(tmp_path / "fn", model, MANIFEST.format(backend=backend))
    (source / "samples").mkdir()
    past = {"name": "tokens", "datatype": "INT64", "shape": [2, 4], "data": [*range(7), 40]}
    good = {**past, "data": [0, 1, 2, 3, 4, 5, 6, 31]}
    (source / "samples" / "a-past.json").write_text(json.dumps({"inputs": [past]}))
    (source / "samples" / "b-good.json").write_text(json.dumps({"inputs": [good]}))
    with running(source, "--workers", "1") as (url, server):
        refused = answer(url, past)
    assert refused.status_code == 400, refused.text
    log = " ".join("".join(server.output).split())
    assert (
        "WARNING: warm-up: skipped samples/a-past.json: tensor `tokens`: value 40 at [1, 3] is "
        "out of range: the model looks it up in `table`, a table of 32 rows, so expected "
        "-32..31. Hint: the warm-up runs the first sample that passes the checks every "
        "request meets; fix this one or remove it" in log
    )
    assert "b-good.json" not in log and "kernel" not in log.lower()
