"""`serve --emulate aws-lambda`: real HTTP through real Lambda events into the real runtime
interface client (awslambdaric) in worker processes, for every event source."""

from __future__ import annotations

import gzip
import io
import json
import re
import socket
import threading
import time
from contextlib import closing
from pathlib import Path

import httpx
import msgpack
import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.http as triton
from PIL import Image
from tritonclient.utils import InferenceServerException

from edgeserve.bundle import Bundle
from edgeserve.cli import main
from edgeserve.errors import ConfigError
from tests.aws_lambda_support import HANDLER, emulated, reports, small_bundle

ROWS = np.linspace(-1, 1, 32, dtype=np.float32).reshape(2, 16)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Bundle:
    return small_bundle(tmp_path_factory.mktemp("emulate"), handler=HANDLER)


def expected(bundle: Bundle, rows: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(bundle.model_path), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": rows.astype(np.float32)})[0]


def png() -> tuple[bytes, np.ndarray]:
    pixels = (np.arange(16, dtype=np.uint8) * 16).reshape(4, 4)
    out = io.BytesIO()
    Image.fromarray(pixels, mode="L").save(out, format="PNG")
    return out.getvalue(), pixels.reshape(1, 16).astype(np.float32) / 255.0


def profile(tmp_path: Path, **settings: object) -> str:
    lines = "".join(f"{key} = {json.dumps(value)}\n" for key, value in settings.items())
    path = tmp_path / "lambda.toml"
    path.write_text(f'driver = "aws-lambda"\n[settings]\n{lines}')
    return str(path)


@pytest.mark.parametrize("event", ["url", "http", "rest", "alb"])
def test_png_msgpack_and_json_bodies_through_each_event_source(bundle: Bundle, event: str) -> None:
    image, image_rows = png()
    with emulated(bundle.root, "--event", event) as (url, _):
        as_png = httpx.post(f"{url}/invoke", content=image, headers={"content-type": "image/png"})
        as_msgpack = httpx.post(
            f"{url}/invoke",
            content=msgpack.packb({"rows": ROWS.tolist()}),
            headers={"content-type": "application/msgpack", "accept": "application/msgpack"},
        )
        as_json = httpx.post(f"{url}/invoke?unused=1", json={"rows": ROWS[:1].tolist()})
        as_gzip = httpx.post(  # REST's gateway decompresses it, the others pass it on
            f"{url}/invoke",
            content=gzip.compress(json.dumps({"rows": ROWS[:1].tolist()}).encode()),
            headers={"content-type": "application/json", "content-encoding": "gzip"},
        )
        health_check = httpx.get(url, headers={"user-agent": "ELB-HealthChecker/2.0"})

    # an ALB's health check at its default path asks the readiness route; others have no `/`
    assert health_check.status_code == (200 if event == "alb" else 404)
    assert as_png.status_code == 200, as_png.text
    np.testing.assert_allclose(
        as_png.json()["y"], expected(bundle, image_rows), rtol=1e-5, atol=1e-5
    )
    assert (as_msgpack.status_code, as_msgpack.headers["content-type"]) == (
        200,
        "application/msgpack",
    )
    np.testing.assert_allclose(
        msgpack.unpackb(as_msgpack.content)["y"], expected(bundle, ROWS), rtol=1e-5, atol=1e-5
    )
    assert as_json.status_code == 200
    np.testing.assert_allclose(
        as_json.json()["y"], expected(bundle, ROWS[:1]), rtol=1e-5, atol=1e-5
    )
    assert (as_gzip.status_code, as_gzip.json()["y"]) == (200, as_json.json()["y"])
    assert len({as_png.json()["pid"], as_json.json()["pid"]}) == 1  # one environment served all


SPLIT_HANDLER = """\
import numpy as np

from rows import as_rows


def preprocess(payload, ctx):
    return as_rows(payload)


def postprocess(items, ctx):
    from helpers.answer import answer  # imported late: routed the same

    return answer(items)
"""
SPLIT_MODULES = {
    "rows.py": "import numpy as np\n\ndef as_rows(payload):\n"
    "    return [{'x': np.asarray(row, np.float32)} for row in payload['rows']]\n",
    "helpers/__init__.py": "",
    "helpers/answer.py": "from . import names\n\ndef answer(items):\n"
    "    return {'y': [item['y'].tolist() for item in items], 'by': names.BY}\n",
    "helpers/names.py": "BY = __name__.rpartition('.')[2]\n",
}


def test_a_handler_of_several_modules_runs_in_the_emulated_lambda(tmp_path: Path) -> None:
    """The bundle's copies of the handler's modules, imported in Lambda's worker process (only
    handler.py was copied: `No module named 'rows'` at init, every invocation a 502)."""
    split = small_bundle(tmp_path, "split", handler=SPLIT_HANDLER, modules=SPLIT_MODULES)
    assert split.handler_modules == (
        "helpers/__init__.py",
        "helpers/answer.py",
        "helpers/names.py",
        "rows.py",
    )
    with emulated(split.root) as (url, _):
        answer = httpx.post(f"{url}/invoke", json={"rows": ROWS.tolist()}, timeout=60)
    assert answer.status_code == 200, answer.text
    assert answer.json()["by"] == "names"
    np.testing.assert_allclose(answer.json()["y"], expected(split, ROWS), rtol=1e-5, atol=1e-5)


def test_model_loads_once_per_instance_across_many_invocations(bundle: Bundle) -> None:
    with emulated(bundle.root, "--instances", "2") as (url, server):
        answers: list[httpx.Response] = []

        def call() -> None:
            answers.append(
                httpx.post(
                    f"{url}/invoke", json={"rows": ROWS.tolist(), "sleep_s": 0.2}, timeout=30
                )
            )

        threads = [threading.Thread(target=call) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        lines = reports(server, at_least=9)

    assert [answer.status_code for answer in answers] == [200] * 8
    assert len({answer.json()["pid"] for answer in answers}) == 2
    assert len(lines) >= 9  # 8 calls + the readiness probe(s)
    assert sum("Init Duration:" in line for line in lines) == 2
    assert all(re.search(r"Memory Size: 2048 MB\tMax Memory Used: \d+ MB", line) for line in lines)
    assert (  # said at the start: it was in the first REPORT line alone
        "emulating AWS Lambda: function tiny, 2048 MB, timeout 30 s, 2 execution environments "
        "(each starts cold on its first request), requests arrive as url events, served by "
        "onnxruntime as on Lambda\n"
    ) in server.output


def test_a_request_running_into_the_timeout_gets_the_functions_504_and_the_next_runs_warm(
    bundle: Bundle, tmp_path: Path
) -> None:
    """It was Lambda's own timeout: a 502 (Sandbox.Timedout) saying nothing of what ran out, and
    a cold start for the next request, the environment replaced."""
    with emulated(bundle.root, "--target", profile(tmp_path, timeout_s=2)) as (url, server):
        slow = httpx.post(f"{url}/invoke", json={"rows": ROWS.tolist(), "sleep_s": 5}, timeout=30)
        after = httpx.post(f"{url}/invoke", json={"rows": ROWS.tolist()}, timeout=30)
        lines = reports(server, at_least=3)
        output = "".join(server.output)

    assert slow.status_code == 504
    assert "the invocation's time ran out" in slow.json()["error"]
    assert "Task timed out" not in output
    assert after.status_code == 200
    assert sum("Init Duration:" in line for line in lines) == 1  # the probe's cold start alone


def test_timeout_answers_502_reports_it_and_the_next_call_starts_cold(
    bundle: Bundle, tmp_path: Path
) -> None:
    """Code that keeps the event loop from running (here a preprocess holding the GIL) cannot
    be cut off before the timeout: Lambda's own stands."""
    with emulated(bundle.root, "--target", profile(tmp_path, timeout_s=1)) as (url, server):
        slow = httpx.post(f"{url}/invoke", json={"rows": ROWS.tolist(), "hold_s": 3}, timeout=30)
        after = httpx.post(f"{url}/invoke", json={"rows": ROWS.tolist()}, timeout=30)
        lines = reports(server, containing="Init Duration", at_least=2)
        output = "".join(server.output)

    assert (slow.status_code, slow.headers["x-amzn-errortype"]) == (502, "Sandbox.Timedout")
    assert "Task timed out after 1.00 seconds" in output
    timed_out = [i for i, line in enumerate(lines) if "Status: timeout" in line]
    assert len(timed_out) == 1
    assert after.status_code == 200
    assert "Init Duration:" in lines[timed_out[0] + 1]  # the timed-out environment was replaced


def test_the_profiles_environment_reaches_the_function(bundle: Bundle, tmp_path: Path) -> None:
    """The function runs with the variables deploy gives it on Lambda: here a token, which
    closes /invoke (health stays open); the emulator ran it without them."""
    token = "emulated-token-0123456789"
    path = tmp_path / "lambda.toml"
    path.write_text(
        'driver = "aws-lambda"\n[settings]\n'
        f'environment = {{ EDGESERVE_BACKEND = "onnxruntime", EDGESERVE_AUTH_TOKEN = "{token}" }}\n'
    )
    rows = {"rows": ROWS[:1].tolist()}
    with emulated(bundle.root, "--target", str(path)) as (url, _):
        refused = httpx.post(f"{url}/invoke", json=rows, timeout=30)
        accepted = httpx.post(f"{url}/invoke", json=rows, headers={"x-api-key": token}, timeout=30)

    assert (refused.status_code, accepted.status_code) == (401, 200)


def test_over_memory_kills_the_environment(bundle: Bundle, tmp_path: Path) -> None:
    with emulated(bundle.root, "--target", profile(tmp_path, memory_mb=256)) as (url, server):
        fat = httpx.post(
            f"{url}/invoke", json={"rows": ROWS.tolist(), "allocate_mb": 400}, timeout=30
        )
        lines = reports(server, containing="Status: killed")

    assert (fat.status_code, fat.headers["x-amzn-errortype"]) == (502, "Runtime.ExitError")
    assert "Max Memory Used: 256 MB" in lines[-1]
    assert "Status: killed" in lines[-1]


def test_payload_limits_request_413_and_response_too_large(bundle: Bundle) -> None:
    with emulated(bundle.root) as (url, _):
        big_request = httpx.post(
            f"{url}/invoke", content=b"\x00" * (5 * 2**20), headers={"content-type": "image/png"}
        )
        big_response = httpx.post(
            f"{url}/invoke", json={"rows": ROWS.tolist(), "pad_bytes": 7_000_000}
        )
        fine = httpx.post(f"{url}/invoke", json={"rows": ROWS.tolist(), "pad_bytes": 1_000_000})

    # 5 MB of binary is 6.7 MB once base64-encoded into the event: over the 6 MB limit
    assert big_request.status_code == 413
    assert "Request must be smaller than 6291456 bytes" in big_request.json()["Message"]
    # the handler answers 413 itself: Lambda failed the invocation (ResponseSizeTooLarge), a 502
    assert big_response.status_code == 413
    assert "over the 6291556 bytes allowed" in big_response.json()["error"]
    assert fine.status_code == 200 and len(fine.json()["pad"]) == 1_000_000


def test_an_alb_refuses_a_body_over_1_mb_itself(bundle: Bundle) -> None:
    """An ALB sends a Lambda target bodies of 1 MB at most and answers 413 itself; the emulator
    passed 1 to 6 MB bodies to the function, which answered them."""
    rows = {"rows": ROWS.tolist(), "pad": "x" * 2**20}
    with emulated(bundle.root, "--event", "alb") as (url, _):
        over = httpx.post(f"{url}/invoke", json=rows)
        within = httpx.post(f"{url}/invoke", json={"rows": ROWS.tolist()})

    assert (over.status_code, over.headers["content-type"]) == (413, "text/html")
    assert b"413 Request Entity Too Large" in over.content
    assert within.status_code == 200


def test_a_client_that_leaves_mid_body_is_no_invocation_and_no_error(bundle: Bundle) -> None:
    """It was logged as an "Exception in ASGI application" (ClientDisconnect)."""
    with emulated(bundle.root) as (url, server):
        ran = len(reports(server))  # the readiness probe's
        host, port = url.removeprefix("http://").split(":")
        head = b"POST /invoke HTTP/1.1\r\nhost: t\r\ncontent-length: 1000\r\n\r\n"
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(head + b"x" * 10)
            time.sleep(0.5)  # the emulator waits for the rest of the body...
        time.sleep(0.5)  # ... until the client closes
        assert len(reports(server, at_least=0)) == ran  # no invocation for it
        after = httpx.post(f"{url}/invoke", json={"rows": ROWS.tolist()})
    assert after.status_code == 200
    assert not [line for line in server.output if "Exception in ASGI" in line]


def files(root: Path) -> dict[str, tuple[int, int]]:
    """Every file and folder under `root`: its modification time and size."""
    return {str(path): (path.stat().st_mtime_ns, path.stat().st_size) for path in root.rglob("*")}


def test_the_function_writes_nothing_outside_tmp(
    bundle: Bundle, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On Lambda only /tmp is writable: the task root (the bundle inside it) and the home
    folder are not. Init, inference, the handler, metrics and statistics leave both as they
    were (checked by what they hold, since this test runs as a user that may write them)."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    before = files(bundle.root)
    with emulated(bundle.root) as (url, _):
        answers = [
            httpx.post(f"{url}/invoke", json={"rows": ROWS.tolist()}),
            httpx.get(f"{url}/metrics"),
            httpx.get(f"{url}/v2/models/stats"),
        ]

    assert [answer.status_code for answer in answers] == [200] * 3
    assert files(bundle.root) == before
    assert list(home.iterdir()) == []


def test_a_raw_event_on_the_invoke_api_path_is_a_direct_invocation(bundle: Bundle) -> None:
    """As with AWS's Runtime Interface Emulator: the body is the event, the answer the
    function's result (a v2 infer request is answered as JSON), 200 even for a function error."""
    invocations = "/2015-03-31/functions/function/invocations"
    request = {"inputs": [{"name": "x", "shape": [2, 16], "datatype": "FP32", "data": []}]}
    request["inputs"][0]["data"] = ROWS.ravel().tolist()
    with emulated(bundle.root) as (url, _):
        inferred = httpx.post(f"{url}{invocations}", json=request, timeout=60)
        other = httpx.post(f"{url}{invocations}", json={"Records": []}, timeout=60)
        garbled = httpx.post(f"{url}{invocations}", content=b"{not json", timeout=60)
        unstrict = [
            httpx.post(f"{url}{invocations}", content=body, timeout=60).status_code
            for body in (b"NaN", b'{"a": Infinity}', b"[" * 100_000)
        ]
        queued, dry = (  # `aws lambda invoke --invocation-type Event | DryRun`
            httpx.post(
                f"{url}{invocations}",
                json=request,
                headers={"X-Amz-Invocation-Type": kind},
                timeout=60,
            )
            for kind in ("Event", "DryRun")
        )
        # one environment, taken in turn: the queued invocation runs before this one
        stats = httpx.get(f"{url}/v2/models/tiny/stats", timeout=60).json()["model_stats"][0]
    assert [(queued.status_code, queued.content), (dry.status_code, dry.content)] == [
        (202, b""),
        (204, b""),
    ]
    assert stats["inference_count"] == 2 * 2  # the rows inferred, and the queued ones
    assert (inferred.status_code, inferred.headers["x-amz-executed-version"]) == (200, "$LATEST")
    outputs = inferred.json()["outputs"]
    np.testing.assert_allclose(
        np.reshape(outputs[0]["data"], outputs[0]["shape"]), expected(bundle, ROWS), rtol=1e-5
    )
    assert other.status_code == 200 and "x-amz-function-error" not in other.headers
    assert "it got an event with keys ['Records']" in other.json()["error"]
    assert (garbled.status_code, garbled.headers["x-amzn-errortype"]) == (
        400,
        "InvalidRequestContentException",
    )
    assert garbled.json()["message"].startswith("Could not parse request body into json")
    assert unstrict == [400, 400, 400]  # the runtime could not unmarshal them (nor json, deep)


INVOCATIONS = "/2015-03-31/functions/function/invocations"
ROW_BODY = json.dumps({"rows": ROWS[:1].tolist()})
AS_AWS_SENDS = {  # events as each source sends them, through the runtime interface client
    "ALB, multi-value headers on": {
        "requestContext": {"elb": {"targetGroupArn": "arn:aws:elasticloadbalancing:tg"}},
        "httpMethod": "POST",
        "path": "/invoke",
        "multiValueQueryStringParameters": {"a": ["1", "2"]},
        "multiValueHeaders": {"content-type": ["application/json"], "x-forwarded-port": ["80"]},
        "body": ROW_BODY,
        "isBase64Encoded": False,
    },
    "REST, stage in the path, nulls for absent maps": {
        "resource": "/{proxy+}",
        "path": "/prod/invoke",
        "httpMethod": "POST",
        "headers": None,
        "multiValueHeaders": {"Content-Type": ["application/json"]},
        "queryStringParameters": None,
        "multiValueQueryStringParameters": None,
        "pathParameters": {"proxy": "invoke"},
        "stageVariables": None,
        "requestContext": {"stage": "prod", "path": "/prod/invoke", "identity": {"sourceIp": None}},
        "body": ROW_BODY,
        "isBase64Encoded": False,
    },
    "HTTP API, named stage, cookies": {
        "version": "2.0",
        "routeKey": "$default",
        "rawPath": "/prod/invoke",
        "rawQueryString": "q=%E2%9C%93",
        "cookies": ["a=1", "b=2"],
        "headers": {"content-type": "application/json", "accept": "text/html,application/json"},
        "requestContext": {
            "domainName": "abc123.execute-api.us-east-1.amazonaws.com",
            "http": {"method": "POST", "path": "/prod/invoke", "sourceIp": "192.0.2.1"},
            "stage": "prod",
        },
        "body": ROW_BODY,
        "isBase64Encoded": False,
    },
}


def test_events_as_aws_sends_them_through_the_runtime_interface_client(bundle: Bundle) -> None:
    """Each source's event on the Invoke API's path: the answer each gateway turns into HTTP,
    a 400 for a malformed HTTP event, an error payload (no function error, so no retry) for an
    event that is no HTTP request."""
    wrong_version = {**AS_AWS_SENDS["HTTP API, named stage, cookies"], "version": "3.0"}
    no_context = {"httpMethod": "GET", "path": "/v2/health/ready"}
    others = [
        {"source": "aws.events", "detail-type": "Scheduled Event", "detail": {}},
        {"source": "serverless-plugin-warmup"},
        {"Records": [{"eventSource": "aws:sqs", "messageId": "1", "body": "x"}]},
    ]
    with emulated(bundle.root) as (url, _):
        http = {
            name: httpx.post(f"{url}{INVOCATIONS}", json=event, timeout=60)
            for name, event in AS_AWS_SENDS.items()
        }
        malformed = [
            httpx.post(f"{url}{INVOCATIONS}", json=event, timeout=60).json()
            for event in (wrong_version, no_context)
        ]
        not_http = [httpx.post(f"{url}{INVOCATIONS}", json=event, timeout=60) for event in others]

    for name, answer in http.items():
        result = answer.json()
        assert result["statusCode"] == 200, (name, result)
        np.testing.assert_allclose(
            json.loads(result["body"])["y"], expected(bundle, ROWS[:1]), rtol=1e-5, atol=1e-5
        )
    alb = http["ALB, multi-value headers on"].json()
    assert (alb["statusDescription"], "headers" in alb) == ("200 OK", False)
    assert [result["statusCode"] for result in malformed] == [400, 400]
    errors = [json.loads(result["body"])["error"] for result in malformed]
    assert 'version must be "1.0" or "2.0"' in errors[0]
    assert "requestContext must be an object (missing)" in errors[1]
    for answer in not_http:
        assert answer.status_code == 200 and "x-amz-function-error" not in answer.headers
        assert answer.json()["error"].startswith("this function answers HTTP events")


def test_stopping_the_emulator_prints_no_traceback(bundle: Bundle) -> None:
    """The runtime's open long poll on the emulated Runtime API was cancelled at shutdown, and
    asyncio printed that as a traceback at every Ctrl-C."""
    with emulated(bundle.root) as (url, server):
        assert httpx.post(f"{url}/invoke", json={"rows": ROWS[:1].tolist()}).status_code == 200
    deadline = time.monotonic() + 10
    while not any("Finished server process" in line for line in server.output):
        assert time.monotonic() < deadline, "".join(server.output)
        time.sleep(0.05)
    time.sleep(0.5)  # what follows that line, if anything
    assert not any("Traceback" in line for line in server.output), "".join(server.output)


@pytest.mark.parametrize("event", ["url", "rest"])
def test_cors_is_answered_once_by_the_app_behind_each_gateway(bundle: Bundle, event: str) -> None:
    """The app owns CORS on Lambda too (the URL gets no `Cors` of its own): the preflight
    reaches it through the event, and every answer carries one Allow-Origin, not two."""
    page = "https://demo.example.com"
    asked = {"Origin": page, "Access-Control-Request-Method": "POST"}
    with emulated(bundle.root, "--event", event, "--cors-origin", page) as (url, _):
        preflight = httpx.options(f"{url}/invoke", headers=asked)
        answer = httpx.post(f"{url}/invoke", json={"rows": ROWS.tolist()}, headers={"Origin": page})
        refused = httpx.post(f"{url}/invoke", json={"rows": [[1.0]]}, headers={"Origin": page})

    assert preflight.status_code == 204, preflight.text
    assert preflight.headers["access-control-allow-methods"] == "GET, POST, OPTIONS"
    assert answer.status_code == 200 and refused.status_code == 400
    for response in (preflight, answer, refused):
        assert response.headers.get_list("access-control-allow-origin") == [page]


def test_a_bad_origin_is_refused_before_any_environment_starts(
    bundle: Bundle, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Refused once, at start, instead of failing every environment's init (each request a 502)."""
    monkeypatch.setenv("EDGESERVE_CORS_ORIGINS", "")  # serve sets it: unset again after
    args = ["serve", str(bundle.root), "--emulate", "aws-lambda", "--cors-origin", "demo.example"]
    assert main(args) == ConfigError.exit_code
    assert "'demo.example' is not an origin" in capsys.readouterr().err


def test_log_settings_are_read_and_a_change_is_refused_as_reaching_one_instance(
    bundle: Bundle,
) -> None:
    """Each instance of the function has its own loggers: a change through the function's URL
    would reach whichever instance answered it, so it is refused, saying so."""
    with emulated(bundle.root) as (url, _):
        client = triton.InferenceServerClient(url.removeprefix("http://"))
        with closing(client):
            assert client.get_log_settings()["log_verbose_level"] == 0
            with pytest.raises(InferenceServerException) as error:
                client.update_log_settings({"log_verbose_level": 1})
    assert error.value.status() == "400"
    assert "on AWS Lambda each instance of the function logs on its own" in str(
        error.value.message()
    )
