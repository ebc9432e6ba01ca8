"""KServe v2 over gRPC: the stock tritonclient.grpc (and hand-built messages where tritonclient
refuses to build them) against `edgeserve serve --grpc-port 0` on 127.0.0.1. How the server
runs it (auth, TLS, --workers, the drain): test_grpc_serving.py.

The model is one ONNX Identity per v2 datatype but BF16 (tests/test_tritonclient.py says why),
run by ONNX Runtime on CPU.
"""

from __future__ import annotations

import functools
import queue
import re
import time
from collections.abc import Callable, Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import onnx
import pytest
import tritonclient.grpc as triton
from tritonclient.grpc import service_pb2
from tritonclient.utils import InferenceServerException

from edgeserve import cudamemory
from edgeserve.grpc.service import IN_FLIGHT
from tests.models import identity_model, write_function
from tests.raw_http2 import unread_unary_calls
from tests.server import Server, running
from tests.test_tritonclient import MANIFEST, RUN_BY_ORT
from tests.test_v2_codec import SAMPLES

INVALID, NOT_FOUND = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND
GRPC_LISTENING = re.compile(r"(?:gRPC serving on grpcs?://|gRPC on )([\d.]+:\d+)")


def grpc_url(server: Server, timeout_s: float = 30.0) -> str:
    """The gRPC address the server printed (`host:port`)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for line in list(server.output):
            if match := GRPC_LISTENING.search(line):
                return match.group(1)
        time.sleep(0.05)
    raise RuntimeError("no gRPC address printed:\n" + "".join(server.output))


def identity_function(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A function source folder of the Identity model (every datatype but BF16)."""
    root = tmp_path_factory.mktemp("identity")
    return write_function(root / "src", lambda path: identity_model(path, RUN_BY_ORT), MANIFEST)


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return identity_function(tmp_path_factory)


@pytest.fixture(scope="module")
def url(source: Path) -> Iterator[str]:
    with running(source, "--grpc-port", "0") as (_, server):
        yield grpc_url(server)


@pytest.fixture(scope="module")
def client(url: str) -> Iterator[triton.InferenceServerClient]:
    client = triton.InferenceServerClient(url)
    yield client
    client.close()


def every_input() -> list[triton.InferInput]:
    inputs = []
    for datatype in RUN_BY_ORT:
        tensor = triton.InferInput(f"in_{datatype}", list(SAMPLES[datatype].shape), datatype)
        inputs.append(tensor.set_data_from_numpy(SAMPLES[datatype]))
    return inputs


def test_health_metadata_and_config(client: triton.InferenceServerClient) -> None:
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.is_model_ready("identity")
    assert client.is_model_ready("identity", model_version="2")
    # as Triton's: a model or version not served is not ready, no error (it raised NOT_FOUND)
    assert not client.is_model_ready("nope")
    assert not client.is_model_ready("identity", model_version="9")
    server = client.get_server_metadata(as_json=True)
    assert server["name"] == "edgeserve"
    assert "system_shared_memory" in server["extensions"]
    metadata = client.get_model_metadata("identity", as_json=True)
    assert metadata["versions"] == ["2"]
    inputs = {entry["name"]: entry for entry in metadata["inputs"]}
    assert inputs["in_FP32"] == {"name": "in_FP32", "datatype": "FP32", "shape": ["-1", "3"]}
    config = client.get_model_config("identity").config
    assert config.name == "identity"
    assert config.max_batch_size == 8
    assert config.dynamic_batching.max_queue_delay_microseconds == 1000
    assert [d for d in config.input[0].dims] == [3]
    assert config.parameters["function_version"].string_value == "2"
    index = client.get_model_repository_index(as_json=True)
    assert index["models"] == [{"name": "identity", "version": "2", "state": "READY"}]


def test_infer_every_datatype_raw(client: triton.InferenceServerClient) -> None:
    result = client.infer("identity", every_input(), request_id="req-7")
    assert result.get_response().id == "req-7"
    for datatype in RUN_BY_ORT:
        np.testing.assert_array_equal(result.as_numpy(f"out_{datatype}"), SAMPLES[datatype])


def typed_request() -> service_pb2.ModelInferRequest:
    """Every input but FP16 (which has no typed field) in its typed `contents`, which
    tritonclient never sends: built by hand."""
    request = service_pb2.ModelInferRequest(model_name="identity")
    for datatype in RUN_BY_ORT:
        if datatype != "FP16":
            tensor = request.inputs.add(name=f"in_{datatype}", datatype=datatype, shape=[2, 3])
            field = triton_contents(datatype)
            getattr(tensor.contents, field).extend(SAMPLES[datatype].reshape(-1).tolist())
    return request


def test_infer_typed_contents(url: str, client: triton.InferenceServerClient) -> None:
    """FP16 beside typed inputs travels in shared memory, as Triton allows (not raw)."""
    import tritonclient.utils.shared_memory as shm

    request = typed_request()
    fp16 = request.inputs.add(name="in_FP16", datatype="FP16", shape=[2, 3])
    size = SAMPLES["FP16"].nbytes
    fp16.parameters["shared_memory_region"].string_param = "typed_fp16"
    fp16.parameters["shared_memory_byte_size"].int64_param = size
    handle = shm.create_shared_memory_region("typed_fp16", "/edgeserve_typed_fp16", size)
    try:
        shm.set_shared_memory_region(handle, [SAMPLES["FP16"]])
        client.register_system_shared_memory("typed_fp16", "/edgeserve_typed_fp16", size)
        response = call(url, "ModelInfer", request, service_pb2.ModelInferResponse)
    finally:
        client.unregister_system_shared_memory("typed_fp16")
        shm.destroy_shared_memory_region(handle)
    outputs = [output.name for output in response.outputs]
    raw = dict(zip(outputs, response.raw_output_contents, strict=True))
    for datatype in ("INT8", "UINT16", "FP64", "BOOL", "UINT64"):
        got = np.frombuffer(raw[f"out_{datatype}"], SAMPLES[datatype].dtype).reshape(2, 3)
        np.testing.assert_array_equal(got, SAMPLES[datatype])


def triton_contents(datatype: str) -> str:
    if datatype in ("INT8", "INT16", "INT32"):
        return "int_contents"
    if datatype in ("UINT8", "UINT16", "UINT32"):
        return "uint_contents"
    return f"{datatype.lower()}_contents"


def call(url: str, method: str, request: object, response_type: type) -> object:
    """One unary call of `inference.GRPCInferenceService`, with tritonclient's messages."""
    with grpc.insecure_channel(url) as channel:
        rpc = channel.unary_unary(
            f"/inference.GRPCInferenceService/{method}",
            request_serializer=lambda message: message.SerializeToString(),
            response_deserializer=response_type.FromString,
        )
        return rpc(request, timeout=30)


def raw_call(url: str, method: str, data: bytes) -> grpc.RpcError:
    """A call of raw bytes that must fail: its error."""
    with grpc.insecure_channel(url) as channel:
        rpc = channel.unary_unary(f"/inference.GRPCInferenceService/{method}")
        with pytest.raises(grpc.RpcError) as failed:
            rpc(data, timeout=30)
    return failed.value


def infer_request(**changes: object) -> service_pb2.ModelInferRequest:
    """A request for `in_FP32` alone... which the model refuses unless every input is sent:
    the malformed cases below are refused before the model is asked."""
    request = service_pb2.ModelInferRequest(model_name="identity")
    request.inputs.add(name="in_FP32", datatype="FP32", shape=[1, 3])
    request.raw_input_contents.append(np.zeros(3, np.float32).tobytes())
    for key, value in changes.items():
        setattr(request, key, value)
    return request


def refused(url: str, request: service_pb2.ModelInferRequest) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as failed:
        call(url, "ModelInfer", request, service_pb2.ModelInferResponse)
    return failed.value


@pytest.mark.parametrize(
    ("change", "code", "words"),
    [
        (
            "raw_size",
            INVALID,
            "FP32 [1, 3] needs 12 bytes, its data has 8",
        ),
        ("raw_and_typed", INVALID, "has typed `contents` in a request that also has raw_"),
        ("datatype", INVALID, "unknown datatype 'FP33'"),
        ("model", INVALID, "Request for unknown model: 'nope' is not found"),
        ("version", NOT_FOUND, "Request for unknown model: 'identity' version 9 is not found"),
        ("unknown_input", INVALID, "unknown ['in_nope']"),
        ("negative", INVALID, "`shape` must be a list of non-negative"),
        ("extra_raw", INVALID, "raw_input_contents holds 2 tensors, but 1"),
        ("wrong_field", INVALID, "FP32 data travels in contents.fp32"),
        ("out_of_range", INVALID, "value 300 in contents.int_contents"),
        # named before its data is read (it was "INT32 data travels in contents.int_contents")
        ("declared_int32", INVALID, "tensor `in_FP32`: expected [-1, 3] FP32, got [1, 3] INT32"),
    ],
)
def test_malformed_requests(
    url: str, client: triton.InferenceServerClient, change: str, code: grpc.StatusCode, words: str
) -> None:
    request = infer_request()
    tensor = request.inputs[0]
    if change == "raw_size":
        request.raw_input_contents[0] = b"\0" * 8
    elif change == "raw_and_typed":
        tensor.contents.fp32_contents.extend([1, 2, 3])
    elif change == "datatype":
        tensor.datatype = "FP33"
    elif change == "model":
        request.model_name = "nope"
    elif change == "version":
        request.model_version = "9"
    elif change == "unknown_input":
        tensor.name = "in_nope"
    elif change == "negative":
        del tensor.shape[:]
        tensor.shape.extend([1, -3])
    elif change == "extra_raw":
        request.raw_input_contents.append(b"")
    elif change == "declared_int32":
        del request.raw_input_contents[:]
        tensor.datatype = "INT32"
        tensor.contents.fp32_contents.extend([0.5, 1, 2])
    elif change in ("wrong_field", "out_of_range"):
        del request.raw_input_contents[:]
        if change == "out_of_range":
            tensor.datatype, tensor.name = "INT8", "in_INT8"
        tensor.contents.int_contents.extend([1, 2, 300])
    error = refused(url, request)
    assert error.code() == code, error.details()
    assert words in error.details()
    assert client.is_server_live()  # and the server stays up


def test_typed_contents_beside_raw_ones_are_refused_naming_the_typed_input(url: str) -> None:
    """Triton's rule: once a request has raw_input_contents, no input has typed `contents`.
    Before, an input carrying both shifted the raw entries, and the error named the next input,
    sent right; a typed input beside raw ones was taken."""
    both = infer_request()
    both.inputs[0].contents.fp32_contents.extend([1, 2, 3])
    both.inputs.add(name="in_FP16", datatype="FP16", shape=[1, 3])
    both.raw_input_contents.append(np.zeros(3, np.float16).tobytes())
    beside = typed_request()
    beside.inputs.add(name="in_FP16", datatype="FP16", shape=[2, 3])
    beside.raw_input_contents.append(SAMPLES["FP16"].tobytes())
    for request in (both, beside):
        error = refused(url, request)
        assert error.code() == INVALID, error.details()
        first_typed = next(tensor.name for tensor in request.inputs if tensor.HasField("contents"))
        assert error.details() == (
            f"tensor `{first_typed}`: has typed `contents` in a request that also has "
            "raw_input_contents; expected every input's data in one of them, not both (as "
            "Triton). Hint: FP16 and BF16 travel raw only, so send every input raw beside them"
        )


def test_not_protobuf_is_invalid_argument(url: str) -> None:
    error = raw_call(url, "ModelInfer", b"\xff\xff\xff")
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "not its protobuf message" in error.details()


def test_errors_through_tritonclient(client: triton.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException) as missing:
        client.get_model_metadata("nope")
    assert missing.value.status() == "StatusCode.INVALID_ARGUMENT"  # Triton's code and words
    assert missing.value.message() == (
        "Request for unknown model: 'nope' is not found; this server serves `identity`"
    )
    with pytest.raises(InferenceServerException) as unload:
        client.unload_model("identity")
    assert "cannot unload `identity`" in unload.value.message()
    client.load_model("identity")  # the served model, as it is: nothing to do


def test_statistics_count_grpc_requests(client: triton.InferenceServerClient) -> None:
    before = client.get_inference_statistics("identity").model_stats[0].inference_count
    client.infer("identity", every_input())
    stats = client.get_inference_statistics("identity", "2").model_stats[0]
    assert stats.inference_count == before + 2  # two rows
    assert stats.inference_stats.success.count >= 1


def test_requested_outputs_and_classification(client: triton.InferenceServerClient) -> None:
    outputs = [
        triton.InferRequestedOutput("out_FP64"),
        triton.InferRequestedOutput("out_FP32", class_count=2),
    ]
    result = client.infer("identity", every_input(), outputs=outputs)
    assert [o.name for o in result.get_response().outputs] == ["out_FP64", "out_FP32"]
    top = result.as_numpy("out_FP32")
    assert top[0][0].endswith(b".000000:2")  # 3.4e38, the highest of row 0
    assert top[0][1] == b"1.500000:0"


def test_streaming_answers_each_request(client: triton.InferenceServerClient) -> None:
    answers: queue.Queue[tuple[object, object]] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        client.async_stream_infer("identity", every_input(), request_id="good-1")
        bad = triton.InferInput("in_nope", [1, 3], "FP32")
        bad.set_data_from_numpy(np.zeros((1, 3), np.float32))
        client.async_stream_infer("identity", [bad], request_id="bad")
        client.async_stream_infer("identity", every_input(), request_id="good-2")
        got = [answers.get(timeout=30) for _ in range(3)]
    finally:
        client.stop_stream()
    ids = sorted(result.get_response().id for result, error in got if error is None)
    assert ids == ["good-1", "good-2"]
    errors = [error for _, error in got if error is not None]
    assert len(errors) == 1 and "unknown ['in_nope']" in str(errors[0])


def test_a_stream_whose_answers_are_not_read_stops_being_read(tmp_path: Path) -> None:
    """A client that sent on and never read its answers made the server read and run every
    request, and hold every answer (600 of 0.8 MB: 480 MB, growing as long as it sent). The
    stream now reads no further than IN_FLIGHT requests ahead of the answers written
    (plus the few answers the client's receive window takes), and its client leaving ends it
    without a word in the log."""
    width = 4096  # 16 KB a request: 3,000 of them are more than any window holds
    model = functools.partial(identity_model, datatypes=("FP32",), row=width)
    source = write_function(tmp_path / "src", model, MANIFEST)
    request = service_pb2.ModelInferRequest(model_name="identity")
    request.inputs.add(name="in_FP32", datatype="FP32", shape=[1, width])
    request.raw_input_contents.append(np.zeros(width, np.float32).tobytes())
    with running(source, "--grpc-port", "0") as (_, server):
        url = grpc_url(server)
        with grpc.insecure_channel(url) as channel, triton.InferenceServerClient(url) as client:
            stream = channel.stream_stream(
                "/inference.GRPCInferenceService/ModelStreamInfer",
                request_serializer=lambda message: message.SerializeToString(),
            )
            answers = stream(iter([request] * 3000), timeout=60)  # never read
            ran = settled(lambda: client.get_inference_statistics("identity").model_stats[0])
            answers.cancel()  # the client leaves, its answers unread
            assert client.is_server_live()
        time.sleep(1)
        said = "".join(server.output)
    assert IN_FLIGHT <= ran.inference_count < 2 * IN_FLIGHT
    assert "Traceback" not in said  # it was grpcio's ERROR: ExecuteBatchError, with its trace


def test_unary_calls_whose_answers_are_not_read_stop_at_the_connections_bound(
    tmp_path: Path,
) -> None:
    """A raw HTTP/2 client opening unary calls with 0.8 MB answers and never reading: the
    server ran 1,805 of 2,000 and held 4.7 GB. A connection now holds at most IN_FLIGHT calls
    open (MAX_CONCURRENT_STREAMS); the server stays up for everyone else."""
    source = write_function(tmp_path / "src", _tile_model, TILE_MANIFEST)
    request = service_pb2.ModelInferRequest(model_name="tile")
    request.inputs.add(name="x", datatype="FP32", shape=[1, 4])
    request.raw_input_contents.append(np.zeros(4, np.float32).tobytes())
    with running(source, "--grpc-port", "0") as (_, server):
        url = grpc_url(server)
        host, port = url.rsplit(":", 1)
        method = "/inference.GRPCInferenceService/ModelInfer"
        with (
            closing(unread_unary_calls(host, int(port), method, request.SerializeToString(), 1000)),
            triton.InferenceServerClient(url) as client,
        ):
            ran = settled(lambda: client.get_inference_statistics("tile").model_stats[0])
            assert ran.inference_count == IN_FLIGHT
            assert client.infer("tile", [_tile_input()]).as_numpy("y").shape == (1, TILE * 4)


def test_more_calls_than_a_connection_holds_open_wait_their_turn(
    client: triton.InferenceServerClient,
) -> None:
    """Past IN_FLIGHT calls on one channel, grpcio queues the rest: all are answered."""
    answers: queue.Queue[tuple[object, object]] = queue.Queue()
    count = IN_FLIGHT + 100
    for at in range(count):
        client.async_infer(
            "identity",
            every_input(),
            lambda result, error: answers.put((result, error)),
            request_id=str(at),
        )
    got = [answers.get(timeout=60) for _ in range(count)]
    assert [str(error) for _, error in got if error is not None] == []
    assert sorted(int(result.get_response().id) for result, _ in got) == list(range(count))


TILE = 200_000  # 0.8 MB of FP32 out for 16 bytes in
TILE_MANIFEST = """
[function]
name = "tile"
[batching]
max_batch_size = 8
max_queue_delay_ms = 1
[backend]
prefer = ["onnxruntime"]
"""


def _tile_model(path: Path) -> None:
    """`y` = `x` [N, 4] repeated TILE times along its row."""
    repeats = onnx.helper.make_tensor("repeats", onnx.TensorProto.INT64, [2], [1, TILE])
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Tile", ["x", "repeats"], ["y"])],
        "tile",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", 4])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["N", 4 * TILE])],
        [repeats],
    )
    onnx.save(
        onnx.helper.make_model(
            graph, opset_imports=[onnx.helper.make_opsetid("", 17)], ir_version=8
        ),
        path,
    )


def _tile_input() -> triton.InferInput:
    return triton.InferInput("x", [1, 4], "FP32").set_data_from_numpy(np.ones((1, 4), np.float32))


def settled(read: Callable[[], Any], quiet_s: float = 1.5, timeout_s: float = 60) -> Any:
    """`read()`'s statistics once their inference count has not moved for `quiet_s`."""
    deadline = time.monotonic() + timeout_s
    last, since = read(), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.25)
        now = read()
        if now.inference_count != last.inference_count:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet_s and now.inference_count:
            return now
    raise AssertionError(f"still running after {timeout_s} s: {last.inference_count}")


def test_system_shared_memory(client: triton.InferenceServerClient) -> None:
    import tritonclient.utils.shared_memory as shm

    data = SAMPLES["FP32"]
    size = data.nbytes
    handle = shm.create_shared_memory_region("grpc_io", "/edgeserve_grpc_io", size * 2)
    try:
        shm.set_shared_memory_region(handle, [data])
        client.register_system_shared_memory("grpc_io", "/edgeserve_grpc_io", size * 2)
        status = client.get_system_shared_memory_status(as_json=True)
        assert status["regions"]["grpc_io"]["byte_size"] == str(size * 2)
        inputs = every_input()
        fp32 = next(i for i in inputs if i.name() == "in_FP32")
        fp32.set_shared_memory("grpc_io", size)
        output = triton.InferRequestedOutput("out_FP32")
        output.set_shared_memory("grpc_io", size, offset=size)
        result = client.infer("identity", inputs, outputs=[output])
        assert result.get_output("out_FP32").datatype == "FP32"
        back = shm.get_contents_as_numpy(handle, np.float32, [2, 3], offset=size)
        np.testing.assert_array_equal(back, data)
    finally:
        client.unregister_system_shared_memory()
        shm.destroy_shared_memory_region(handle)
    assert client.get_system_shared_memory_status(as_json=True) == {}


def test_cuda_shared_memory_status_without_gpu(client: triton.InferenceServerClient) -> None:
    assert client.get_cuda_shared_memory_status(as_json=True) == {}
    client.unregister_cuda_shared_memory()  # perf_analyzer cleans up both kinds


@pytest.mark.skipif(cudamemory.available(), reason="this machine serves CUDA regions")
def test_cuda_shared_memory_without_gpu_points_to_the_system_rpc(
    client: triton.InferenceServerClient,
) -> None:
    """A gRPC caller is pointed to the RPC it would use, not to HTTP's path."""
    with pytest.raises(InferenceServerException) as refused_call:
        client.register_cuda_shared_memory("gpu_io", b"\0" * 64, 0, 1024)
    said = refused_call.value.message()
    assert refused_call.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert said == (
        "CUDA shared memory region `gpu_io`: not served here (no GPU, or no cuda-python, in "
        "this server). Hint: use system shared memory (the SystemSharedMemoryRegister RPC)"
    )


def test_message_size_follows_the_request_limit(url: str) -> None:
    """gRPC's 4 MB default would refuse a plain image batch: 5 MB passes the size check (and
    is refused by the model's shape), 80 MB is over the function's max_body_mb (64)."""
    for size, code in ((5 << 20, grpc.StatusCode.INVALID_ARGUMENT), (80 << 20, None)):
        request = infer_request()
        request.raw_input_contents[0] = b"\0" * size
        error = refused(url, request)
        expected = code or grpc.StatusCode.RESOURCE_EXHAUSTED
        assert error.code() == expected, error.details()
