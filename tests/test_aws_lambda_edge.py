"""Lambda@Edge through the real Lambda handler (a real bundle and runtime): CloudFront's request
event served, and every answer in the shape CloudFront reads (status as text, bodyEncoding),
within what it takes back for the trigger; malformed events a 400 in that shape."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edgeserve.aws_lambda.adapter import LambdaHandler, create_handler
from edgeserve.aws_lambda.cloudfront import ORIGIN_LIMIT_BYTES, VIEWER_LIMIT_BYTES
from tests.aws_lambda_support import DELETE, changed, small_bundle

SAMPLE = Path(__file__).parent / "fixtures" / "aws_events" / "cloudfront-request.json"
CLOUDFRONT_KEYS = {"status", "statusDescription", "headers", "body", "bodyEncoding"}
WIDTH = 256


@pytest.fixture(scope="module")
def handler(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LambdaHandler]:
    # 256 outputs a row: about 5 KB of JSON each, so that a few rows pass 40 KB
    yield create_handler(small_bundle(tmp_path_factory.mktemp("edge"), width=WIDTH).root)


def edge_event(method: str, uri: str, body: bytes | None = None, trigger: str = "") -> Any:
    """AWS's sample viewer-request event, asking `method uri` with `body` (base64, as CloudFront
    hands a body over) and another trigger where given."""
    event = json.loads(SAMPLE.read_text())
    cf = event["Records"][0]["cf"]
    cf["request"].update(method=method, uri=uri, querystring="")
    if body is None:
        del cf["request"]["body"]
    else:
        cf["request"]["body"].update(data=base64.b64encode(body).decode(), encoding="base64")
        cf["request"]["headers"]["content-type"] = [
            {"key": "Content-Type", "value": "application/json"}
        ]
    if trigger:
        cf["config"]["eventType"] = trigger
    return event


def infer_body(rows: int) -> bytes:
    data = np.arange(rows * 16, dtype=np.float32).tolist()
    tensor = {"name": "x", "shape": [rows, 16], "datatype": "FP32", "data": data}
    return json.dumps({"inputs": [tensor]}).encode()


def test_aws_sample_event_is_answered_in_cloudfronts_shape(handler: LambdaHandler) -> None:
    """The sample asks GET /picture.jpg, which a function does not serve: a 404, as CloudFront
    reads an answer."""
    answer = handler(json.loads(SAMPLE.read_text()), None)

    assert set(answer) == CLOUDFRONT_KEYS
    assert answer["status"] == "404" and answer["statusDescription"] == "Not Found"
    assert answer["bodyEncoding"] == "text"


def test_an_infer_request_through_cloudfront_gets_its_outputs(handler: LambdaHandler) -> None:
    answer = handler(edge_event("POST", "/v2/models/tiny/infer", infer_body(2)), None)

    assert answer["status"] == "200", answer
    assert set(answer) == CLOUDFRONT_KEYS
    headers = answer["headers"]
    assert all(isinstance(values, list) and values[0]["value"] for values in headers.values())
    body = answer["body"]
    if answer["bodyEncoding"] == "base64":
        body = base64.b64decode(body).decode()
    outputs = json.loads(body)["outputs"]
    assert outputs[0]["shape"] == [2, WIDTH]


def test_readiness_through_cloudfront(handler: LambdaHandler) -> None:
    answer = handler(edge_event("GET", "/v2/health/ready"), None)

    assert answer["status"] == "200" and answer["statusDescription"] == "OK"


@pytest.mark.parametrize(
    ("trigger", "limit"),
    [("viewer-request", VIEWER_LIMIT_BYTES), ("origin-request", ORIGIN_LIMIT_BYTES)],
)
def test_an_answer_past_what_cloudfront_takes_back_is_a_413(
    handler: LambdaHandler, trigger: str, limit: int
) -> None:
    """Over 40 KB for a viewer request, 1 MB for an origin request, CloudFront would fail the
    answer (a 502 for the caller, who learns nothing); under it the answer goes back."""
    rows = 2 * limit // (WIDTH * 8)  # twice the limit at 8 bytes of JSON a number, at least
    answer = handler(edge_event("POST", "/v2/models/tiny/infer", infer_body(rows), trigger), None)

    assert answer["status"] == "413", answer["status"]
    assert f"over the {limit} bytes allowed" in json.loads(answer["body"])["error"]
    fits = limit // (WIDTH * 50)  # a fiftieth of the limit at 50 bytes a number, at most
    small = handler(edge_event("POST", "/v2/models/tiny/infer", infer_body(fits), trigger), None)
    assert small["status"] == "200"


def test_a_body_cloudfront_cut_short_is_a_413_not_a_parse_error(handler: LambdaHandler) -> None:
    event = edge_event("POST", "/v2/models/tiny/infer", infer_body(2)[:30])
    event["Records"][0]["cf"]["request"]["body"]["inputTruncated"] = True

    answer = handler(event, None)

    assert answer["status"] == "413"
    assert "cut by CloudFront at 40960 bytes" in json.loads(answer["body"])["error"]


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (("request",), DELETE, "Records[0].cf.request must be an object (missing)"),
        (("request", "method"), 3, "request.method must be a string (got int)"),
        (("request", "clientIp"), DELETE, "request.clientIp must be a string (missing)"),
        (("request", "querystring"), DELETE, "request.querystring must be a string (missing)"),
        (("request", "uri"), "picture.jpg", "request.uri must be a path starting with /"),
        (("request", "headers"), [], "request.headers must be an object (got list)"),
        (("request", "headers", "host"), [], "request.headers.host must be a non-empty list"),
        (("request", "headers", "accept"), [{"key": "Accept"}], "each entry must be an object"),
        (("request", "headers", "host"), [{"value": "[::1]:443"}], "expected a host name"),
        (("request", "body", "encoding"), "gzip", "must be 'base64' or 'text'"),
        (("request", "body", "data"), "!!", "encoded base64 but is not valid base64"),
    ],
)
def test_a_malformed_edge_event_gets_a_400_cloudfront_reads(
    handler: LambdaHandler, path: tuple[str, ...], value: Any, message: str
) -> None:
    """Mangum raised on each (KeyError, IndexError, ValueError); the 400 that replaced it had
    API Gateway's statusCode, which CloudFront does not read."""
    answer = handler(changed(SAMPLE.name, ("Records", 0, "cf", *path), value), None)

    assert set(answer) == CLOUDFRONT_KEYS
    assert answer["status"] == "400"
    assert answer["headers"]["content-type"][0]["value"] == "application/json"
    error = json.loads(answer["body"])["error"]
    assert error.startswith("malformed Lambda@Edge event: ") and message in error
