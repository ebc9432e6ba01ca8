"""Ids past the table a model looks them up in (edgeserve/lookups.py, held at the door): a 400
naming the input, the first bad place and value, the table and the range, on OpenVINO (which
answered zeros and a 200) and ONNX Runtime (a 422 in its kernel's words), on every route and
layout; ids the door cannot follow are never refused. Real backends, models made with
onnx.helper, served by a real uvicorn or by `edgeserve serve`."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import msgpack
import numpy as np
import onnx
import orjson
import pytest
from onnx import NodeProto, TensorProto, helper, numpy_helper

from edgeserve.builder import build
from edgeserve.cli import main
from edgeserve.http import create_app
from edgeserve.http.invoke import pack_array
from edgeserve.runtime import Runtime
from tests.models import lookup_model, write_function
from tests.server import running
from tests.threaded_server import serving

TABLE = np.random.default_rng(7).normal(size=(32, 4)).astype(np.float32)
SERVED = '[function]\nname = "lookup"\n'
INFER = "/v2/models/lookup/infer"
GOOD = [[0, 31, -32, -1]]
"""Ids within the 32 rows, negative ones as ONNX takes them (-1: the last row)."""


def weight(name: str, array: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(array, name)


def as_ids(op: str, **attributes: Any) -> list[NodeProto]:
    """`ids` made of `tokens` by one op."""
    return [helper.make_node(op, ["tokens"], ["ids"], **attributes)]


FLOAT16 = (
    [weight("embed.weight", TABLE.astype(np.float16))],
    [helper.make_node("Cast", ["embed.weight"], ["table"], to=TensorProto.FLOAT)],
)
CONSTANT = ([], [helper.make_node("Constant", [], ["table"], value=weight("t", TABLE))])
QUANTIZED = (
    [
        weight("embed.q", np.round(TABLE * 20).astype(np.int8)),
        weight("scale", np.array(0.05, np.float32)),
    ],
    [helper.make_node("DequantizeLinear", ["embed.q", "scale"], ["table"])],
)
PLAIN = ([weight("table", TABLE)], [])


def stored(table: tuple[list[Any], list[NodeProto]]) -> np.ndarray:
    """The table's values as the model computes with them."""
    if table is QUANTIZED:
        return np.round(TABLE * 20).astype(np.int8).astype(np.float32) * np.float32(0.05)
    return TABLE.astype(np.float16).astype(np.float32) if table is FLOAT16 else TABLE


def serve(tmp_path: Path, model: Any, backend: str, manifest: str = SERVED) -> Any:
    """A real uvicorn serving the function on `backend`; yields its URL."""
    source = write_function(tmp_path / "lookup", model, manifest)
    return serving(create_app(Runtime.load(build(source, tmp_path / "bundle"), backend=backend)))


def v2(ids: Any, datatype: str = "INT64") -> dict[str, Any]:
    entry = {"name": "tokens", "datatype": datatype, "shape": np.shape(ids), "data": ids}
    return {"inputs": [entry]}


def binary(ids: np.ndarray) -> dict[str, Any]:
    """httpx arguments of a v2 request with `ids` as binary data."""
    size = {"parameters": {"binary_data_size": ids.nbytes}}
    entry = {"name": "tokens", "datatype": "INT64", "shape": list(ids.shape)} | size
    header = orjson.dumps({"inputs": [entry]})
    return {
        "content": header + ids.tobytes(),
        "headers": {"Inference-Header-Content-Length": str(len(header))},
    }


def rows_of(response: httpx.Response) -> np.ndarray:
    assert response.status_code == 200, response.text
    (output,) = response.json()["outputs"]
    return np.array(output["data"], np.float32).reshape(output["shape"])


def past(value: Any, at: list[int], table: str) -> str:
    return (
        f"tensor `tokens`: value {value} at {at} is out of range: the model looks it up in "
        f"`{table}`, a table of 32 rows, so expected -32..31"
    )


@pytest.mark.parametrize("backend", ["openvino", "onnxruntime"])
def test_an_id_past_the_table_is_a_400_naming_the_place_and_the_table(
    tmp_path: Path, backend: str
) -> None:
    """A float16 table cast to float32 (a half-precision export): OpenVINO answered id 40 with
    a row of zeros and a 200, ONNX Runtime with a 422 in its kernel's words (`idx=40 must be
    within the inclusive range [-32,31]`). Each route now refuses it at the door, and ids
    within the rows, negative ones too, answer the table's rows as numpy takes them."""
    model = lambda path: lookup_model(path, FLOAT16)  # noqa: E731
    bad = np.array([[1, 2, 3, 4], [5, 6, 40, -33]], np.int64)
    with serve(tmp_path, model, backend) as url, httpx.Client(base_url=url, timeout=30) as client:
        answered = rows_of(client.post(INFER, json=v2(GOOD)))
        refused = [
            client.post(INFER, json=v2(bad.tolist())),
            client.post(INFER, **binary(bad)),
            client.post("/invoke", json={"tokens": bad.tolist()}),
            client.post(
                "/invoke",
                content=msgpack.packb({"tokens": pack_array(bad)}),
                headers={"content-type": "application/msgpack"},
            ),
        ]
    np.testing.assert_allclose(answered, np.take(stored(FLOAT16), GOOD, axis=0), rtol=1e-6)
    for response in refused:
        assert response.status_code == 400, response.text
        assert response.json()["error"] == past(40, [1, 2], "embed.weight")


@pytest.mark.parametrize(
    ("table", "ids", "op", "bad", "words"),
    [
        (CONSTANT, as_ids("Identity"), "Gather", [[0, 1, 32, 2]], past(32, [0, 2], "table")),
        (QUANTIZED, as_ids("Flatten"), "Gather", [*GOOD, [0, 0, 0, 99]],
         past(99, [1, 3], "embed.q")),
        (PLAIN, as_ids("Transpose", perm=[0, 1]), "GatherElements", [[-33, 0, 0, 0]],
         past(-33, [0, 0], "table")),
    ],
    ids=["constant table", "quantized table", "GatherElements"],
)  # fmt: skip
def test_tables_stored_otherwise_and_gather_elements_are_bounded_too(
    tmp_path: Path, table: Any, ids: list[NodeProto], op: str, bad: Any, words: str
) -> None:
    """On OpenVINO, the CPU default: a table held by a Constant node, or quantized to int8 and
    dequantized (a 200 with zeros before), and GatherElements' indices (a 422 in OpenVINO's
    words, `Check 'index < axisDimSize && index >= -axisDimSize' failed`)."""
    model = lambda path: lookup_model(path, table, (TensorProto.INT64, ids), op)  # noqa: E731
    with serve(tmp_path, model, "openvino") as url, httpx.Client(base_url=url, timeout=30) as c:
        answered = rows_of(c.post(INFER, json=v2(GOOD)))
        refused = c.post(INFER, json=v2(bad))
    if op == "Gather":
        expected = np.take(stored(table), GOOD, axis=0)
    else:
        expected = np.take_along_axis(TABLE, np.array(GOOD), axis=0)
    np.testing.assert_allclose(answered, expected, rtol=1e-6)
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"] == words


def test_float_ids_cast_to_integers_are_held_as_the_cast_makes_them(tmp_path: Path) -> None:
    """Ids sent as floats and cast to INT64 in the model (Keras' Embedding takes them so): NaN
    and infinity got a 500 (the door made Python ints of its min and max); they are now
    refused, and -32.5 is row -32, as the cast truncates it."""
    ids = (TensorProto.FLOAT, as_ids("Cast", to=TensorProto.INT64))
    model = lambda path: lookup_model(path, PLAIN, ids)  # noqa: E731
    json_type = {"content-type": "application/json"}
    with serve(tmp_path, model, "onnxruntime") as url, httpx.Client(base_url=url, timeout=30) as c:
        answered = rows_of(c.post(INFER, json=v2([[0.0, 31.9, -32.5, -1.0]], "FP32")))
        refused = [
            c.post(INFER, content=FLOAT_IDS % token, headers=json_type)
            for token in (b"NaN", b"-Infinity")
        ]
    np.testing.assert_allclose(answered, np.take(TABLE, GOOD, axis=0), rtol=1e-6)
    assert [response.status_code for response in refused] == [400, 400]
    assert refused[0].json()["error"] == past("nan", [0, 3], "table")
    assert refused[1].json()["error"] == past("-inf", [0, 3], "table")


FLOAT_IDS = (
    b'{"inputs": [{"name": "tokens", "datatype": "FP32", "shape": [1, 4], "data": [0, 1, 2, %s]}]}'
)
BATCHING = SERVED + "[batching]\nmax_batch_size = 8\nmax_queue_delay_ms = 300\n"


def test_a_bad_id_does_not_touch_the_answers_of_its_batch_mates(tmp_path: Path) -> None:
    """Three good requests and one with id 40, sent together to a batching OpenVINO function:
    the bad one ran in their batch and was answered zeros with a 200; now it alone is refused,
    and the others get their rows."""
    model = lambda path: lookup_model(path, FLOAT16)  # noqa: E731
    ids = [[[i, -i, 2 * i, 31 - i]] for i in range(3)] + [[[1, 2, 40, 3]]]

    async def send_all(url: str) -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            return await asyncio.gather(*(client.post(INFER, json=v2(sent)) for sent in ids))

    with serve(tmp_path, model, "openvino", BATCHING) as url:
        *good, bad = asyncio.run(send_all(url))
    for sent, response in zip(ids, good, strict=False):
        np.testing.assert_allclose(rows_of(response), np.take(stored(FLOAT16), sent, axis=0))
    assert bad.status_code == 400
    assert bad.json()["error"] == past(40, [0, 2], "embed.weight")


WORDS = [f"w{number}" for number in range(40)]
TOKENIZER = f"""
import numpy as np

VOCABULARY = {WORDS!r}  # 40 words for a model of 32 rows: the author's mistake


def preprocess(payload, ctx):
    return [{{"tokens": np.array([VOCABULARY.index(w) for w in payload["words"]], np.int64)}}]
"""


@pytest.mark.parametrize("workers", ["1", "2"], ids=["one process", "two fronts"])
def test_each_layout_refuses_at_its_door_the_ids_a_handler_makes(
    tmp_path: Path, workers: str
) -> None:
    """`edgeserve serve` on OpenVINO, whose fronts hold the door: a v2 request's id 40, and the
    id 35 a handler's tokenizer made of the fifth word, are refused naming the tensor, as
    a shape the handler made of a request is (a 400: the handler may pass a client's ids on),
    and for the handler's, the item it was in (the client sent words, not it); the words
    within the table are answered."""
    source = write_function(
        tmp_path / "lookup",
        lambda path: lookup_model(path, FLOAT16),
        SERVED + '[handler]\nmodule = "handler"\n',
        TOKENIZER,
    )
    layout = ("--workers", workers)
    with running(source, *layout, env={"EDGESERVE_BACKEND": "openvino"}) as (url, _):
        refused = httpx.post(f"{url}{INFER}", json=v2([[1, 2, 40, 3]]), timeout=30)
        told = httpx.post(f"{url}/invoke", json={"words": ["w1", "w2", "w3", "w35"]}, timeout=30)
        answered = httpx.post(
            f"{url}/invoke", json={"words": ["w1", "w2", "w3", "w31"]}, timeout=30
        )
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"] == past(40, [0, 2], "embed.weight")
    assert told.status_code == 400, told.text
    item = "handler.preprocess's item 0, run as a batch of one row"
    assert told.json()["error"] == f"{item}: {past(35, [0, 3], 'embed.weight')}"
    assert answered.status_code == 200, answered.text
    expected = np.take(stored(FLOAT16), [1, 2, 3, 31], axis=0)
    np.testing.assert_allclose(answered.json()[0]["rows"], expected, rtol=1e-6)


def test_build_refuses_a_sample_whose_ids_serve_would_refuse(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The build's dry run fed the tokenizer's id 35 to ONNX Runtime unchecked: it failed with
    the kernel's words (`idx=35 must be within the inclusive range [-32,31]`), exit code 1,
    naming neither the sample nor the handler, and on OpenVINO serve refuses it at its door.
    Now it says what serve would answer, for that sample; a sample within the table builds."""
    source = write_function(
        tmp_path / "lookup",
        lambda path: lookup_model(path, FLOAT16),
        SERVED + '[handler]\nmodule = "handler"\n',
        TOKENIZER,
    )
    samples = source / "samples"
    samples.mkdir()
    (samples / "words.json").write_bytes(orjson.dumps({"words": ["w1", "w2", "w3", "w31"]}))
    assert main(["build", str(source), "--out", str(tmp_path / "good")]) == 0
    (samples / "words.json").write_bytes(orjson.dumps({"words": ["w1", "w2", "w3", "w35"]}))
    capsys.readouterr()
    assert main(["build", str(source), "--out", str(tmp_path / "bad")]) == 2
    said = " ".join(capsys.readouterr().err.split())
    item = "handler.preprocess's item 0, run as a batch of one row"
    assert f"error: {samples / 'words.json'}: serving would refuse {item} (400): " in said
    assert past(35, [0, 3], "embed.weight") in said
    assert f"Hint: make preprocess ({source / 'handler.py'}) give the model values" in said


def unbatched_with_table_input(path: Path) -> Path:
    """One request of tokens [1, 4] a run, its table an initializer listed among the inputs
    too (older exporters' keep_initializers_as_inputs): a request may send its own."""
    model = onnx.load(str(lookup_model(path, PLAIN)))
    for value in (model.graph.input[0], model.graph.output[0]):
        value.type.tensor_type.shape.dim[0].dim_value = 1
    model.graph.input.append(helper.make_tensor_value_info("table", TensorProto.FLOAT, ["V", 4]))
    onnx.save(model, str(path))
    return path


def computed(ids: list[NodeProto], table: np.ndarray = TABLE) -> Any:
    one = weight("one", np.array(1, np.int64))
    return lambda path: lookup_model(
        path, ([one, weight("table", table)], []), (TensorProto.INT64, ids)
    )


ADD_ONE = [helper.make_node("Add", ["tokens", "one"], ["ids"])]
TO_BOOL = [
    helper.make_node("Cast", ["tokens"], ["any"], to=TensorProto.BOOL),
    helper.make_node("Cast", ["any"], ["ids"], to=TensorProto.INT64),
]


def test_ids_the_door_cannot_follow_are_never_refused(tmp_path: Path) -> None:
    """Ids computed before the lookup (Add 1: -33 is row -32), made booleans and back (a 2-row
    table takes 5 as row 1: refused before, as if 5 reached it), or looked up in a table the
    request sends itself (64 rows: id 40 was refused against the model's own 32): each is
    answered as ONNX Runtime computes it; the model's own table still bounds the ids."""
    cases = [
        (computed(ADD_ONE), [[-33, 0, 0, 0]], TABLE[[[-32, 1, 1, 1]]]),
        (computed(TO_BOOL, TABLE[:2]), [[5, 0, 0, 0]], TABLE[[[1, 0, 0, 0]]]),
    ]
    for number, (model, sent, expected) in enumerate(cases):
        with serve(tmp_path / str(number), model, "onnxruntime") as url:
            response = httpx.post(f"{url}{INFER}", json=v2(sent), timeout=30)
        np.testing.assert_allclose(rows_of(response), expected, rtol=1e-6)
    own = np.random.default_rng(1).normal(size=(64, 4)).astype(np.float32)
    with serve(tmp_path / "sent", unbatched_with_table_input, "onnxruntime") as url:
        sent = httpx.post(f"{url}{INFER}", json=with_table(v2([[40, 0, 0, 0]]), own), timeout=30)
        held = httpx.post(f"{url}{INFER}", json=v2([[40, 0, 0, 0]]), timeout=30)
    np.testing.assert_allclose(rows_of(sent), own[[[40, 0, 0, 0]]], rtol=1e-6)
    assert held.json()["error"] == past(40, [0, 0], "table")


def with_table(request: dict[str, Any], table: np.ndarray) -> dict[str, Any]:
    entry = {"name": "table", "datatype": "FP32", "shape": list(table.shape)}
    return {"inputs": [*request["inputs"], entry | {"data": table.ravel().tolist()}]}
