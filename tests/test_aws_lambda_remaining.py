"""An invocation's time left (edgeserve/aws_lambda/remaining.py): the real handler answers a
request still running shortly before Lambda's timeout with a 504 of its own, under the runtime
interface client's own context object (its deadline as Lambda gives it)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from awslambdaric.lambda_context import LambdaContext

from edgeserve.aws_lambda.adapter import LambdaHandler, create_handler
from edgeserve.aws_lambda.remaining import RESERVE_S
from tests.aws_lambda_support import HANDLER, small_bundle

FIXTURES = Path(__file__).parent / "fixtures" / "aws_events"


@pytest.fixture
def handler(tmp_path: Path) -> Iterator[LambdaHandler]:
    """A fresh one each time: a hook that proved cheap runs on the event loop, where a sudden
    stall cannot be cut off (remaining.py), and the test's slow calls stall from the start."""
    yield create_handler(small_bundle(tmp_path, handler=HANDLER).root)


def invocation(left_s: float) -> LambdaContext:
    """The context Lambda's runtime client hands the handler, `left_s` before the timeout."""
    return LambdaContext("request-1", None, None, int((time.time() + left_s) * 1000))


def posted(name: str, body: dict[str, Any], origin: str | None = None) -> dict[str, Any]:
    """AWS's sample event of `name`, posting `body` as JSON to /invoke."""
    event: dict[str, Any] = json.loads((FIXTURES / name).read_text())
    headers = {"content-type": "application/json", **({"origin": origin} if origin else {})}
    if "rawPath" in event:
        http = {**event["requestContext"]["http"], "path": "/invoke", "method": "POST"}
        event.update(rawPath="/invoke", requestContext={**event["requestContext"], "http": http})
        event["headers"] = {**event["headers"], **headers}
    else:
        event.update(path="/invoke", httpMethod="POST", headers=headers, multiValueHeaders=None)
    return {**event, "body": json.dumps(body), "isBase64Encoded": False}


ROW = [[0.5] * 16]


@pytest.mark.parametrize(
    "name",
    ["lambda-urls-request.json", "apigw-request.json", "alb-lambda-target-request.json"],
)
def test_a_request_running_into_lambdas_timeout_gets_a_504_before_it(
    handler: LambdaHandler, name: str
) -> None:
    """It ran on: Lambda stopped the invocation at its timeout (the caller got the gateway's
    bare 502 or 504) and replaced the environment, the next request waiting for a cold start."""
    started = time.monotonic()
    answer = handler(posted(name, {"rows": ROW, "sleep_s": 3}), invocation(1.5))
    took = time.monotonic() - started

    assert answer["statusCode"] == 504
    assert 1.5 - RESERVE_S - 0.1 < took < 1.5 - RESERVE_S + 0.4
    error = json.loads(answer["body"])["error"]
    assert "the invocation's time ran out: Lambda stops the function at its timeout" in error
    assert "Hint: raise timeout_s in the aws-lambda target profile" in error
    # the same environment goes on serving
    assert handler(posted(name, {"rows": ROW}), invocation(1.5))["statusCode"] == 200


def test_a_request_within_its_time_is_answered_and_one_without_a_deadline_is_unbounded(
    handler: LambdaHandler,
) -> None:
    event = posted("apigw-request.json", {"rows": ROW, "sleep_s": 0.3})

    assert handler(event, invocation(1.0))["statusCode"] == 200
    assert handler(event, None)["statusCode"] == 200
    # a context with no deadline in it (none left, as Lambda never invokes): unbounded
    assert handler(event, LambdaContext("request-2", None, None, 0))["statusCode"] == 200


def test_the_504_carries_the_cors_headers_of_the_functions_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EDGESERVE_CORS_ORIGINS", "https://app.example")
    cors = create_handler(small_bundle(tmp_path, handler=HANDLER).root)
    event = posted("lambda-urls-request.json", {"rows": ROW, "sleep_s": 2}, "https://app.example")

    answer = cors(event, invocation(0.8))

    assert answer["statusCode"] == 504
    assert answer["headers"]["access-control-allow-origin"] == "https://app.example"


@pytest.mark.parametrize("name", ["lambda-urls-request.json", "apigw-request.json"])
def test_the_handlers_own_refusals_carry_the_cors_headers_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    """A body flagged base64 that is not, refused by the handler before the app: its 400
    carried no CORS header, so a browser showed the page a CORS failure, not the error."""
    monkeypatch.setenv("EDGESERVE_CORS_ORIGINS", "https://app.example")
    cors = create_handler(small_bundle(tmp_path, handler=HANDLER).root)
    allowed = posted(name, {"rows": ROW}, "https://app.example")
    other = posted(name, {"rows": ROW}, "https://elsewhere.example")
    for event in (allowed, other):
        event.update(body="not base64!", isBase64Encoded=True)

    answer = cors(allowed, invocation(5))

    assert answer["statusCode"] == 400
    assert "not valid base64" in json.loads(answer["body"])["error"]
    assert answer["headers"]["access-control-allow-origin"] == "https://app.example"
    assert "access-control-allow-origin" not in cors(other, invocation(5))["headers"]
