"""The HTTP layer over a real Runtime (ONNX Runtime on CPU), served by uvicorn on 127.0.0.1."""

from __future__ import annotations

import asyncio
import gzip
import logging
import socket
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import msgpack
import numpy as np
import onnxruntime as ort
import orjson
import pytest

from edgeserve.builder import build
from edgeserve.bundle import Bundle
from edgeserve.http import create_app
from edgeserve.http.invoke import pack_array
from edgeserve.runtime import Runtime
from tests import rawhttp
from tests.models import mlp_model, write_function
from tests.threaded_server import serving

LIMIT = 64 * 1024
MSGPACK = "application/msgpack"
MLP = """
[function]
name = "mlp"
version = "3"
[batching]
max_batch_size = 8
preferred_batch_sizes = [4]
max_queue_delay_ms = 1
[backend]
prefer = ["onnxruntime"]
"""
HANDLER = """
import numpy as np

def preprocess(payload, ctx):
    ctx.state["kind"] = type(payload).__name__
    if isinstance(payload, bytes):  # raw body: its first 16 bytes are one row
        return [{"x": np.frombuffer(payload[:16], dtype=np.uint8).astype(np.float32)}]
    ctx.state["unserializable"] = payload.get("unserializable", False)
    if payload.get("crash"):
        raise RuntimeError("a fault inside the handler")
    return [{"x": np.asarray(row, dtype=np.float32)} for row in payload["rows"]]

def postprocess(items, ctx):
    if ctx.state.get("unserializable"):
        return {"a set": {1, 2}}
    y = np.stack([item["y"] for item in items])
    return {"kind": ctx.state["kind"], "y": y, "first": y[0, 0], "best": y.argmax(axis=1)}
"""


@pytest.fixture(scope="module")
def mlp_bundle(tmp_path_factory: pytest.TempPathFactory) -> Bundle:
    source = write_function(tmp_path_factory.mktemp("src") / "mlp", mlp_model, MLP)
    return build(source, tmp_path_factory.mktemp("bundle") / "mlp")


@pytest.fixture(scope="module")
def handler_bundle(tmp_path_factory: pytest.TempPathFactory) -> Bundle:
    source = write_function(
        tmp_path_factory.mktemp("src") / "mlp",
        mlp_model,
        MLP + '[handler]\nmodule = "handler"\n',
        HANDLER,
    )
    return build(source, tmp_path_factory.mktemp("bundle") / "mlp")


@contextmanager
def client_of(bundle: Bundle, **options: int) -> Iterator[httpx.Client]:
    with (
        serving(create_app(Runtime.load(bundle), **options)) as url,
        httpx.Client(base_url=url, timeout=30) as client,
    ):
        yield client


@pytest.fixture(scope="module")
def client(mlp_bundle: Bundle) -> Iterator[httpx.Client]:
    with client_of(mlp_bundle, max_body_bytes=LIMIT) as client:
        yield client


def reference(bundle: Bundle, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(bundle.model_path), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def rows(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, 16)).astype(np.float32)


def json_request(x: np.ndarray, **extra: object) -> dict:
    return {
        "inputs": [
            {"name": "x", "datatype": "FP32", "shape": list(x.shape), "data": x.ravel().tolist()}
        ],
        **extra,
    }


def test_health_and_server_metadata(client: httpx.Client) -> None:
    assert client.get("/v2/health/live").status_code == 200
    assert client.get("/v2/health/ready").status_code == 200
    assert client.get("/v2/models/mlp/ready").status_code == 200
    assert client.get("/v2/models/mlp/versions/3/ready").status_code == 200
    assert client.get("/v2/models/mlp/versions/03/ready").status_code == 200  # Triton reads 3
    metadata = client.get("/v2").json()
    assert metadata["name"] == "edgeserve"
    assert metadata["extensions"] == [
        "binary_tensor_data",
        "classification",
        "logging",
        "model_configuration",
        "model_repository",
        "statistics",
        "system_shared_memory",
    ]


def test_not_ready_until_the_lifespan_started_the_runtime(mlp_bundle: Bundle) -> None:
    async def probe() -> tuple[httpx.Response, httpx.Response]:
        transport = httpx.ASGITransport(create_app(Runtime.load(mlp_bundle)))  # runs no lifespan
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return await client.get("/v2/health/ready"), await client.get("/v2/health/live")

    ready, live = asyncio.run(probe())
    assert ready.status_code == 503
    assert ready.headers["retry-after"] == "1"
    assert "`mlp` is not ready" in ready.json()["error"]
    assert live.status_code == 200


def test_model_metadata_and_config_in_triton_shapes(client: httpx.Client) -> None:
    metadata = {
        "name": "mlp",
        "versions": ["3"],
        "platform": "onnxruntime_onnx",
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 16]}],
        "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 4]}],
    }
    assert client.get("/v2/models/mlp").json() == metadata
    assert client.get("/v2/models/mlp/versions/3").json() == metadata
    config = client.get("/v2/models/mlp/config").json()
    assert config["max_batch_size"] == 8
    assert (config["platform"], config["backend"]) == ("onnxruntime_onnx", "onnxruntime")
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["input"]] == [
        ("x", "TYPE_FP32", [16])
    ]
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["output"]] == [
        ("y", "TYPE_FP32", [4])
    ]
    assert config["dynamic_batching"]["preferred_batch_size"] == [4]
    assert config["dynamic_batching"]["max_queue_delay_microseconds"] == 1000
    policy = config["dynamic_batching"]["default_queue_policy"]
    assert policy["allow_timeout_override"] is True  # a request's `timeout` is honoured
    assert config["instance_group"][0]["kind"] == "KIND_CPU"


def test_infer_json_matches_onnxruntime_and_echoes_the_id(
    client: httpx.Client, mlp_bundle: Bundle
) -> None:
    x = rows(3)
    response = client.post("/v2/models/mlp/infer", json=json_request(x, id="abc"))
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert (body["model_name"], body["model_version"], body["id"]) == ("mlp", "3", "abc")
    (output,) = body["outputs"]
    assert (output["name"], output["datatype"], output["shape"]) == ("y", "FP32", [3, 4])
    np.testing.assert_allclose(
        np.array(output["data"]).reshape(3, 4), reference(mlp_bundle, x), rtol=1e-5, atol=1e-6
    )


def binary_request(x: np.ndarray, binary_output: bool) -> tuple[bytes, dict[str, str]]:
    header = orjson.dumps(
        {
            "inputs": [
                {
                    "name": "x",
                    "datatype": "FP32",
                    "shape": list(x.shape),
                    "parameters": {"binary_data_size": x.nbytes},
                }
            ],
            "outputs": [{"name": "y", "parameters": {"binary_data": binary_output}}],
        }
    )
    return header + x.tobytes(), {"Inference-Header-Content-Length": str(len(header))}


def test_infer_binary_in_and_out(client: httpx.Client, mlp_bundle: Bundle) -> None:
    x = rows(5, seed=1)
    body, headers = binary_request(x, binary_output=True)
    response = client.post("/v2/models/mlp/versions/03/infer", content=body, headers=headers)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/octet-stream"
    length = int(response.headers["inference-header-content-length"])
    header = orjson.loads(response.content[:length])
    assert header["outputs"][0]["parameters"] == {"binary_data_size": 5 * 4 * 4}
    y = np.frombuffer(response.content[length:], dtype="<f4").reshape(5, 4)
    np.testing.assert_allclose(y, reference(mlp_bundle, x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("encoding", "compress"), [("gzip", gzip.compress), ("deflate", zlib.compress)]
)
def test_compressed_request_bodies(
    client: httpx.Client, mlp_bundle: Bundle, encoding: str, compress
) -> None:
    x = rows(2, seed=2)
    body, headers = binary_request(x, binary_output=False)
    response = client.post(
        "/v2/models/mlp/infer",
        content=compress(body),
        headers={**headers, "Content-Encoding": encoding},
    )
    assert response.status_code == 200, response.text
    data = np.array(response.json()["outputs"][0]["data"], dtype=np.float32).reshape(2, 4)
    np.testing.assert_allclose(data, reference(mlp_bundle, x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("coding", "compress", "status"),
    [("gzip, chunked", gzip.compress, 200), ("deflate, chunked", zlib.compress, 200),
     ("br, chunked", gzip.compress, 400)],
)  # fmt: skip
def test_a_transfer_coding_before_chunked_is_undone_or_named(
    client: httpx.Client, mlp_bundle: Bundle, coding: str, compress, status: int
) -> None:
    """`Transfer-Encoding: gzip, chunked` (RFC 9112): uvicorn undoes the chunks, the server
    the gzip; a coding it cannot undo is named, not handed to the model as its bytes."""
    x = rows(2, seed=3)
    body, headers = binary_request(x, binary_output=False)
    data = compress(body)
    head = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
    raw = (
        (
            f"POST /v2/models/mlp/infer HTTP/1.1\r\nhost: t\r\nconnection: close\r\n{head}"
            f"transfer-encoding: {coding}\r\n\r\n{len(data):x}\r\n"
        ).encode("latin-1")
        + data
        + b"\r\n0\r\n\r\n"
    )
    sock = rawhttp.connect(str(client.base_url).rstrip("/"))
    sock.sendall(raw)
    answer, _, payload = rawhttp.parse(rawhttp.read_all(sock))
    sock.close()
    assert answer == status, payload
    if status == 200:
        out = np.array(orjson.loads(payload)["outputs"][0]["data"], dtype=np.float32)
        np.testing.assert_allclose(
            out.reshape(2, 4), reference(mlp_bundle, x), rtol=1e-5, atol=1e-6
        )
    else:
        assert "Transfer-Encoding 'br' is not supported" in orjson.loads(payload)["error"]
    assert client.post("/v2/models/mlp/infer", json=json_request(rows(1))).status_code == 200


def chunks(total: int) -> Iterator[bytes]:
    for _ in range(total // 4096):
        yield b"\0" * 4096


@pytest.mark.parametrize(
    ("content", "headers"),
    [
        (b"[" + b"0," * LIMIT + b"0]", {}),  # declared Content-Length: refused before reading
        (chunks(4 * LIMIT), {}),  # chunked, no length: refused while streaming
        (gzip.compress(b" " * (4 * LIMIT)), {"Content-Encoding": "gzip"}),  # small gzip, big body
    ],
    ids=["content-length", "chunked", "gzip-bomb"],
)
def test_body_over_the_limit_is_413_and_the_server_goes_on(
    client: httpx.Client, content, headers: dict
) -> None:
    response = client.post("/v2/models/mlp/infer", content=content, headers=headers)
    assert response.status_code == 413
    assert f"over the limit of {LIMIT} bytes" in response.json()["error"]
    assert client.post("/v2/models/mlp/infer", json=json_request(rows(1))).status_code == 200


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "words"),
    [
        ("POST", "/v2/models/mlp/infer", b"{oops", 400, "not valid JSON"),
        (
            "POST",
            "/v2/models/mlp/infer",
            orjson.dumps(json_request(rows(2)[:, :3])),
            400,
            "tensor `x`: expected [-1, 16] FP32, got [2, 3] FP32",
        ),
        (
            "POST",
            "/v2/models/mlp/infer",
            orjson.dumps(json_request(rows(1), outputs=[{"name": "z"}])),
            400,
            "output `z`",
        ),
        (
            "POST",
            "/v2/models/nope/infer",
            orjson.dumps(json_request(rows(1))),
            400,
            "Request for unknown model: 'nope' is not found; this server serves `mlp`",
        ),
        (
            "POST",
            "/v2/models/mlp/versions/9/infer",
            orjson.dumps(json_request(rows(1))),
            404,
            "Request for unknown model: 'mlp' version 9 is not found; it serves version `3`",
        ),
        # Triton's words and codes: an unknown model is INVALID_ARG (400) on every route
        ("GET", "/v2/models/nope", b"", 400, "Request for unknown model: 'nope' is not found"),
        ("GET", "/v2/models/nope/config", b"", 400, "unknown model: 'nope' is not found"),
        ("GET", "/v2/models/nope/stats", b"", 400, "unknown model: 'nope' is not found"),
        ("GET", "/v2/models/nope/ready", b"", 400, "unknown model: 'nope' is not found"),
        ("GET", "/v2/models/mlp/versions/9/ready", b"", 400, "'mlp' version 9 is not found"),
        ("GET", "/v2/models/mlp/versions/1/stats", b"", 404, "it serves version `3`"),
        # a bare "Not Found" read as a wrong model or server; now: which request, what is served
        (
            "POST",
            "/predict",
            b"{}",
            404,
            "Not Found: no route POST /predict. Hint: this function serves KServe v2 as Triton "
            "does: POST /v2/models/mlp/infer, GET /v2/models/mlp, /v2/health/ready; POST /invoke",
        ),
        ("POST", "/v2/models/mlp/infer/invoke", b"{}", 404, "no route POST /v2/models/mlp/infer/"),
        (
            "GET",
            "/v2/models/mlp/infer",
            b"",
            405,
            "Method Not Allowed: GET /v2/models/mlp/infer; th",
        ),
        ("GET", "/invoke", b"", 405, "Method Not Allowed: GET /invoke; this route takes POST"),
        ("POST", "/v2/health/ready", b"", 405, "POST /v2/health/ready; this route takes GET, HEAD"),
        ("POST", "/v2/models/mlp/infer", b"\x1f\x8b broken", 400, "not valid gzip"),
    ],
)
def test_errors_are_json_with_a_clear_message_and_the_next_request_works(
    client: httpx.Client, method: str, path: str, body: bytes, status: int, words: str
) -> None:
    headers = {"Content-Encoding": "gzip"} if body.startswith(b"\x1f\x8b") else {}
    response = client.request(method, path, content=body, headers=headers)
    assert response.status_code == status
    assert words in response.json()["error"]
    assert client.post("/v2/models/mlp/infer", json=json_request(rows(1))).status_code == 200


def test_statistics_and_metrics_count_what_ran(mlp_bundle: Bundle) -> None:
    with client_of(mlp_bundle) as client:  # a server of its own: counts start at zero
        for n in (1, 2, 3):
            assert (
                client.post("/v2/models/mlp/infer", json=json_request(rows(n))).status_code == 200
            )
        assert (
            client.post("/v2/models/mlp/infer", json=json_request(rows(1)[:, :2])).status_code
            == 400
        )
        (stats,) = client.get("/v2/models/mlp/stats").json()["model_stats"]
        assert client.get("/v2/models/stats").json()["model_stats"] == [stats]
        assert (stats["name"], stats["version"]) == ("mlp", "3")
        assert stats["inference_count"] == 6  # rows; warm-up runs beside the batcher
        assert stats["execution_count"] == 3
        assert stats["inference_stats"]["success"]["count"] == 3
        assert stats["inference_stats"]["fail"]["count"] == 1
        phases = [stats["inference_stats"][f"compute_{p}"] for p in ("input", "infer", "output")]
        assert [phase["count"] for phase in phases] == [3, 3, 3]  # perf_analyzer checks this
        assert all(phase["ns"] > 0 for phase in phases)
        for by_size in stats["batch_stats"]:
            counts = {by_size[f"compute_{p}"]["count"] for p in ("input", "infer", "output")}
            assert len(counts) == 1
        metrics = client.get("/metrics")
        assert metrics.headers["content-type"].startswith("text/plain")
        text = metrics.text
        assert 'nv_inference_request_success{model="mlp",version="3"} 3.0' in text
        assert 'nv_inference_request_failure{model="mlp",version="3"} 1.0' in text
        for name in (*TRITON_METRICS, "edgeserve_batch_size_bucket"):
            assert f"\n{name}{{" in text


TRITON_METRICS = (
    "nv_inference_count",
    "nv_inference_exec_count",
    "nv_inference_request_duration_us",
    "nv_inference_queue_duration_us",
    "nv_inference_compute_input_duration_us",
    "nv_inference_compute_infer_duration_us",
    "nv_inference_compute_output_duration_us",
)


def test_invoke_without_a_handler_takes_and_gives_json_tensors(
    client: httpx.Client, mlp_bundle: Bundle
) -> None:
    x = rows(2, seed=3)
    response = client.post("/invoke", json={"x": x.tolist()})
    assert response.status_code == 200, response.text
    np.testing.assert_allclose(
        np.array(response.json()["y"]), reference(mlp_bundle, x), rtol=1e-5, atol=1e-6
    )


def test_invoke_writes_float32_outputs_as_v2_does(client: httpx.Client) -> None:
    """Each number as float32 prints it, the same text as the v2 answer's: /invoke wrote the
    float64 expansion of each (0.20000000298023224 for 0.2), three times the bytes, and
    `edgeserve invoke` printed it so."""
    x = rows(2, seed=4)
    text = client.post("/invoke", json={"x": x.tolist()}).text
    v2 = client.post("/v2/models/mlp/infer", json=json_request(x)).json()["outputs"][0]["data"]
    numbers = [float(n) for n in text.split("[[")[1].split("]]")[0].replace("],[", ",").split(",")]
    assert numbers == v2
    assert [repr(n) for n in numbers] == [str(np.float32(n)) for n in numbers]


@pytest.fixture(scope="module")
def handler_client(handler_bundle: Bundle) -> Iterator[httpx.Client]:
    with client_of(handler_bundle) as client:
        yield client


def test_invoke_json_in_json_out_with_numpy_results(
    handler_client: httpx.Client, handler_bundle: Bundle
) -> None:
    x = rows(3, seed=4)
    response = handler_client.post("/invoke", json={"rows": x.tolist()})
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/json"
    result = response.json()
    expected = reference(handler_bundle, x)
    assert result["kind"] == "dict"
    np.testing.assert_allclose(result["y"], expected, rtol=1e-5, atol=1e-6)
    assert result["first"] == pytest.approx(float(expected[0, 0]), rel=1e-5)
    assert result["best"] == expected.argmax(axis=1).tolist()


def test_invoke_msgpack_with_a_numpy_ext_in_and_msgpack_out(
    handler_client: httpx.Client, handler_bundle: Bundle
) -> None:
    x = rows(2, seed=5)
    body = msgpack.packb({"rows": pack_array(x)})
    response = handler_client.post(
        "/invoke",
        content=body,
        headers={"Content-Type": MSGPACK, "Accept": MSGPACK},
    )
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == MSGPACK
    result = msgpack.unpackb(response.content)
    np.testing.assert_allclose(
        np.array(result["y"]), reference(handler_bundle, x), rtol=1e-5, atol=1e-6
    )
    assert isinstance(result["first"], float)
    for accept, answered in [
        ("application/json, application/msgpack;q=0", "application/json"),  # "not msgpack"
        ("application/msgpack;q=0.5, application/json", "application/json"),
        ("application/x-msgpack;q=0.9, */*;q=0.1", "application/x-msgpack"),
        ("application/json, application/msgpack", "application/msgpack"),
    ]:
        response = handler_client.post(
            "/invoke", content=body, headers={"Content-Type": MSGPACK, "Accept": accept}
        )
        assert response.headers["content-type"] == answered, accept


def test_invoke_raw_bytes_reach_the_handler_as_bytes(
    handler_client: httpx.Client, handler_bundle: Bundle
) -> None:
    image = bytes(range(40))
    response = handler_client.post("/invoke", content=image, headers={"Content-Type": "image/png"})
    assert response.status_code == 200, response.text
    assert response.json()["kind"] == "bytes"
    expected = reference(handler_bundle, np.arange(16, dtype=np.float32)[np.newaxis])
    np.testing.assert_allclose(response.json()["y"], expected, rtol=1e-5, atol=1e-5)


def test_invoke_bad_bodies_are_400(handler_client: httpx.Client) -> None:
    for content_type, body, words in [
        ("application/json", b"{nope", "not valid JSON"),
        ("application/x-msgpack", b"\xc1", "not valid msgpack"),
        (
            "application/msgpack",
            msgpack.packb(msgpack.ExtType(1, b"\x93\xa3<f4")),
            "not valid msgpack",
        ),
    ]:
        response = handler_client.post(
            "/invoke", content=body, headers={"Content-Type": content_type}
        )
        assert response.status_code == 400, content_type
        assert words in response.json()["error"]


def test_an_unexpected_fault_is_a_generic_500_and_logged(
    handler_client: httpx.Client, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR, logger="edgeserve.http"):
        response = handler_client.post("/invoke", json={"rows": rows(1).tolist(), "crash": True})
    assert response.status_code == 500
    assert response.json() == {"error": "internal server error; the server log has the details"}
    assert "POST /invoke" in caplog.text and "RuntimeError: a fault inside" in caplog.text
    assert handler_client.post("/invoke", json={"rows": rows(1).tolist()}).status_code == 200


def test_a_handler_answer_that_cannot_be_encoded_is_a_500_that_says_so(
    handler_client: httpx.Client, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR, logger="edgeserve.http"):
        response = handler_client.post(
            "/invoke", json={"rows": rows(1).tolist(), "unserializable": True}
        )
    assert response.status_code == 500
    assert response.json()["error"] == (
        "handler.postprocess returned dict holding what a response cannot carry (Type is not "
        "JSON serializable: set); expected JSON-like values: dict, list, str, numbers, "
        "np.ndarray (a bug in the function's handler, not in the request)"
    )
    assert "handler.postprocess returned dict" in caplog.text and "POST /invoke" in caplog.text


SLOW_QUEUE = MLP.replace("max_queue_delay_ms = 1", "max_queue_delay_ms = 1500")


def test_a_client_that_hangs_up_has_its_items_dropped_before_they_run(tmp_path: Path) -> None:
    bundle = build(write_function(tmp_path / "src", mlp_model, SLOW_QUEUE), tmp_path / "bundle")
    with serving(create_app(Runtime.load(bundle))) as url:
        warmed = httpx.get(f"{url}/v2/models/mlp/stats").json()["model_stats"][0]["inference_count"]
        body = orjson.dumps(json_request(rows(1)))
        host, port = url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=5) as conn:
            conn.sendall(
                b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\n"
                + b"Content-Type: application/json\r\n"
                + f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body
            )
            time.sleep(0.3)  # queued, waiting for company for 1.5 s
        time.sleep(1.6)  # past the queue delay: the batch would have run by now
        stats = httpx.get(f"{url}/v2/models/mlp/stats").json()["model_stats"][0]
        assert stats["inference_count"] == warmed
        response = httpx.post(f"{url}/v2/models/mlp/infer", content=body, timeout=10)
        assert response.status_code == 200


SLO_50_MS = MLP.replace("max_queue_delay_ms = 1", "max_queue_delay_ms = 1\nlatency_slo_ms = 50")


def test_latency_slo_counts_from_the_request_reaching_the_server(tmp_path: Path) -> None:
    """A body that takes 200 ms to arrive has spent the 50 ms SLO before it reaches the queue."""
    bundle = build(write_function(tmp_path / "src", mlp_model, SLO_50_MS), tmp_path / "bundle")
    body = orjson.dumps(json_request(rows(1)))
    with serving(create_app(Runtime.load(bundle))) as url:
        host, port = url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=5) as conn:
            conn.sendall(
                b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\n"
                + f"Content-Length: {len(body)}\r\n\r\n".encode()
            )
            time.sleep(0.2)
            conn.sendall(body)
            answer = conn.recv(65536).decode()
        assert answer.startswith("HTTP/1.1 503"), answer
        assert "latency_slo_ms=50" in answer
        assert httpx.post(f"{url}/v2/models/mlp/infer", content=body).status_code == 200


def test_behind_a_proxy_that_strips_a_prefix_every_route_still_answers(
    mlp_bundle: Bundle,
) -> None:
    """uvicorn --root-path /fn: the proxy forwards /fn/v2/... as /v2/..., the app sees /fn/v2/..."""
    body = orjson.dumps(json_request(rows(1)))
    with serving(create_app(Runtime.load(mlp_bundle)), root_path="/fn") as url:
        assert httpx.get(f"{url}/v2/health/ready").status_code == 200
        answer = httpx.post(f"{url}/v2/models/mlp/infer", content=body)
        assert answer.status_code == 200, answer.text
        assert answer.json()["outputs"][0]["name"] == "y"
        assert httpx.post(f"{url}/v2/models/other/infer", content=body).status_code == 400
