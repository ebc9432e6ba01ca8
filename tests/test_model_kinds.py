"""Kinds of ONNX models edgeserve's own never were, driven as a user drives them (`edgeserve
init`, `build`, `serve`, requests): a model either serves what ONNX Runtime answers for it, or
build refuses it saying why. Models made with onnx.helper; real ONNX Runtime and OpenVINO."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from edgeserve.cli import main
from tests.server import running

INFER = "/v2/models/fn/infer"


def save(
    path: Path, nodes: list, inputs: list, outputs: list, opsets: dict[str, int], ir: int = 8
) -> Path:
    graph = helper.make_graph(nodes, path.stem, inputs, outputs)
    imports = [helper.make_opsetid(domain, version) for domain, version in opsets.items()]
    model = helper.make_model(graph, opset_imports=imports, ir_version=ir)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def init(folder: Path, model: Path, prefer: str = "") -> Path:
    assert main(["init", str(folder), "--model", str(model)]) == 0
    manifest = folder / "function.toml"
    backend = f'\n[backend]\nprecision = "fp32"\n{prefer}'
    manifest.write_text(manifest.read_text() + backend)
    return folder


@pytest.fixture(autouse=True)
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EDGESERVE_CACHE_DIR", str(tmp_path / "cache"))


def said(capsys: pytest.CaptureFixture[str]) -> str:
    """What the command printed, warnings (stdout) and errors (stderr), on one line."""
    out, err = capsys.readouterr()
    return " ".join((out + err).split())


PLANNED_PAST = (
    "warning: openvino refuses the model, so the bundle plans onnxruntime only: openvino "
    "answers output `y`"
)


def built(source: Path, out: Path, capsys: pytest.CaptureFixture[str]) -> str:
    """`edgeserve build`, which succeeds; what it printed."""
    assert main(["build", str(source), "--out", str(out)]) == 0
    return said(capsys)


def custom_op_model(path: Path) -> Path:
    """x FP32 [N, 4] -> y: com.acme's FancyOp, an op no runtime has without its library."""
    return save(
        path,
        [helper.make_node("FancyOp", ["x"], ["y"], domain="com.acme")],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
        {"": 17, "com.acme": 1},
    )


def test_a_custom_domain_op_is_refused_at_build_saying_what_to_do(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """It built (OpenVINO planned away, ONNX Runtime left untried) and `serve` then failed to
    start: "com.acme:FancyOp(-1) is not a registered function/op". Build refuses it now."""
    source = init(tmp_path / "fn", custom_op_model(tmp_path / "m.onnx"))
    assert main(["build", str(source), "--out", str(tmp_path / "out")]) != 0
    text = said(capsys)
    assert f"error: onnxruntime: cannot load {source / 'm.onnx'}:" in text
    assert "com.acme:FancyOp(-1) is not a registered function/op" in text
    assert "Hint: ops of a custom domain (com.acme.FancyOp) need their custom-op library" in text
    assert not (tmp_path / "out").exists()


def test_init_says_its_batch_axis_check_could_not_run_on_a_model_it_cannot_load(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """init wrote batching on in silence, as if a run had shown the rows independent, and
    said only "created"; build then refused the model. It now says the check did not run and
    why, and function.toml says batching is unchecked."""
    folder = tmp_path / "fn"
    assert main(["init", str(folder), "--model", str(custom_op_model(tmp_path / "m.onnx"))]) == 0
    text = said(capsys)
    assert "warning: the batch-axis check did not run: ONNX Runtime cannot load the model" in text
    assert "com.acme:FancyOp(-1) is not a registered function/op" in text
    assert "batching is written on, unchecked. `edgeserve build` says whether" in text
    manifest = (folder / "function.toml").read_text()
    comment = " ".join(line[2:] for line in manifest.splitlines() if line.startswith("# "))
    assert "Batching on, unchecked: the batch-axis check did not run (ONNX Runtime" in comment
    assert "[batching]\nmax_batch_size = 32\n" in manifest


def test_doctor_says_why_the_next_backend_cannot_serve_it_either(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Doctor's backend row said the next backend has "no backend that runs on target
    'local' (platform cpu: ['openvino', 'onnxruntime'])", listing it among them, before the
    real reason."""
    source = init(tmp_path / "fn", custom_op_model(tmp_path / "m.onnx"))
    capsys.readouterr()
    assert main(["doctor", str(source)]) != 0
    text = said(capsys).replace("│", " ")
    text = " ".join(text.split())
    assert (
        "openvino does not load it either: the backend override: ['openvino'] cannot serve" in text
    )
    assert "openvino does not serve ops outside ONNX's default domain (com.acme.FancyOp)" in text
    assert "has no backend that runs on target" not in text


def softmax_11_model(path: Path) -> Path:
    """x FP32 [N, 2, 3] -> y: opset 11's Softmax at axis 1, which flattens [2, 3] into one
    axis of 6 (opset 13 made it the one axis): OpenVINO 2026.4 computes it over axis 1 alone."""
    return save(
        path,
        [helper.make_node("Softmax", ["x"], ["y"], axis=1)],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2, 3])],
        {"": 11},
    )


def softmax_11(x: np.ndarray) -> np.ndarray:
    flat = np.exp(x.reshape(len(x), -1))
    return (flat / flat.sum(axis=1, keepdims=True)).reshape(x.shape)


def test_openvino_answering_otherwise_than_onnxruntime_is_planned_past(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """OpenVINO, the CPU's first choice, answered this model wrong with a 200 (probabilities
    off by up to 0.5). Build now runs it on random inputs beside ONNX Runtime, and plans past
    it, saying so; a manifest that wants OpenVINO alone is refused."""
    source = init(tmp_path / "fn", softmax_11_model(tmp_path / "m.onnx"))
    assert f"{PLANNED_PAST} up to" in built(source, tmp_path / "out", capsys)
    x = np.random.default_rng(0).normal(0, 2, (2, 2, 3)).astype(np.float32)
    body = {
        "inputs": [
            {"name": "x", "datatype": "FP32", "shape": [2, 2, 3], "data": x.ravel().tolist()}
        ]
    }
    with running(tmp_path / "out", "--workers", "1") as (url, _):
        answer = httpx.post(f"{url}{INFER}", json=body, timeout=30).json()["outputs"][0]
    np.testing.assert_allclose(np.reshape(answer["data"], x.shape), softmax_11(x), rtol=1e-5)

    manifest = source / "function.toml"
    manifest.write_text(manifest.read_text() + 'prefer = ["openvino"]\n')
    assert main(["build", str(source), "--out", str(tmp_path / "only")]) != 0
    text = said(capsys)
    assert "error: openvino answers output `y` up to" in text
    assert "than ONNX Runtime on random inputs. Hint: serve it with ONNX Runtime" in text


def wrapping_model(path: Path) -> Path:
    """x UINT8 [N, 4] -> y = x + x, which ONNX wraps around past 255 (200 + 200 is 144) and
    OpenVINO 2026.4 saturates (255)."""
    return save(
        path,
        [helper.make_node("Add", ["x", "x"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.UINT8, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, ["N", 4])],
        {"": 17},
    )


def test_openvino_saturating_what_onnx_wraps_is_planned_past(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Random inputs of small integers (0..15) add up within uint8's range; the wide batch's,
    over all of it, overflow: OpenVINO answered 255 where ONNX Runtime answers 144, with a 200."""
    source = init(tmp_path / "fn", wrapping_model(tmp_path / "m.onnx"))
    assert f"{PLANNED_PAST} with other values (" in built(source, tmp_path / "out", capsys)


def scalars_model(path: Path) -> Path:
    """x FP32 [] -> y FP32 [] (x squared) and i INT64 [] (y truncated): rank-0 outputs."""
    return save(
        path,
        [
            helper.make_node("Mul", ["x", "x"], ["y"]),
            helper.make_node("Cast", ["y"], ["i"], to=TensorProto.INT64),
        ],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, []),
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
        ],
        {"": 17},
    )


def test_rank_0_outputs_keep_their_shape_through_front_processes(tmp_path: Path) -> None:
    """Through fronts before an inference process, the second scalar output came back [1]:
    the block the request's outputs are written to held only the first, the second crossed
    inline, and numpy's ascontiguousarray makes every array of rank 0 one of rank 1."""
    source = init(tmp_path / "fn", scalars_model(tmp_path / "m.onnx"))
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [], "data": [3.5]}]}
    with running(source, "--workers", "2") as (url, _):
        outputs = httpx.post(f"{url}{INFER}", json=body, timeout=30).json()["outputs"]
        invoked = httpx.post(f"{url}/invoke", json={"x": 3.5}, timeout=30).json()
    assert [(o["name"], o["shape"], o["data"]) for o in outputs] == [
        ("y", [], [12.25]),
        ("i", [], [12]),
    ]
    assert invoked == {"y": 12.25, "i": 12}


def one_node(path: Path, node: onnx.NodeProto, x: int, y: onnx.ValueInfoProto) -> Path:
    """`x` [N, 4] of that element type -> `y` by `node` (opset 21, IR 10: INT4 and FLOAT8)."""
    given = helper.make_tensor_value_info("x", x, ["N", 4])
    return save(path, [node], [given], [y], {"": 21}, ir=10)


def y_of(elem: int) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info("y", elem, ["N", 4])


def cast_to(elem: int) -> onnx.NodeProto:
    return helper.make_node("Cast", ["x"], ["y"], to=elem)


OPTIONAL = helper.make_optional_type_proto(helper.make_tensor_type_proto(TensorProto.FLOAT, [4]))
FLOAT, INT4, FLOAT8 = TensorProto.FLOAT, TensorProto.INT4, TensorProto.FLOAT8E4M3FN
NOT_SERVED = {  # (node, x's element type, y, what init says)
    "an INT4 input": (
        cast_to(FLOAT), INT4, y_of(FLOAT),
        "tensor `x`: ONNX type INT4 (22) has no KServe v2 datatype; expected one of ['BF16', "
        "'BOOL', 'BYTES', 'FP16', 'FP32', 'FP64', 'INT16', 'INT32', 'INT64', 'INT8', 'UINT16', "
        "'UINT32', 'UINT64', 'UINT8']. Hint: cast it to one in the model (Cast to INT8 from "
        "INT4, to FP16 or FP32 from a FLOAT8)",
    ),
    "a FLOAT8 output": (
        cast_to(FLOAT8), FLOAT, y_of(FLOAT8),
        "tensor `y`: ONNX type FLOAT8E4M3FN (17) has no KServe v2 datatype",
    ),
    "an output of no type": (
        helper.make_node("Relu", ["x"], ["y"]), FLOAT, helper.make_empty_tensor_value_info("y"),
        "output `y` is of no declared type, not a tensor; KServe v2 serves tensors only. "
        "Hint: declare its type; onnx.shape_inference.infer_shapes(model) fills it in",
    ),
    "an optional output": (
        helper.make_node("Optional", ["x"], ["y"]), FLOAT, helper.make_value_info("y", OPTIONAL),
        "output `y` is an optional, not a tensor; KServe v2 serves tensors only. Hint: export "
        "it as a tensor (OptionalGetElement unwraps one)",
    ),
}  # fmt: skip


@pytest.mark.parametrize("kind", NOT_SERVED)
def test_what_v2_cannot_carry_is_refused_by_init_naming_it_and_the_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    """An INT4 or FLOAT8 tensor read "ONNX element type 22 has no KServe v2 datatype" (which
    type, and what then?); an output of no type, or an optional one, was told to export
    skl2onnx's classifiers without ZipMap."""
    node, x, y, message = NOT_SERVED[kind]
    model = one_node(tmp_path / "m.onnx", node, x, y)
    assert main(["init", str(tmp_path / "fn"), "--model", str(model)]) == 2
    assert f"error: {model}: {message}" in said(capsys)


def bf16_scalars_model(path: Path) -> Path:
    """x FP32 [] -> y BF16 [] (x rounded to bf16), b BF16 [] -> f FP32 [] (b widened)."""
    return save(
        path,
        [
            helper.make_node("Cast", ["x"], ["y"], to=TensorProto.BFLOAT16),
            helper.make_node("Cast", ["b"], ["f"], to=TensorProto.FLOAT),
        ],
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, []),
            helper.make_tensor_value_info("b", TensorProto.BFLOAT16, []),
        ],
        [
            helper.make_tensor_value_info("y", TensorProto.BFLOAT16, []),
            helper.make_tensor_value_info("f", TensorProto.FLOAT, []),
        ],
        {"": 17},
    )


@pytest.mark.parametrize("backend", ["openvino", "onnxruntime"])
def test_a_rank_0_bf16_input_runs_on_either_backend(tmp_path: Path, backend: str) -> None:
    """/invoke's number for a BF16 scalar became a tensor of shape [1] (refused: "expected []
    BF16, got [1]"), and OpenVINO refused the scalar's bits with a 422 ("Failed to set tensor
    for input with precision: f16, since the model input tensor precision is: bf16"): in a
    uint16 array of rank 0 they are read as another type than in one of rank 1 or more."""
    prefer = f'prefer = ["{backend}"]\n'
    source = init(tmp_path / "fn", bf16_scalars_model(tmp_path / "m.onnx"), prefer)
    client_values = {"x": 1.7, "b": 2.5}
    with running(source, "--workers", "1") as (url, server):
        invoked = httpx.post(f"{url}/invoke", json=client_values, timeout=30)
    assert f"loaded fn on {backend}" in "".join(server.output)
    assert (invoked.status_code, invoked.json()) == (200, {"y": 1.703125, "f": 2.5})


def square_model(path: Path) -> Path:
    """x FP32 [N, N] -> y = x @ x: a first dim that names a later axis too."""
    return save(
        path,
        [helper.make_node("MatMul", ["x", "x"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "N"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", "N"])],
        {"": 17},
    )


async def send_together(url: str, bodies: list[dict[str, Any]]) -> list[httpx.Response]:
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        return await asyncio.gather(*(client.post(INFER, json=body) for body in bodies))


def test_a_first_dim_named_on_a_later_axis_is_no_batch_axis(tmp_path: Path) -> None:
    """x [N, N] read as batching (every first dim dynamic): two requests batched together were
    stacked into [4, 2] and both failed in the model with a 422, and one of [1, 3] did too.
    The model now runs each request alone, and the door holds x's axes to one size. init said
    x [-1, -1] had "no dynamic first dim"; it says what keeps it from batching."""
    source = init(tmp_path / "fn", square_model(tmp_path / "m.onnx"))
    manifest = " ".join((source / "function.toml").read_text().split())
    assert (
        "No batching: the model has no batch axis (x [-1, -1]: its first dim N sizes a "
        in (manifest)
        and "no dynamic first dim" not in manifest
    )
    rng = np.random.default_rng(0)
    squares = [rng.normal(0, 1, (n, n)).astype(np.float32) for n in (2, 2, 3)]
    bodies = [{"inputs": [v2_tensor(x)]} for x in [*squares, squares[0][:1]]]
    with running(source, "--workers", "1") as (url, _):
        *answers, wrong = asyncio.run(send_together(url, bodies))
    for x, answer in zip(squares, answers, strict=True):
        y = answer.json()["outputs"][0]
        np.testing.assert_allclose(np.reshape(y["data"], y["shape"]), x @ x, rtol=1e-5)
    assert (wrong.status_code, wrong.json()) == (400, {
        "error": "inputs `x` axis 0: 1, `x` axis 1: 2: the model names these axes `N`, one "
        "size: expected the same size on each"
    })  # fmt: skip


def v2_tensor(x: np.ndarray) -> dict[str, Any]:
    return {"name": "x", "datatype": "FP32", "shape": list(x.shape), "data": x.ravel().tolist()}


def test_an_input_named_inputs_is_the_models_own_at_invoke(tmp_path: Path) -> None:
    """A model whose input is named `inputs`: an /invoke body with it and a key the model
    lacks was told it is "a KServe v2 infer request, which /invoke does not read"."""
    model = save(
        tmp_path / "m.onnx",
        [helper.make_node("Identity", ["inputs"], ["y"])],
        [helper.make_tensor_value_info("inputs", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
        {"": 17},
    )
    source = init(tmp_path / "fn", model)
    with running(source) as (url, _):
        wrong = httpx.post(f"{url}/invoke", json={"inputs": [[1, 2, 3, 4]], "nope": [1]})
        right = httpx.post(f"{url}/invoke", json={"inputs": [[1, 2, 3, 4]]})
    assert wrong.status_code == 400
    assert "unknown ['nope']" in wrong.json()["error"]
    assert "KServe v2" not in wrong.json()["error"]
    assert right.status_code == 200 and right.json()["y"] == [[1, 2, 3, 4]]
