"""What the real Lambda handler hands back to each source: an answer past the source's
response limit is a 413 the caller reads (not a failed invocation, which the caller sees as a
502 with no body), and an ALB's answer carries its status line."""

from __future__ import annotations

import json
from collections.abc import Iterator
from http import HTTPStatus
from pathlib import Path
from typing import Any

import pytest

from edgeserve.aws_lambda.adapter import LambdaHandler, create_handler
from edgeserve.aws_lambda.settings import ALB_RESPONSE_LIMIT_BYTES, RESPONSE_LIMIT_BYTES
from tests.aws_lambda_support import HANDLER, small_bundle

FIXTURES = Path(__file__).parent / "fixtures" / "aws_events"
WIDTH = 4096
"""Outputs per row: a row's answer is about 45 kB of JSON numbers."""
ROW_BYTES = 40_000
"""Fewer JSON bytes than a row's answer takes, so that rows(limit) rows pass the limit."""


@pytest.fixture(scope="module")
def handler(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LambdaHandler]:
    yield create_handler(small_bundle(tmp_path_factory.mktemp("wide"), width=WIDTH).root)


def infer_request(rows: int) -> dict[str, Any]:
    tensor = {"name": "x", "shape": [rows, 16], "datatype": "FP32", "data": [0.5] * 16 * rows}
    return {"inputs": [tensor]}


def rows(limit: int) -> int:
    return limit // ROW_BYTES + 1


def sample(name: str, body: dict[str, Any]) -> dict[str, Any]:
    """AWS's sample event of `name`, posting `body` to the v2 infer route."""
    event: dict[str, Any] = json.loads((FIXTURES / name).read_text())
    path = "/v2/models/tiny/infer"
    if "rawPath" in event:
        http = {**event["requestContext"]["http"], "path": path, "method": "POST"}
        event.update(rawPath=path, requestContext={**event["requestContext"], "http": http})
    else:
        event.update(path=path, httpMethod="POST")
    return {**event, "body": json.dumps(body), "isBase64Encoded": False}


def refused(answer: dict[str, Any], limit: int) -> str:
    assert answer["statusCode"] == 413, answer["statusCode"]
    error: str = json.loads(answer["body"])["error"]
    assert f"over the {limit} bytes allowed" in error
    assert error.endswith("Hint: send fewer items per request")
    return error


@pytest.mark.parametrize(
    "name",
    ["apigw-request.json", "lambda-urls-request.json", "apigw-v2-request-no-authorizer.json"],
)
def test_an_answer_past_lambdas_6_mb_is_a_413(handler: LambdaHandler, name: str) -> None:
    """Lambda failed the invocation (Function.ResponseSizeTooLarge): a 502 with no body."""
    answer = handler(sample(name, infer_request(rows(RESPONSE_LIMIT_BYTES))), None)

    assert answer["headers"] == {"content-type": "application/json"}
    assert "API Gateway" in refused(answer, RESPONSE_LIMIT_BYTES)


def test_an_answer_past_an_albs_1_mb_is_a_413_in_the_albs_format(handler: LambdaHandler) -> None:
    """An ALB takes 1 MB of response JSON from a Lambda target, and answered 502 past it."""
    request = infer_request(rows(ALB_RESPONSE_LIMIT_BYTES))

    answer = handler(sample("alb-lambda-target-request.json", request), None)

    refused(answer, ALB_RESPONSE_LIMIT_BYTES)
    assert answer["multiValueHeaders"] == {"content-type": ["application/json"]}
    assert answer["statusDescription"] == f"413 {HTTPStatus(413).phrase}"
    assert handler(sample("apigw-request.json", request), None)["statusCode"] == 200


def test_a_direct_answer_past_6_mb_is_an_error_payload(handler: LambdaHandler) -> None:
    answer = handler(infer_request(rows(RESPONSE_LIMIT_BYTES)), None)

    assert answer["status"] == 413
    assert f"over the {RESPONSE_LIMIT_BYTES} bytes allowed" in answer["error"]


def test_answers_within_the_limits_go_back_whole(handler: LambdaHandler) -> None:
    answer = handler(infer_request(2), None)

    assert answer["outputs"][0]["shape"] == [2, WIDTH]
    assert "status" not in answer


def test_an_answer_at_lambdas_response_limit_goes_back_and_one_byte_more_is_a_413(
    tmp_path: Path,
) -> None:
    """Lambda carries answers up to 6,291,556 bytes of JSON, 100 more than a request may have:
    an answer of 6,291,457 to 6,291,556 bytes was refused with a 413 that Lambda would have
    carried."""
    padded = create_handler(small_bundle(tmp_path, handler=HANDLER).root)
    event = sample("lambda-urls-request.json", {})
    http = {**event["requestContext"]["http"], "path": "/invoke"}
    event.update(rawPath="/invoke", requestContext={**event["requestContext"], "http": http})
    event["headers"] = {**event["headers"], "content-type": "application/json"}

    def answer(pad: int) -> dict[str, Any]:
        body = json.dumps({"rows": [[0.5] * 16], "pad_bytes": pad})
        return padded({**event, "body": body}, None)

    rest = len(json.dumps(answer(10**6))) - 10**6  # content-length has 7 digits either way
    pad = RESPONSE_LIMIT_BYTES - rest
    at_limit = answer(pad)

    assert len(json.dumps(at_limit)) == RESPONSE_LIMIT_BYTES == 6_291_556
    assert at_limit["statusCode"] == 200
    refused(answer(pad + 1), RESPONSE_LIMIT_BYTES)
