"""The v2 codec against the real tritonclient's own encoder and decoder, for every datatype."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import orjson
import pytest
import tritonclient.http as triton

from edgeserve.dataplane import InferRequest, OutputTensor, check_outputs, response_outputs
from edgeserve.datatypes import DATATYPES
from edgeserve.errors import InvalidInput
from edgeserve.http import v2
from edgeserve.types import Signature, TensorSpec


def _ints(dtype: type) -> np.ndarray:
    info = np.iinfo(dtype)
    return np.array([[info.min, 0, info.max], [1, 2, 3]], dtype=dtype)


SAMPLES: dict[str, np.ndarray] = {
    "BOOL": np.array([[True, False, True], [False, False, True]]),
    **{name: _ints(DATATYPES[name].numpy.type) for name in ("UINT8", "UINT16", "UINT32", "UINT64")},
    **{name: _ints(DATATYPES[name].numpy.type) for name in ("INT8", "INT16", "INT32", "INT64")},
    "FP16": np.array([[0.5, -2.0, 65504.0], [0.0, 1e-3, -1.0]], dtype=np.float16),
    "FP32": np.array([[1.5, -0.25, 3.4e38], [0.1, 0.0, -7.0]], dtype=np.float32),
    "FP64": np.array([[1e300, -0.1, 2.0], [0.0, 3.25, -1e-300]], dtype=np.float64),
    "BYTES": np.array(
        [[b"a", b"", "\u00e9t\u00e9".encode()], [b"hello", b"x y", b"z"]], dtype=object
    ),
    "BF16": np.array([[1.5, -2.0, 0.0078125], [3.0, 0.0, -1.0]], dtype=ml_dtypes.bfloat16),
}
NOT_UTF8 = np.array([[b"\xff\x00", b"ok"]], dtype=object)
JSON_DATATYPES = [name for name in DATATYPES if name != "BF16"]


def expected_decoded(datatype: str, array: np.ndarray) -> np.ndarray:
    """What the codec hands the runtime: BF16 as its raw bits in uint16, the rest as is."""
    return array.view(np.uint16) if datatype == "BF16" else array


def client_request(
    tensors: dict[str, tuple[str, np.ndarray]], binary: bool, **kwargs
) -> InferRequest:
    """Encode with tritonclient exactly as it sends, then decode with ours."""
    inputs = []
    for name, (datatype, array) in tensors.items():
        if datatype == "BF16":  # tritonclient 2.41 takes BF16 as float32 (sends the top 16 bits)
            array = array.astype(np.float32)
        tensor = triton.InferInput(name, list(array.shape), datatype)
        tensor.set_data_from_numpy(array, binary_data=binary)
        inputs.append(tensor)
    body, json_size = triton.InferenceServerClient.generate_request_body(inputs, **kwargs)
    return v2.decode_request(body, None if json_size is None else str(json_size))


def client_result(outputs: list[OutputTensor], request_id: str | None = None) -> triton.InferResult:
    """Encode with ours, then parse with tritonclient exactly as it reads a response."""
    body, header_length = v2.encode_response("m", "1", request_id, outputs)
    return triton.InferResult.from_response_body(body, header_length=header_length)


def signature_of(tensors: dict[str, str]) -> Signature:
    specs = tuple(TensorSpec(name, datatype, (-1, 3)) for name, datatype in tensors.items())
    return Signature(inputs=specs, outputs=specs, batched=True)


@pytest.mark.parametrize("datatype", list(DATATYPES))
def test_every_datatype_decodes_from_tritonclient_binary(datatype: str) -> None:
    request = client_request({"t": (datatype, SAMPLES[datatype])}, binary=True)
    decoded = request.inputs["t"]
    assert decoded.dtype == DATATYPES[datatype].numpy
    np.testing.assert_array_equal(decoded, expected_decoded(datatype, SAMPLES[datatype]))


@pytest.mark.parametrize("datatype", JSON_DATATYPES)
def test_every_json_datatype_decodes_from_tritonclient_json(datatype: str) -> None:
    request = client_request({"t": (datatype, SAMPLES[datatype])}, binary=False)
    decoded = request.inputs["t"]
    assert decoded.dtype == DATATYPES[datatype].numpy
    np.testing.assert_array_equal(decoded, SAMPLES[datatype])


@pytest.mark.parametrize("datatype", list(DATATYPES))
def test_every_datatype_encodes_for_tritonclient_binary(datatype: str) -> None:
    data = expected_decoded(datatype, SAMPLES[datatype])
    result = client_result([OutputTensor("t", data, datatype, binary=True)])
    assert result.get_output("t")["datatype"] == datatype
    np.testing.assert_array_equal(result.as_numpy("t"), SAMPLES[datatype])


@pytest.mark.parametrize("datatype", JSON_DATATYPES)
def test_every_json_datatype_encodes_for_tritonclient_json(datatype: str) -> None:
    result = client_result([OutputTensor("t", SAMPLES[datatype], datatype, binary=False)])
    expected = SAMPLES[datatype]
    if datatype == "BYTES":  # JSON carries text: the client reads str back
        expected = np.vectorize(lambda b: b.decode())(expected).astype(object)
    np.testing.assert_array_equal(result.as_numpy("t"), expected)
    assert result.get_response()["outputs"][0]["shape"] == [2, 3]


def test_binary_only_for_some_outputs_and_in_the_order_asked() -> None:
    tensors = {
        "a": ("FP32", SAMPLES["FP32"]),
        "b": ("BYTES", SAMPLES["BYTES"]),
        "c": ("INT8", SAMPLES["INT8"]),
    }
    outputs = [
        triton.InferRequestedOutput("c", binary_data=False),
        triton.InferRequestedOutput("b", binary_data=True),
    ]
    request = client_request(tensors, binary=True, outputs=outputs, request_id="req-7")
    signature = signature_of({name: datatype for name, (datatype, _) in tensors.items()})
    check_outputs(request, signature)
    sent = response_outputs(request, request.inputs, signature)
    assert [(o.name, o.binary) for o in sent] == [("c", False), ("b", True)]
    body, header_length = v2.encode_response("m", "1", request.id, sent)
    header = orjson.loads(body[:header_length])
    assert (
        header["id"] == "req-7" and header["model_name"] == "m" and header["model_version"] == "1"
    )
    assert header["outputs"][0]["data"] == SAMPLES["INT8"].ravel().tolist()
    assert header["outputs"][1]["parameters"] == {"binary_data_size": len(body) - header_length}
    result = triton.InferResult.from_response_body(body, header_length=header_length)
    np.testing.assert_array_equal(result.as_numpy("b"), SAMPLES["BYTES"])


def test_no_outputs_named_means_all_binary_as_tritonclient_asks() -> None:
    request = client_request(
        {"a": ("FP32", SAMPLES["FP32"]), "b": ("INT64", SAMPLES["INT64"])}, binary=True
    )
    assert request.outputs is None and request.binary_output
    assert request.parameters == {"binary_data_output": True}
    signature = signature_of({"a": "FP32", "b": "INT64"})
    sent = response_outputs(request, request.inputs, signature)
    assert [(o.name, o.binary) for o in sent] == [("a", True), ("b", True)]


def test_all_json_response_has_no_header_length_and_no_id_when_none_given() -> None:
    body, header_length = v2.encode_response(
        "m", "2", None, [OutputTensor("y", np.arange(4).reshape(2, 2), "INT64", False)]
    )
    assert header_length is None
    assert orjson.loads(body) == {
        "model_name": "m",
        "model_version": "2",
        "outputs": [{"name": "y", "datatype": "INT64", "shape": [2, 2], "data": [0, 1, 2, 3]}],
    }


DROP = object()


def json_body(**tensor: object) -> bytes:
    """One FP32 [2, 2] input, with fields replaced (or dropped with DROP)."""
    entry = {"name": "x", "datatype": "FP32", "shape": [2, 2], "data": [1, 2, 3, 4], **tensor}
    return orjson.dumps({"inputs": [{k: v for k, v in entry.items() if v is not DROP}]})


def test_nested_data_and_request_parameters_pass_through() -> None:
    body = orjson.dumps(
        {
            "id": "42",
            "parameters": {"priority": 1, "custom": "yes"},
            "inputs": [
                {"name": "x", "datatype": "FP32", "shape": [2, 2], "data": [[1, 2], [3, 4]]}
            ],
        }
    )
    request = v2.decode_request(body, None)
    assert request.id == "42"
    assert request.parameters == {"priority": 1, "custom": "yes"}
    np.testing.assert_array_equal(request.inputs["x"], np.array([[1, 2], [3, 4]], np.float32))


BINARY_FP32 = orjson.dumps(
    {
        "inputs": [
            {"name": "x", "datatype": "FP32", "shape": [2], "parameters": {"binary_data_size": 8}}
        ]
    }
)


@pytest.mark.parametrize(
    ("body", "header_length", "words"),
    [
        (b"{not json", None, "not valid JSON"),
        (b"[1, 2]", None, "expected a JSON object"),
        (json_body(shape=[2, 3]), None, "tensor `x`: FP32 [2, 3]: expected 6 elements, got 4"),
        (json_body(datatype="FP8"), None, "tensor `x`: unknown datatype 'FP8'"),
        (json_body(shape=[2, -2]), None, "non-negative ints"),
        (
            json_body(datatype="INT64", data=[1.5, 2, 3, 4]),
            None,
            "expected integers, found fractions",
        ),
        (json_body(datatype="UINT8", data=[1, 2, 3, 300]), None, "tensor `x`: UINT8 [2, 2]"),
        (json_body(datatype="BOOL", data=[1, 0, 1, 0]), None, "expected booleans, found integers"),
        (json_body(data=[[1, 2], [3]]), None, "tensor `x`: FP32 [2, 2]: `data` is ragged"),
        (json_body(data=["a", "b", "c", "d"]), None, "expected numbers, found strings"),
        (json_body(datatype="BF16"), None, "BF16 travels only as binary"),
        (json_body(datatype="BYTES", data=[1, 2, 3, 4]), None, "expected strings, found integers"),
        (json_body(data=DROP), None, "neither `data` nor"),
        (json_body(parameters={"binary_data_size": 16}), None, "both `data` and"),
        (BINARY_FP32 + b"\0" * 4, str(len(BINARY_FP32)), "binary_data_size 8 runs past the body"),
        (BINARY_FP32 + b"\0" * 12, str(len(BINARY_FP32)), "add up to 8 bytes, but 12 bytes follow"),
        (BINARY_FP32 + b"\0" * 8, "abc", "Inference-Header-Content-Length"),
        (BINARY_FP32 + b"\0" * 8, "0", "raw binary request"),
        (
            BINARY_FP32.replace(b'"FP32"', b'"FP64"') + b"\0" * 8,
            str(len(BINARY_FP32)),
            "needs 16 bytes",
        ),
    ],
)
def test_wire_errors_name_the_tensor_and_the_expectation(
    body: bytes, header_length: str | None, words: str
) -> None:
    with pytest.raises(InvalidInput, match=words.replace("[", r"\[").replace("(", r"\(")):
        v2.decode_request(body, header_length)


def test_bytes_framing_must_fill_the_binary_data_exactly() -> None:
    framed = b"\x02\x00\x00\x00hi\x09\x00\x00\x00x"  # second element claims 9 bytes, has 1
    header = orjson.dumps(
        {
            "inputs": [
                {
                    "name": "s",
                    "datatype": "BYTES",
                    "shape": [2],
                    "parameters": {"binary_data_size": len(framed)},
                }
            ]
        }
    )
    with pytest.raises(InvalidInput) as refused:
        v2.decode_request(header + framed, str(len(header)))
    assert refused.value.message == (
        "tensor `s`: BYTES binary data: expected 2 length-prefixed elements filling 11 bytes "
        "exactly; element 1 (at byte 6) declares 9 bytes; 1 remain"
    )


@pytest.mark.parametrize(
    ("framed", "shape", "where"),
    [
        (
            b"\x02\x00\x00\x00hi\x09\x00",
            [2],
            "element 1's 4-byte length prefix at byte 6 has 2 bytes",
        ),
        (b"\x01\x00\x00\x00hzz", [1], "2 bytes follow element 0"),
        (b"\x00\x00\x00\x00", [0], "4 bytes follow the start: the shape holds no elements"),
        (b"\xff\xff\xff\xffabc", [1], "element 0 (at byte 0) declares 4294967295 bytes; 3 remain"),
    ],
)
def test_bytes_framing_errors_say_which_element_is_wrong(
    framed: bytes, shape: list[int], where: str
) -> None:
    """It said only what was expected ("3 length-prefixed elements filling 14 bytes")."""
    entry = {"name": "s", "datatype": "BYTES", "shape": shape}
    header = orjson.dumps({"inputs": [{**entry, "parameters": {"binary_data_size": len(framed)}}]})
    with pytest.raises(InvalidInput) as refused:
        v2.decode_request(header + framed, str(len(header)))
    assert refused.value.message.endswith(f"; {where}")


def test_outputs_are_checked_before_running_the_model() -> None:
    signature = Signature(
        inputs=(TensorSpec("x", "FP32", (-1, 3)),),
        outputs=(TensorSpec("y", "FP32", (-1, 3)), TensorSpec("h", "BF16", (-1, 3))),
        batched=True,
    )
    ask = lambda *outs: {"inputs": [], "outputs": [{"name": n, "parameters": p} for n, p in outs]}  # noqa: E731
    with pytest.raises(
        InvalidInput,
        match=r"output `z`: the model has no such output; its outputs are \['h', 'y'\]",
    ):
        check_outputs(v2.decode_request(orjson.dumps(ask(("z", {}))), None), signature)
    with pytest.raises(InvalidInput, match="output `h`: BF16 travels only as binary"):
        check_outputs(
            v2.decode_request(orjson.dumps(ask(("h", {"binary_data": False}))), None), signature
        )
    check_outputs(
        v2.decode_request(orjson.dumps(ask(("h", {"binary_data": True}))), None), signature
    )


def test_bytes_that_are_not_utf8_cannot_be_json_output() -> None:
    with pytest.raises(InvalidInput, match="output `t`: holds bytes that are not UTF-8"):
        v2.encode_response("m", "1", None, [OutputTensor("t", NOT_UTF8, "BYTES", binary=False)])
    result = client_result([OutputTensor("t", NOT_UTF8, "BYTES", binary=True)])
    np.testing.assert_array_equal(result.as_numpy("t"), NOT_UTF8)


def test_json_floats_that_are_not_finite_leave_the_others_as_orjson_writes_them() -> None:
    """FP32 [0.1, NaN] was written through Python's json, as 0.10000000149011612: the float64
    that float32 widens to (the same float32 read back, but not the text of every other
    answer)."""
    data = np.array([[0.1, np.nan, -np.inf]], np.float32)
    body, _ = v2.encode_response("m", "1", None, [OutputTensor("y", data, "FP32", binary=False)])
    assert b'"data":[0.1,NaN,-Infinity]' in body
