"""What each backend computes exactly, held at build and at the door: OpenVINO's 64-bit integers
(computed in 32 bits on the CPU), ops outside ONNX's default domain (ai.onnx.ml, which OpenVINO
cannot convert), and BF16 outputs (bits OpenVINO hands back in a float16 array, and ONNX
Runtime's numpy API lacks). Real OpenVINO and ONNX Runtime, models made with onnx.helper, and
`edgeserve init/build/serve/invoke` driven as a user runs them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import onnx
import pytest
import tritonclient.http as triton
from onnx import TensorProto, helper, numpy_helper
from tritonclient.utils import InferenceServerException

from edgeserve.backends import load_backend
from edgeserve.datatypes import bf16_values
from edgeserve.errors import ConfigError
from edgeserve.manifest import ModelSection
from edgeserve.shapes import shape_profile
from edgeserve.signature import read_signature
from tests.server import running

BIG = [[2**40, -(2**40), 2**31], [5, 6, 7]]


def _save(path: Path, nodes: list, inputs: list, outputs: list, inits=(), domains=()) -> Path:
    graph = helper.make_graph(nodes, path.stem, inputs, outputs, list(inits))
    opsets = [helper.make_opsetid("", 17), *(helper.make_opsetid(d, 1) for d in domains)]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def add_one(path: Path, elem: int, out_elem: int | None = None) -> Path:
    """x + 1 on 64-bit integers [N, 3]; with `out_elem`, the sum cast to that type."""
    one = numpy_helper.from_array(np.array([1], onnx.helper.tensor_dtype_to_np_dtype(elem)), "one")
    nodes = [helper.make_node("Add", ["x", "one"], ["sum" if out_elem else "y"])]
    if out_elem:
        nodes.append(helper.make_node("Cast", ["sum"], ["y"], to=out_elem))
    return _save(
        path,
        nodes,
        [helper.make_tensor_value_info("x", elem, ["N", 3])],
        [helper.make_tensor_value_info("y", out_elem or elem, ["N", 3])],
        [one],
    )


def classifier(path: Path) -> Path:
    """ai.onnx.ml's Normalizer then LinearClassifier's scores, as skl2onnx writes a pipeline
    (OpenVINO converts the Normalizer, not the LinearClassifier)."""
    nodes = [
        helper.make_node("Normalizer", ["x"], ["unit"], domain="ai.onnx.ml", norm="L2"),
        helper.make_node(
            "LinearClassifier",
            ["unit"],
            ["label", "y"],
            domain="ai.onnx.ml",
            coefficients=[1.0, 0.0, 0.0, 0.0, 2.0, 0.0],
            intercepts=[0.0, 1.0],
            classlabels_ints=[0, 1],
        ),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2])
    return _save(path, nodes, [x], [y], domains=("ai.onnx.ml",))


def cast(path: Path, source: int, target: int) -> Path:
    """x [N, 4] cast from one element type to another (FP32 to BF16, BF16 to FP32)."""
    node = helper.make_node("Cast", ["x"], ["y"], to=target)
    return _save(
        path,
        [node],
        [helper.make_tensor_value_info("x", source, ["N", 4])],
        [helper.make_tensor_value_info("y", target, ["N", 4])],
    )


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "edgeserve", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=180, check=False)


def init(folder: Path, model: Path, backend: str = "") -> Path:
    done = cli("init", str(folder), "--model", str(model))
    assert done.returncode == 0, done.stderr
    if backend:
        manifest = folder / "function.toml"
        manifest.write_text(manifest.read_text() + f'\n[backend]\nprefer = ["{backend}"]\n')
    return folder


@pytest.fixture(autouse=True)
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EDGESERVE_CACHE_DIR", str(tmp_path / "cache"))


def infer(url: str, name: str, x: np.ndarray, datatype: str) -> triton.InferResult:
    client = triton.InferenceServerClient(url.removeprefix("http://"), network_timeout=30)
    tensor = triton.InferInput("x", list(x.shape), datatype)
    tensor.set_data_from_numpy(x)
    try:
        return client.infer(name, [tensor])
    finally:
        client.close()


@pytest.mark.parametrize(("datatype", "backend"), [("INT64", "onnxruntime"), ("INT32", "openvino")])
def test_64_bit_integer_outputs_fall_through_to_onnxruntime(
    tmp_path: Path, datatype: str, backend: str
) -> None:
    """OpenVINO answered 2**40 + 1 as 1 with a 200; ONNX Runtime computes INT64 exactly. An
    INT32 model stays on OpenVINO (the default on a CPU)."""
    elem = TensorProto.INT64 if datatype == "INT64" else TensorProto.INT32
    source = init(tmp_path / "add", add_one(tmp_path / "add.onnx", elem))
    x = np.array(
        BIG if datatype == "INT64" else [[2**30, -(2**30), 7], [5, 6, 7]], datatype.lower()
    )
    with running(source) as (url, server):
        y = infer(url, "add", x, datatype).as_numpy("y")
    np.testing.assert_array_equal(y, x + 1)
    assert f"loaded add on {backend}" in "".join(server.output)


def test_only_openvino_for_64_bit_outputs_is_refused_at_build_saying_why(tmp_path: Path) -> None:
    source = init(tmp_path / "add", add_one(tmp_path / "add.onnx", TensorProto.INT64), "openvino")
    done = cli("build", str(source), "--out", str(tmp_path / "out"))
    assert done.returncode == ConfigError.exit_code, done.stderr
    assert "openvino computes INT64 in 32 bits (output `y`)" in done.stderr


@pytest.mark.parametrize(("datatype", "workers"), [("INT64", "1"), ("UINT64", "1"), ("INT64", "2")])
def test_openvino_refuses_64_bit_inputs_past_int32_with_a_400(
    tmp_path: Path, datatype: str, workers: str
) -> None:
    """Inputs within int32 are exact on OpenVINO (2**31 - 2 + 1 is 2**31 - 1); past it the sum
    was wrong with a 200 (2**31 - 1 + 1 was -2**31): the door refuses them now, in front
    processes too (`--workers 2`: they learn the backend from the inference process)."""
    elem = TensorProto.INT64 if datatype == "INT64" else TensorProto.UINT64
    model = add_one(tmp_path / "wide.onnx", elem, TensorProto.FLOAT)
    source = init(tmp_path / "wide", model)
    fits = np.array([[2**31 - 2, 0, 3], [5, 6, 2**20]], datatype.lower())
    past = np.array([[2**31 - 1, 0, 3], [5, 6, 7]], datatype.lower())
    with running(source, "--workers", workers) as (url, server):
        y = infer(url, "wide", fits, datatype).as_numpy("y")
        with pytest.raises(InferenceServerException) as refused:
            infer(url, "wide", past + 1, datatype)
    assert "loaded wide on openvino" in "".join(server.output)
    np.testing.assert_array_equal(y, (fits + 1).astype(np.float32))
    assert refused.value.status() == "400"
    assert (
        f"tensor `x`: value 2147483648 is out of range: the openvino backend serving this model "
        f"computes {datatype.lower()} in 32 bits"
    ) in refused.value.message()
    assert 'prefer = ["onnxruntime"]' in refused.value.message()


def test_an_ai_onnx_ml_model_builds_and_serves_on_onnxruntime(tmp_path: Path) -> None:
    """OpenVINO has no conversion for LinearClassifier: `build` failed with its raw report."""
    source = init(tmp_path / "clf", classifier(tmp_path / "clf.onnx"))
    built = cli("build", str(source), "--out", str(tmp_path / "out"))
    assert built.returncode == 0, built.stderr
    x = [[3.0, 4.0, 0.0], [1.0, 2.0, 2.0]]
    with running(tmp_path / "out") as (url, server):
        invoked = cli("invoke", url, "--json", f'{{"x": {x}}}')
    assert "loaded clf on onnxruntime" in "".join(server.output)
    assert invoked.returncode == 0, invoked.stderr
    y = np.array(json.loads(invoked.stdout)["y"])
    np.testing.assert_allclose(y, [[0.6, 2.6], [1 / 3, 7 / 3]], rtol=1e-6)


def test_an_ai_onnx_ml_model_with_only_openvino_names_the_op_and_the_fix(tmp_path: Path) -> None:
    source = init(tmp_path / "clf", classifier(tmp_path / "clf.onnx"), "openvino")
    done = cli("build", str(source), "--out", str(tmp_path / "out"))
    assert done.returncode == ConfigError.exit_code, done.stderr
    assert (
        "openvino does not serve ops outside ONNX's default domain "
        "(ai.onnx.ml.Normalizer, ai.onnx.ml.LinearClassifier)"
    ) in done.stderr
    assert 'Hint: serve it with ONNX Runtime: [backend] prefer = ["onnxruntime"]' in done.stderr
    assert "Traceback" not in done.stderr and "OpConversionFailure" not in done.stderr


X_BF16 = np.array([[1.0, -2.5, 3.140625, 1e30], [0.0, -0.0, 65504.0, -1e-3]], np.float32)


def bf16(x: np.ndarray) -> np.ndarray:
    """float32 rounded to the nearest bf16 (ties to even), widened back to float32."""
    bits = x.view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16 << 16
    return rounded.astype(np.uint32).view(np.float32)


@pytest.mark.parametrize("backend", ["openvino", "onnxruntime"])
def test_bf16_outputs_come_back_as_their_values(tmp_path: Path, backend: str) -> None:
    """OpenVINO's bf16 bits in a float16 array were converted as float16 values (1.0 came back
    as 9.2e-41); ONNX Runtime failed its start ("No corresponding Numpy type ... bfloat16")."""
    source = init(
        tmp_path / "bf", cast(tmp_path / "bf.onnx", TensorProto.FLOAT, TensorProto.BFLOAT16)
    )
    expected = bf16(X_BF16)
    assert (expected[0].view(np.uint32) >> 16).tolist() == [0x3F80, 0xC020, 0x4049, 0x714A]
    with running(source, "--backend", backend) as (url, server):
        result = infer(url, "bf", X_BF16, "FP32")
        invoked = httpx.post(f"{url}/invoke", json={"x": X_BF16.tolist()}, timeout=30)
        as_json = httpx.post(
            f"{url}/v2/models/bf/infer",
            json={
                "inputs": [
                    {
                        "name": "x",
                        "datatype": "FP32",
                        "shape": [2, 4],
                        "data": X_BF16.ravel().tolist(),
                    }
                ]
            },
            timeout=30,
        )
    assert f"loaded bf on {backend}" in "".join(server.output)
    assert result.get_output("y")["datatype"] == "BF16"
    np.testing.assert_array_equal(result.as_numpy("y"), expected)
    assert invoked.status_code == 200, invoked.text
    np.testing.assert_array_equal(np.array(invoked.json()["y"], np.float32), expected)
    assert as_json.status_code == 400
    assert "BF16 travels only as binary data" in as_json.json()["error"]


@pytest.mark.parametrize("backend", ["openvino", "onnxruntime"])
def test_bf16_inputs_run_on_both_backends(tmp_path: Path, backend: str) -> None:
    """ONNX Runtime refused BF16 inputs with a 400 (its numpy API takes the bits as uint16)."""
    model = cast(tmp_path / "bfin.onnx", TensorProto.BFLOAT16, TensorProto.FLOAT)
    source = init(tmp_path / "bfin", model)
    x = bf16(X_BF16)  # values bf16 holds exactly: tritonclient sends them unchanged
    with running(source, "--backend", backend) as (url, server):
        y = infer(url, "bfin", x, "BF16").as_numpy("y")
    assert f"loaded bfin on {backend}" in "".join(server.output)
    np.testing.assert_array_equal(y, x)


@pytest.mark.parametrize("backend", ["openvino", "onnxruntime"])
def test_bf16_inputs_travel_as_numbers_on_invoke(tmp_path: Path, backend: str) -> None:
    """init wrote a BF16 input's sample as its raw bits (`[[16217, ...]]`), and /invoke refused
    BF16 inputs ("travels only as binary data (binary_data_size)", a key /invoke does not
    have): `edgeserve invoke --file samples/request.json` and `bench` failed out of the box.
    /invoke takes them as numbers, as it answers BF16 outputs, rounded to the nearest bf16."""
    model = cast(tmp_path / "bfin.onnx", TensorProto.BFLOAT16, TensorProto.FLOAT)
    source = init(tmp_path / "bfin", model)
    sample = json.loads((source / "samples" / "request.json").read_text())
    assert all(0 <= value < 1 for value in sample["x"][0]), sample
    with running(source, "--backend", backend) as (url, _):
        invoked = cli("invoke", url, "--file", str(source / "samples" / "request.json"))
        posted = httpx.post(f"{url}/invoke", json={"x": X_BF16.tolist()}, timeout=30)
    assert invoked.returncode == 0, invoked.stderr
    expected = bf16(np.array(sample["x"], np.float32))
    np.testing.assert_array_equal(np.array(json.loads(invoked.stdout)["y"], np.float32), expected)
    assert posted.status_code == 200, posted.text
    np.testing.assert_array_equal(np.array(posted.json()["y"], np.float32), bf16(X_BF16))


def _bucketed(model: Path):
    """ONNX Runtime asked for bound buffers at bucket shapes (rows 1, 2, 4), as on CUDA."""
    signature = read_signature(model, ModelSection())
    profile = shape_profile(signature, 4)
    return load_backend("onnxruntime", model, signature=signature, profile=profile, buckets=True)


def test_bf16_models_run_where_onnxruntime_binds_its_buffers(tmp_path: Path) -> None:
    """Bound buffers (CUDA's path; `buckets=True` asks for them on the CPU too) are numpy
    arrays, which hold no bfloat16: a BF16 model failed its warm-up there, so the server never
    started on a GPU. It now runs at each batch's own shape, its tensors as OrtValues."""
    x = bf16(X_BF16)
    out = _bucketed(cast(tmp_path / "o.onnx", TensorProto.FLOAT, TensorProto.BFLOAT16))
    np.testing.assert_array_equal(bf16_values(out.infer({"x": X_BF16})["y"]), x)
    into = _bucketed(cast(tmp_path / "i.onnx", TensorProto.BFLOAT16, TensorProto.FLOAT))
    np.testing.assert_array_equal(
        into.infer({"x": (x.view(np.uint32) >> 16).astype(np.uint16)})["y"], x
    )
