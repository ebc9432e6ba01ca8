"""What the bench sends: --shape parsing, synthesized tensors, binary/JSON bodies, samples."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import orjson
import pytest
import tritonclient.http as triton

from edgeserve.bench.inputs import (
    DEFAULT_DYNAMIC_DIM,
    ModelInputs,
    encode_infer,
    has_samples,
    parse_shapes,
    read_samples,
    synthesize,
)
from edgeserve.errors import ConfigError

METADATA = {
    "name": "m",
    "inputs": [
        {"name": "image", "datatype": "FP32", "shape": [-1, 1, 32, -1]},
        {"name": "ids", "datatype": "INT64", "shape": [-1, 3]},
        {"name": "flag", "datatype": "BOOL", "shape": [-1, 1]},
        {"name": "text", "datatype": "BYTES", "shape": [-1, 2]},
        {"name": "half", "datatype": "BF16", "shape": [-1, 2]},
    ],
    "outputs": [],
}
MODEL = ModelInputs.from_server(METADATA, {"max_batch_size": 8})


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ([], {}),
        (["x:1,16"], {"x": (1, 16)}),
        (["x:4", "image:1,32,100"], {"x": (4,), "image": (1, 32, 100)}),
    ],
)
def test_parse_shapes(values: list[str], expected: dict) -> None:
    assert parse_shapes(values) == expected


@pytest.mark.parametrize("value", ["x", "x:", ":1,2", "x:1,a", "x:0,4", "x:-1"])
def test_parse_shapes_rejects(value: str) -> None:
    with pytest.raises(ConfigError, match="NAME:D1,D2"):
        parse_shapes([value])


def test_synthesize_resolves_dynamic_dims_and_datatypes() -> None:
    tensors = synthesize(MODEL, {"image": (1, 32, 100)}, batch_size=4)
    assert {name: (t.shape, t.dtype) for name, t in tensors.items()} == {
        "image": ((4, 1, 32, 100), np.dtype(np.float32)),
        "ids": ((4, 3), np.dtype(np.int64)),
        "flag": ((4, 1), np.dtype(np.bool_)),
        "text": ((4, 2), np.dtype(np.object_)),
        "half": ((4, 2), np.dtype(np.uint16)),
    }
    assert tensors["ids"].min() >= 0
    assert 0.0 <= tensors["image"].min() <= tensors["image"].max() < 1.0
    assert all(isinstance(x, bytes) and len(x) == 8 for x in tensors["text"].ravel())


def test_synthesize_default_dynamic_dim_and_unbatched_model() -> None:
    model = ModelInputs("m", (("x", "FP16", (-1, 5)),), batched=False)
    tensors = synthesize(model, {}, batch_size=4)  # no batch axis to add
    assert tensors["x"].shape == (DEFAULT_DYNAMIC_DIM, 5)
    assert tensors["x"].dtype == np.float16


def test_an_input_declared_as_one_given_a_shape_is_sized_alike() -> None:
    """`--shape input_ids:64` alone sent 16-token attention masks: every request failed on
    the model's tied `seq` dim. An input given its own --shape keeps it."""
    bert = ModelInputs.from_server(
        {
            "name": "bert",
            "inputs": [
                {"name": name, "datatype": "INT64", "shape": [-1, -1]}
                for name in ("input_ids", "attention_mask", "token_type_ids")
            ]
            + [{"name": "pixels", "datatype": "FP32", "shape": [-1, 3, -1]}],
        },
        {"max_batch_size": 8},
    )
    tensors = synthesize(bert, {"input_ids": (64,), "token_type_ids": (8,)}, batch_size=2)
    assert {name: array.shape for name, array in tensors.items()} == {
        "input_ids": (2, 64),
        "attention_mask": (2, 64),  # as input_ids: both [-1, -1]
        "token_type_ids": (2, 8),  # its own
        "pixels": (2, 3, 16),  # another shape: the default
    }


def test_synthesize_is_seeded() -> None:
    first, again = synthesize(MODEL, {}, 2, seed=3), synthesize(MODEL, {}, 2, seed=3)
    assert all(np.array_equal(first[k], again[k]) for k in first)


def test_shape_override_of_the_wrong_rank() -> None:
    with pytest.raises(ConfigError, match="--shape image: expected 3 dims"):
        synthesize(MODEL, {"image": (32, 100)}, batch_size=1)


def test_binary_body_is_what_tritonclient_sends() -> None:
    tensors = {
        "x": np.arange(8, dtype=np.float32).reshape(2, 4),
        "n": np.array([[1, -2]], dtype=np.int64).reshape(1, 2),
        "s": np.array([[b"ab", b"cde"]], dtype=np.object_),
    }
    datatypes = {"x": "FP32", "n": "INT64", "s": "BYTES"}
    body = encode_infer("m", tensors, datatypes, binary=True, items=2)
    inputs = []
    for name, array in tensors.items():
        tensor = triton.InferInput(name, list(array.shape), datatypes[name])
        tensor.set_data_from_numpy(array, binary_data=True)
        inputs.append(tensor)
    expected, json_size = triton.InferenceServerClient.generate_request_body(inputs)
    header_size = int(body.headers["Inference-Header-Content-Length"])
    assert body.path == "/v2/models/m/infer"
    assert body.items == 2
    assert orjson.loads(body.body[:header_size]) == orjson.loads(expected[:json_size])
    assert body.body[header_size:] == expected[json_size:]
    assert body.body[-13:] == struct.pack("<I", 2) + b"ab" + struct.pack("<I", 3) + b"cde"


def test_json_body() -> None:
    tensors = {"x": np.array([[1.5, 2.0]], dtype=np.float32), "s": np.array([b"hi"], dtype=object)}
    body = encode_infer("m", tensors, {"x": "FP32", "s": "BYTES"}, binary=False, items=1)
    assert body.headers == {"Content-Type": "application/json"}
    assert orjson.loads(body.body) == {
        "inputs": [
            {"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [1.5, 2.0]},
            {"name": "s", "datatype": "BYTES", "shape": [1], "data": ["hi"]},
        ]
    }


def test_bf16_only_travels_in_binary() -> None:
    with pytest.raises(ConfigError, match="BF16 travels only in binary"):
        encode_infer("m", {"h": np.zeros((1, 2), np.uint16)}, {"h": "BF16"}, binary=False, items=1)


def test_read_samples(tmp_path: Path) -> None:
    v2 = {
        "inputs": [{"name": "x", "datatype": "INT32", "shape": [3, 2], "data": [1, 2, 3, 4, 5, 6]}]
    }
    (tmp_path / "a.json").write_bytes(orjson.dumps(v2))
    (tmp_path / "b.json").write_bytes(orjson.dumps({"x": [1, 2]}))
    (tmp_path / "c.png").write_bytes(b"\x89PNG fake")
    (tmp_path / "notes.txt").write_text("ignored")
    model = ModelInputs("m", (("x", "INT32", (-1, 2)),), batched=True)
    infer, invoke, image = read_samples(tmp_path, model, binary=True)
    assert (infer.path, infer.items) == ("/v2/models/m/infer", 3)
    assert infer.body.endswith(np.arange(1, 7, dtype="<i4").tobytes())
    assert (invoke.path, invoke.headers, orjson.loads(invoke.body), invoke.items) == (
        "/invoke",
        {"Content-Type": "application/json"},
        {"x": [1, 2]},
        0,  # the handler decides how many items: the server counts them
    )
    assert (image.path, image.headers, image.body, image.items) == (
        "/invoke",
        {"Content-Type": "image/png"},
        b"\x89PNG fake",
        0,
    )


def test_has_samples(tmp_path: Path) -> None:
    assert not has_samples(tmp_path / "missing")
    (tmp_path / "README.md").write_text("not a sample")
    assert not has_samples(tmp_path)
    (tmp_path / "page.JPG").write_bytes(b"")
    assert has_samples(tmp_path)


@pytest.mark.parametrize(
    ("name", "content", "match"),
    [
        ("bad.json", b"{not json", "not valid JSON"),
        ("bad.json", b'{"inputs": [{"name": "x"}]}', "a v2 input needs name, datatype"),
        ("notes.txt", b"nothing to send", "no \\*.json or image samples"),
    ],
)
def test_read_samples_errors(tmp_path: Path, name: str, content: bytes, match: str) -> None:
    (tmp_path / name).write_bytes(content)
    with pytest.raises(ConfigError, match=match):
        read_samples(tmp_path, MODEL, binary=True)
