"""Clients as users run them, on what they send that the other tests do not: perf_analyzer's
default random data on a model with a BOOL input, and tritonclient's sequence parameters.
One `edgeserve serve --grpc-port 0` of the Identity model of every datatype serves them all.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import closing

import httpx
import orjson
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from tritonclient.utils import InferenceServerException

from tests.server import running
from tests.test_grpc import every_input, grpc_url, identity_function
from tests.test_perf_analyzer import run_perf_analyzer
from tests.test_tritonclient import RUN_BY_ORT
from tests.test_tritonclient import every_input as http_inputs
from tests.test_v2_codec import SAMPLES

STATELESS = "this function serves stateless requests"


@pytest.fixture(scope="module")
def urls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """(HTTP base URL, gRPC address) of one server."""
    with running(identity_function(tmp_path_factory), "--grpc-port", "0") as (url, server):
        yield url, grpc_url(server)


@pytest.mark.parametrize("protocol", [("-i", "http"), ("-i", "grpc", "--streaming")])
def test_perf_analyzer_random_data_fills_bool_tensors(
    urls: tuple[str, str], protocol: tuple[str, ...]
) -> None:
    """perf_analyzer's default data is random bytes in every tensor, BOOL included: each run
    failed at once on "BOOL data: byte 0 is 103", where Triton runs it."""
    url = urls[1] if "grpc" in protocol else urls[0]
    output = run_perf_analyzer(url, *protocol, model="identity")
    assert "Throughput:" in output


def test_bool_bytes_other_than_0_reach_the_model_as_1(urls: tuple[str, str]) -> None:
    """A BOOL tensor's binary bytes of 2 and 255 are true, and the model sees 1 for them, as it
    does for `True` (numpy viewed them as bools holding 2 and 255)."""
    sent = b"\x00\x02\xff\x01\x00\x07"
    inputs = [_json_input(datatype) for datatype in RUN_BY_ORT if datatype != "BOOL"]
    bools = {"name": "in_BOOL", "datatype": "BOOL", "shape": [2, 3]}
    inputs.append(bools | {"parameters": {"binary_data_size": len(sent)}})
    outputs = [{"name": "out_BOOL", "parameters": {"binary_data": True}}]
    header = orjson.dumps({"inputs": inputs, "outputs": outputs})
    answer = httpx.post(
        f"{urls[0]}/v2/models/identity/infer",
        content=header + sent,
        headers={"Inference-Header-Content-Length": str(len(header))},
    )
    assert answer.status_code == 200, answer.text
    length = int(answer.headers["Inference-Header-Content-Length"])
    assert answer.content[length:] == b"\x00\x01\x01\x01\x00\x01"


def _json_input(datatype: str) -> dict[str, object]:
    data = SAMPLES[datatype]
    values = [item.decode() for item in data.flat] if datatype == "BYTES" else data.tolist()
    return {
        "name": f"in_{datatype}",
        "datatype": datatype,
        "shape": list(data.shape),
        "data": values,
    }


@pytest.mark.parametrize(
    "sequence", [{"sequence_id": 7}, {"sequence_id": "s", "sequence_end": True}]
)
def test_a_sequence_is_refused_as_stateless(
    urls: tuple[str, str], sequence: dict[str, object]
) -> None:
    """tritonclient's sequence_id (with its start and end flags) asks for state kept between
    requests, which only a sequence batcher keeps: the requests ran as unrelated ones and
    answered 200, so a client streaming audio or tokens never learnt that nothing was kept."""
    with closing(triton_http.InferenceServerClient(urls[0].removeprefix("http://"))) as http:
        with pytest.raises(InferenceServerException) as over_http:
            http.infer("identity", http_inputs(True), **sequence)  # type: ignore[arg-type]
        assert over_http.value.status() == "400" and STATELESS in str(over_http.value)
        http.infer("identity", http_inputs(True), sequence_id=0)  # 0: no sequence
    with closing(triton_grpc.InferenceServerClient(urls[1])) as grpc:
        with pytest.raises(InferenceServerException) as over_grpc:
            grpc.infer("identity", every_input(), **sequence)  # type: ignore[arg-type]
        assert over_grpc.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert STATELESS in str(over_grpc.value)
