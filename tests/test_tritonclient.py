"""The stock tritonclient.http (sync and aio) against edgeserve on a real uvicorn.

The model is one ONNX Identity per v2 datatype, run by ONNX Runtime on CPU. BF16 is left out:
ONNX Runtime's CPU Identity supports bfloat16, but its Python API cannot feed or return it
(numpy has no bfloat16; a uint16 array is refused for a bfloat16 input). BF16's exact wire
framing is checked against tritonclient's own encoder and decoder in test_v2_codec.py.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import httpx
import msgpack
import numpy as np
import pytest
import tritonclient.http as triton
import tritonclient.http.aio as triton_aio
from tritonclient.utils import InferenceServerException

from edgeserve.builder import build
from edgeserve.datatypes import DATATYPES
from edgeserve.http import create_app
from edgeserve.runtime import Runtime
from tests.models import identity_model, write_function
from tests.server import running
from tests.test_v2_codec import SAMPLES
from tests.threaded_server import serving

RUN_BY_ORT = tuple(name for name in DATATYPES if name != "BF16")
MANIFEST = """
[function]
name = "identity"
version = "2"
[batching]
max_batch_size = 8
preferred_batch_sizes = [2]
max_queue_delay_ms = 1
[backend]
prefer = ["onnxruntime"]
"""


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("identity")
    source = write_function(root / "src", lambda path: identity_model(path, RUN_BY_ORT), MANIFEST)
    with serving(create_app(Runtime.load(build(source, root / "bundle")))) as base_url:
        yield base_url.removeprefix("http://")


@pytest.fixture(scope="module")
def client(url: str) -> Iterator[triton.InferenceServerClient]:
    client = triton.InferenceServerClient(url, connection_timeout=10, network_timeout=30)
    yield client
    client.close()


def every_input(binary: bool) -> list[triton.InferInput]:
    inputs = []
    for datatype in RUN_BY_ORT:
        tensor = triton.InferInput(f"in_{datatype}", list(SAMPLES[datatype].shape), datatype)
        inputs.append(tensor.set_data_from_numpy(SAMPLES[datatype], binary_data=binary))
    return inputs


def expected(datatype: str, binary_output: bool) -> np.ndarray:
    """JSON carries BYTES as text, which the client reads back as str."""
    if datatype == "BYTES" and not binary_output:
        return np.array([[b.decode() for b in row] for row in SAMPLES[datatype]], dtype=object)
    return SAMPLES[datatype]


def test_health_and_server_metadata(client: triton.InferenceServerClient) -> None:
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.is_model_ready("identity")
    assert client.is_model_ready("identity", model_version="2")
    assert not client.is_model_ready("other")
    metadata = client.get_server_metadata()
    assert metadata["name"] == "edgeserve"
    assert "binary_tensor_data" in metadata["extensions"]


@pytest.mark.parametrize("binary_input", [True, False], ids=["binary-in", "json-in"])
@pytest.mark.parametrize("output_mode", ["default", "all-json", "some-binary"])
def test_every_datatype_round_trips_two_rows(
    client: triton.InferenceServerClient, binary_input: bool, output_mode: str
) -> None:
    binary = {
        dt: output_mode == "default" or (output_mode == "some-binary" and i % 2 == 0)
        for i, dt in enumerate(RUN_BY_ORT)
    }
    outputs = None
    if output_mode != "default":  # no outputs named: tritonclient asks for all, binary
        outputs = [
            triton.InferRequestedOutput(f"out_{dt}", binary_data=binary[dt]) for dt in RUN_BY_ORT
        ]
    result = client.infer("identity", every_input(binary_input), outputs=outputs, request_id="r1")
    response = result.get_response()
    assert (response["model_name"], response["model_version"], response["id"]) == (
        "identity",
        "2",
        "r1",
    )
    for datatype in RUN_BY_ORT:
        output = result.get_output(f"out_{datatype}")
        assert output["datatype"] == datatype and output["shape"] == [2, 3]
        assert ("data" not in output) == binary[datatype], datatype
        np.testing.assert_array_equal(
            result.as_numpy(f"out_{datatype}"), expected(datatype, binary[datatype])
        )


def test_only_the_outputs_asked_for_come_back(client: triton.InferenceServerClient) -> None:
    outputs = [
        triton.InferRequestedOutput("out_INT8", binary_data=False),
        triton.InferRequestedOutput("out_FP32"),
    ]
    result = client.infer("identity", every_input(binary=True), outputs=outputs)
    assert [o["name"] for o in result.get_response()["outputs"]] == ["out_INT8", "out_FP32"]
    np.testing.assert_array_equal(result.as_numpy("out_FP32"), SAMPLES["FP32"])
    assert result.as_numpy("out_UINT8") is None


def test_errors_surface_with_our_message_and_status(client: triton.InferenceServerClient) -> None:
    inputs = every_input(binary=True)
    wrong = triton.InferInput("in_FP32", [2, 4], "FP32").set_data_from_numpy(
        np.zeros((2, 4), np.float32)
    )
    with pytest.raises(InferenceServerException) as error:
        client.infer("identity", [wrong if i.name() == "in_FP32" else i for i in inputs])
    assert error.value.status() == "400"
    assert "tensor `in_FP32`" in error.value.message() and "[2, 4]" in error.value.message()
    with pytest.raises(InferenceServerException) as error:
        client.infer("nope", inputs)
    assert (error.value.status(), error.value.message()) == (
        "400",
        "Request for unknown model: 'nope' is not found; this server serves `identity`",
    )
    with pytest.raises(InferenceServerException) as error:
        client.get_model_metadata("identity", model_version="7")
    assert error.value.status() == "404"
    assert (
        client.infer("identity", inputs).as_numpy("out_INT64").tolist() == SAMPLES["INT64"].tolist()
    )


def test_a_request_over_the_body_limit_reads_its_413(tmp_path: Path) -> None:
    """The client sends its whole body before it reads: against `edgeserve serve` it got
    `Connection reset by peer`, the server having read the rest of the body as the next
    request's headers (a 431, closed)."""
    source = write_function(tmp_path, lambda path: identity_model(path, RUN_BY_ORT), MANIFEST)
    rows = (64 << 20) // 12 + 1  # FP32 [N, 3]: past the default 64 MiB, more than a socket holds
    big = triton.InferInput("in_FP32", [rows, 3], "FP32")
    big.set_data_from_numpy(np.zeros((rows, 3), np.float32))
    with running(source) as (url, _):
        client = triton.InferenceServerClient(url.removeprefix("http://"), network_timeout=30)
        with closing(client):
            with pytest.raises(InferenceServerException) as error:
                client.infer("identity", [big])
            assert error.value.status() == "413"
            assert "request body: over the limit of 67108864 bytes" in error.value.message()
            answer = client.infer("identity", every_input(binary=True))  # the client serves on
            assert answer.as_numpy("out_FP32").tolist() == SAMPLES["FP32"].tolist()


def test_model_metadata_config_and_statistics(client: triton.InferenceServerClient) -> None:
    metadata = client.get_model_metadata("identity")
    assert (metadata["name"], metadata["versions"], metadata["platform"]) == (
        "identity",
        ["2"],
        "onnxruntime_onnx",
    )
    assert {t["name"]: (t["datatype"], t["shape"]) for t in metadata["inputs"]}["in_BYTES"] == (
        "BYTES",
        [-1, 3],
    )
    config = client.get_model_config("identity")
    assert config["max_batch_size"] == 8
    types = {t["name"]: (t["data_type"], t["dims"]) for t in config["input"]}
    assert types["in_BYTES"] == ("TYPE_STRING", [3]) and types["in_FP16"] == ("TYPE_FP16", [3])
    client.infer("identity", every_input(binary=True))
    (stats,) = client.get_inference_statistics("identity")["model_stats"]
    assert (stats["name"], stats["version"]) == ("identity", "2")
    assert stats["inference_count"] >= 2 and stats["execution_count"] >= 1
    assert stats["inference_stats"]["success"]["count"] >= 1
    assert any(b["batch_size"] == 2 for b in stats["batch_stats"])


def test_bytes_that_are_not_utf8_are_a_400_for_their_request_alone(url: str) -> None:
    """ONNX Runtime's Python API takes text: such a string is refused at its own request
    (before: a 500, for every request of its batch)."""
    undecodable = np.array([[b"\xff\xfe", b"a", b"b"], [b"c", b"d", b"e"]], dtype=object)

    def request(strings: np.ndarray | None) -> list[triton.InferInput]:
        inputs = every_input(binary=True)
        if strings is None:
            return inputs
        bad = triton.InferInput("in_BYTES", [2, 3], "BYTES").set_data_from_numpy(strings)
        return [bad if i.name() == "in_BYTES" else i for i in inputs]

    async def run() -> list[object]:
        client = triton_aio.InferenceServerClient(url)
        try:
            sent = [None, undecodable, None, None]
            return await asyncio.gather(
                *(client.infer("identity", request(s)) for s in sent), return_exceptions=True
            )
        finally:
            await client.close()

    good, refused, *others = asyncio.run(run())
    assert isinstance(refused, InferenceServerException)
    assert (refused.status(), refused.message()) == (
        "400",
        "tensor `in_BYTES`: element [0, 0] is not UTF-8 (invalid start byte at its byte 0), and "
        "onnxruntime takes UTF-8 text only; send text, or binary data encoded as text (base64)",
    )
    for result in (good, *others):
        assert not isinstance(result, BaseException), result
        np.testing.assert_array_equal(result.as_numpy("out_INT64"), SAMPLES["INT64"])


def test_the_aio_client_with_concurrent_requests(url: str) -> None:
    async def run() -> list[np.ndarray]:
        client = triton_aio.InferenceServerClient(url)
        try:
            assert await client.is_server_ready()
            results = await asyncio.gather(
                *(client.infer("identity", every_input(binary=True)) for _ in range(6))
            )
            return [result.as_numpy("out_FP64") for result in results]
        finally:
            await client.close()

    for values in asyncio.run(run()):
        np.testing.assert_array_equal(values, SAMPLES["FP64"])


def test_gzip_and_deflate_requests(client: triton.InferenceServerClient) -> None:
    result = client.infer(
        "identity", every_input(binary=True), request_compression_algorithm="gzip"
    )
    np.testing.assert_array_equal(result.as_numpy("out_UINT16"), SAMPLES["UINT16"])
    result = client.infer(
        "identity", every_input(binary=True), request_compression_algorithm="deflate"
    )
    np.testing.assert_array_equal(result.as_numpy("out_BOOL"), SAMPLES["BOOL"])


def test_the_repository_index_lists_the_one_function(client: triton.InferenceServerClient) -> None:
    assert client.get_model_repository_index() == [
        {"name": "identity", "version": "2", "state": "READY", "reason": ""}
    ]
    assert "model_repository" in client.get_server_metadata()["extensions"]


def test_model_control_answers_what_a_fixed_function_can_do(
    client: triton.InferenceServerClient,
) -> None:
    client.load_model("identity")  # already loaded: nothing to do, as in Triton's EXPLICIT mode
    refused = {
        "load other": lambda: client.load_model("other"),
        "new config": lambda: client.load_model("identity", config='{"max_batch_size": 2}'),
        "unload": lambda: client.unload_model("identity"),
    }
    for case, call in refused.items():
        with pytest.raises(InferenceServerException) as error:
            call()
        assert error.value.status() == "400", case
        assert "serves one function, `identity`" in error.value.message(), case
        assert "Hint:" in error.value.message(), case
    assert client.is_model_ready("identity")


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_nan_and_infinities_round_trip_as_triton_writes_them(
    client: triton.InferenceServerClient, binary: bool
) -> None:
    """In JSON, Triton reads and writes `NaN`, `Infinity` and `-Infinity` (JSON itself has no
    such numbers); writing null would bring an infinity back as NaN."""
    floats = ("FP16", "FP32", "FP64")
    inputs = [tensor for tensor in every_input(binary) if tensor.datatype() not in floats]
    for datatype in floats:
        values = np.array([[np.nan, np.inf, -np.inf], [1.5, -0.0, 2.0]], DATATYPES[datatype].numpy)
        tensor = triton.InferInput(f"in_{datatype}", [2, 3], datatype)
        inputs.append(tensor.set_data_from_numpy(values, binary_data=binary))
    outputs = [triton.InferRequestedOutput(f"out_{dt}", binary_data=binary) for dt in floats]
    result = client.infer("identity", inputs, outputs=outputs)
    for datatype in ("FP16", "FP32", "FP64"):
        got = result.as_numpy(f"out_{datatype}")
        assert np.isnan(got[0, 0]) and got[0, 1] == np.inf and got[0, 2] == -np.inf, datatype
        np.testing.assert_array_equal(got[1], [1.5, -0.0, 2.0])


@pytest.mark.parametrize("accept", ["application/json", "application/msgpack"])
def test_invoke_answers_nan_and_infinities_as_v2_does(url: str, accept: str) -> None:
    """/invoke JSON wrote them as null, silently (one null for three different values); JSON
    now carries NaN, Infinity and -Infinity as v2 JSON does, msgpack its own floats."""
    rows = {f"in_{dt}": SAMPLES[dt][:1].tolist() for dt in RUN_BY_ORT if dt != "BYTES"}
    rows["in_BYTES"] = [["a", "b", "c"]]
    for datatype in ("FP16", "FP32", "FP64"):
        rows[f"in_{datatype}"] = [[math.nan, math.inf, -math.inf]]
    response = httpx.post(
        f"http://{url}/invoke",
        content=msgpack.packb(rows),
        headers={"content-type": "application/msgpack", "accept": accept},
    )
    assert response.status_code == 200, response.text
    if accept == "application/json":
        assert b'"out_FP32":[[NaN,Infinity,-Infinity]]' in response.content
        answer = json.loads(response.content)
    else:
        answer = msgpack.unpackb(response.content)
    for datatype in ("FP16", "FP32", "FP64"):
        nan, inf, minus_inf = answer[f"out_{datatype}"][0]
        assert math.isnan(nan) and inf == math.inf and minus_inf == -math.inf, datatype


def test_a_timeout_of_zero_means_none_as_in_triton(client: triton.InferenceServerClient) -> None:
    """tritonclient sends `timeout` whenever it is given one, and Triton reads 0 as "no
    timeout" (TRITONSERVER_InferenceRequestSetTimeoutMicroseconds); it was a 400 here."""
    result = client.infer("identity", every_input(binary=True), timeout=0)
    np.testing.assert_array_equal(result.as_numpy("out_INT64"), SAMPLES["INT64"])
    with pytest.raises(InferenceServerException) as error:
        client.infer("identity", every_input(binary=True), timeout=-1)
    assert error.value.status() == "400"
    assert "parameters.timeout: expected a non-negative integer of microseconds (0: none)" in str(
        error.value.message()
    )


@pytest.mark.parametrize("parameter", ["timeout", "priority"])
def test_an_integer_past_64_bits_is_named_as_such(
    client: triton.InferenceServerClient, parameter: str
) -> None:
    """It was echoed back as the float JSON parsing made of it (1.8446744073709552e+19)."""
    with pytest.raises(InferenceServerException) as error:
        client.infer("identity", every_input(binary=True), **{parameter: 2**64})
    assert error.value.status() == "400"
    message = str(error.value.message())
    assert f"parameters.{parameter}: expected a non-negative integer" in message
    assert message.endswith("got a number past 64 bits")
