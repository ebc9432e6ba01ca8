"""The README's first steps, the way a user types them: init, build, serve, invoke, doctor, curl."""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path

import httpx
import numpy as np
import onnxruntime as ort
import pytest

from edgeserve.builder import build
from edgeserve.bundle import Bundle
from edgeserve.cli import main
from edgeserve.runtime import Runtime
from tests.models import mlp_model, varlen_model, write_function
from tests.server import served

BATCHED_MLP = """
[function]
name = "mlp"
[batching]
max_batch_size = 16
preferred_batch_sizes = [8, 16]
max_queue_delay_ms = 5
[backend]
prefer = ["onnxruntime"]
"""


@pytest.fixture(scope="module")
def mlp_url(tmp_path_factory: pytest.TempPathFactory):
    folder = write_function(tmp_path_factory.mktemp("fn") / "mlp", mlp_model, BATCHED_MLP)
    with served(folder) as url:
        yield url, folder


def reference(folder: Path, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def v2_request(x: np.ndarray) -> dict:
    return {
        "inputs": [
            {"name": "x", "datatype": "FP32", "shape": list(x.shape), "data": x.ravel().tolist()}
        ]
    }


def test_init_build_serve_invoke_through_the_cli(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source, bundle = tmp_path / "functions" / "demo", tmp_path / "build" / "demo"
    assert main(["init", str(source)]) == 0
    assert main(["build", str(source), "--out", str(bundle)]) == 0
    assert (bundle / "edgeserve.json").is_file()
    request = json.loads((source / "samples" / "request.json").read_text())
    with served(bundle) as url:
        capsys.readouterr()
        assert main(["invoke", url, "--json", json.dumps(request)]) == 0
        printed = capsys.readouterr().out
        metadata = httpx.get(f"{url}/v2/models/demo").json()
    assert metadata["name"] == "demo"
    assert "y" in printed
    assert [tensor["name"] for tensor in metadata["inputs"]] == ["x"]


def test_v2_infer_matches_onnxruntime(mlp_url) -> None:
    url, folder = mlp_url
    x = np.random.default_rng(1).normal(size=(5, 16)).astype(np.float32)
    answer = httpx.post(f"{url}/v2/models/mlp/infer", json=v2_request(x)).json()
    (output,) = answer["outputs"]
    assert output["shape"] == [5, 4]
    np.testing.assert_allclose(
        np.array(output["data"]).reshape(5, 4), reference(folder, x), rtol=1e-5, atol=1e-6
    )


def test_concurrent_callers_are_batched_and_never_mixed(mlp_url) -> None:
    url, folder = mlp_url
    rng = np.random.default_rng(2)
    xs = [rng.normal(size=(1, 16)).astype(np.float32) for _ in range(32)]

    async def call_all() -> list[dict]:
        async with httpx.AsyncClient(timeout=30) as client:
            replies = await asyncio.gather(
                *(client.post(f"{url}/v2/models/mlp/infer", json=v2_request(x)) for x in xs)
            )
        return [reply.json() for reply in replies]

    for x, answer in zip(xs, asyncio.run(call_all()), strict=True):
        got = np.array(answer["outputs"][0]["data"], dtype=np.float32).reshape(1, 4)
        np.testing.assert_allclose(got, reference(folder, x), rtol=1e-5, atol=1e-6)
    metrics = httpx.get(f"{url}/metrics").text
    assert batches_larger_than_one(metrics) > 0, metrics


def batches_larger_than_one(metrics: str) -> float:
    """Batches counted by the histogram minus those in its `le="1"` bucket."""
    total = float(re.search(r"^edgeserve_batch_size_count\{[^}]*\} (\S+)", metrics, re.M).group(1))
    ones = float(
        re.search(
            r'^edgeserve_batch_size_bucket\{[^}]*le="1(?:\.0)?"[^}]*\} (\S+)', metrics, re.M
        ).group(1)
    )
    return total - ones


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        (
            {
                "inputs": [
                    {"name": "nope", "datatype": "FP32", "shape": [1, 16], "data": [0.0] * 16}
                ]
            },
            400,
            "x",
        ),
        (
            {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 3], "data": [0.0] * 3}]},
            400,
            "[-1, 16]",
        ),
        (
            {"inputs": [{"name": "x", "datatype": "INT64", "shape": [1, 16], "data": [0] * 16}]},
            400,
            "FP32",
        ),
        (
            {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 16], "data": [0.0] * 16}]},
            400,
            "x",
        ),
    ],
)
def test_bad_input_gets_a_clear_4xx_and_the_server_keeps_serving(
    mlp_url, body, status, words
) -> None:
    url, _ = mlp_url
    reply = httpx.post(f"{url}/v2/models/mlp/infer", json=body)
    assert reply.status_code == status
    assert words in reply.json()["error"]
    x = np.ones((1, 16), np.float32)
    assert httpx.post(f"{url}/v2/models/mlp/infer", json=v2_request(x)).status_code == 200


def test_malformed_bodies_and_unknown_models(mlp_url) -> None:
    url, _ = mlp_url
    bad_json = httpx.post(
        f"{url}/v2/models/mlp/infer",
        content=b"{not json",
        headers={"Content-Type": "application/json"},
    )
    assert bad_json.status_code == 400
    bad_msgpack = httpx.post(
        f"{url}/invoke", content=b"\xc1\xc1", headers={"Content-Type": "application/msgpack"}
    )
    assert bad_msgpack.status_code == 400
    assert httpx.get(f"{url}/v2/models/other").status_code == 400  # as Triton
    assert httpx.post(
        f"{url}/v2/models/other/infer", json=v2_request(np.ones((1, 16), np.float32))
    ).status_code in (400, 404)
    assert httpx.get(f"{url}/v2/health/live").status_code == 200


def test_invoke_speaks_msgpack_when_asked(mlp_url) -> None:
    import msgpack

    url, folder = mlp_url
    x = np.random.default_rng(3).normal(size=(2, 16)).astype(np.float32)
    reply = httpx.post(
        f"{url}/invoke",
        content=msgpack.packb({"x": x.tolist()}),
        headers={"Content-Type": "application/msgpack", "Accept": "application/msgpack"},
    )
    assert reply.headers["content-type"].startswith("application/msgpack")
    got = np.array(msgpack.unpackb(reply.content)["y"], dtype=np.float32)
    np.testing.assert_allclose(got, reference(folder, x), rtol=1e-5, atol=1e-6)


def test_body_over_the_limit_is_413(tmp_path: Path) -> None:
    folder = write_function(
        tmp_path / "small", mlp_model, BATCHED_MLP + "[resources]\nmax_body_mb = 0.01\n"
    )
    with served(folder) as url:
        x = np.ones((200, 16), np.float32)
        assert httpx.post(f"{url}/v2/models/mlp/infer", json=v2_request(x)).status_code == 413
        assert httpx.post(f"{url}/v2/models/mlp/infer", json=v2_request(x[:1])).status_code == 200


def test_padded_variable_length_items_batch_together(tmp_path: Path) -> None:
    manifest = """
[function]
name = "varlen"
[model.inputs.x]
pad_axis = 1
[model.outputs.doubled]
pad_axis = 1
[handler]
module = "handler"
[batching]
max_batch_size = 8
max_queue_delay_ms = 20
"""
    handler = """
import numpy as np

def preprocess(payload, ctx):
    return [{"x": np.asarray(row, dtype=np.float32)} for row in payload["rows"]]

def postprocess(items, ctx):
    return {"totals": [float(item["total"]) for item in items]}
"""
    folder = write_function(tmp_path / "varlen", varlen_model, manifest, handler)
    rows = [[1.0] * n for n in (1, 5, 3, 8)]

    async def call_all() -> list[dict]:
        async with httpx.AsyncClient(timeout=30) as client:
            replies = await asyncio.gather(
                *(client.post(f"{url}/invoke", json={"rows": [row]}) for row in rows)
            )
        return [reply.json() for reply in replies]

    with served(folder) as url:
        answers = asyncio.run(call_all())
        whole = httpx.post(f"{url}/invoke", json={"rows": rows}).json()
    assert [answer["totals"] for answer in answers] == [[1.0], [5.0], [3.0], [8.0]]
    assert whole == {"totals": [1.0, 5.0, 3.0, 8.0]}


def test_doctor_names_the_platform_and_the_choice(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out.lower()
    assert "cpu" in out
    assert "openvino" in out


def test_cli_errors_are_one_line_and_an_exit_code(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "broken"
    folder.mkdir()
    (folder / "function.toml").write_text(
        '[function]\nname = "broken"\n[batching]\nmax_batchsize = 4\n'
    )
    assert main(["build", str(folder)]) == 2
    err = capsys.readouterr().err
    assert "batching.max_batchsize" in err
    assert "Traceback" not in err


def test_the_timeout_request_parameter_bounds_the_wait(mlp_url) -> None:
    url, _ = mlp_url
    body = v2_request(np.ones((1, 16), np.float32))
    expired = httpx.post(f"{url}/v2/models/mlp/infer", json={**body, "parameters": {"timeout": 1}})
    assert expired.status_code == 504
    assert "deadline" in expired.json()["error"].lower()
    generous = httpx.post(
        f"{url}/v2/models/mlp/infer", json={**body, "parameters": {"timeout": 10_000_000}}
    )
    assert generous.status_code == 200
    bad = httpx.post(f"{url}/v2/models/mlp/infer", json={**body, "parameters": {"timeout": "soon"}})
    assert bad.status_code == 400


def test_a_model_with_a_fixed_batch_dim_is_served_unbatched(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = write_function(
        tmp_path / "fixed",
        lambda path: mlp_model(path, batch=1),
        '[function]\nname = "fixed"\n[backend]\nprecision = "fp32"\n',  # exact vs numpy
    )
    assert main(["build", str(folder), "--out", str(tmp_path / "build")]) == 0
    assert (
        "batching off: no batch axis (x [1, 16], y [1, 4]: no dynamic first dim), so every"
        in capsys.readouterr().out
    )
    with served(tmp_path / "build") as url:
        x = np.ones((1, 16), np.float32)
        answer = httpx.post(f"{url}/v2/models/fixed/infer", json=v2_request(x)).json()
        config = httpx.get(f"{url}/v2/models/fixed/config").json()
    np.testing.assert_allclose(
        answer["outputs"][0]["data"], reference(folder, x).ravel(), rtol=1e-5
    )
    assert config["max_batch_size"] == 0


def test_sigterm_finishes_the_requests_in_flight_then_exits(tmp_path: Path) -> None:
    import signal

    from tests import rawhttp
    from tests.server import running

    slow = (
        "import time\n\ndef postprocess(items, ctx):\n    time.sleep(0.5)\n    return len(items)\n"
    )
    folder = write_function(
        tmp_path / "slow", mlp_model, BATCHED_MLP + '[handler]\nmodule = "handler"\n', slow
    )
    body = json.dumps({"x": [0.0] * 16}).encode()
    with running(folder) as (url, server):
        sent = [rawhttp.send(url, "/invoke", body) for _ in range(4)]
        time.sleep(0.25)  # the requests are in the handler now
        server.process.send_signal(signal.SIGTERM)
        replies = [rawhttp.answer(sock) for sock in sent]
        # uvicorn re-raises the signal once its graceful shutdown is done
        assert server.process.wait(timeout=30) == -signal.SIGTERM
    assert [(status, reply) for status, _, reply in replies] == [(200, b"1")] * 4


def test_a_bundle_serves_with_the_backends_it_was_built_for(tmp_path: Path) -> None:
    """prefer lists OpenVINO first and OpenVINO is installed here, but a Jetson bundle and one
    built for ONNX Runtime both run ONNX Runtime: what they will run where they are going."""
    manifest = BATCHED_MLP.replace('["onnxruntime"]', '["openvino", "onnxruntime"]')
    folder = write_function(tmp_path / "mlp", mlp_model, manifest)
    for name, target in {"local": "local", "jetson": "jetson"}.items():
        assert main(["build", str(folder), "--out", str(tmp_path / name), "--target", target]) == 0
    build(folder, tmp_path / "ort", backend="onnxruntime")
    chosen = {
        name: Runtime.load(Bundle.open(tmp_path / name)).backend_name
        for name in ("local", "jetson", "ort")
    }
    assert chosen == {"local": "openvino", "jetson": "onnxruntime", "ort": "onnxruntime"}
