"""Every event gets an answer from the real Lambda handler (a real bundle and runtime): malformed
HTTP events a 400 naming the field, non-HTTP events an error payload saying what is accepted,
and a direct invocation carrying a KServe v2 infer request its v2 response."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

from edgeserve.aws_lambda.adapter import LambdaHandler, create_handler
from edgeserve.bundle import Bundle
from tests.aws_lambda_support import DELETE, changed, small_bundle


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Bundle:
    return small_bundle(tmp_path_factory.mktemp("malformed"))


@pytest.fixture(scope="module")
def handler(bundle: Bundle) -> Iterator[LambdaHandler]:
    yield create_handler(bundle.root)


URL, REST, ALB = "lambda-urls-request.json", "apigw-request.json", "alb-lambda-target-request.json"
MALFORMED_HTTP = [
    (
        changed(URL, ("requestContext", "http"), DELETE),
        "requestContext.http.method must be a string (missing)",
    ),
    (
        changed(URL, ("requestContext", "http", "method"), 5),
        "requestContext.http.method must be a string (got int)",
    ),
    (
        changed(URL, ("requestContext", "http", "path"), ["/"]),
        "requestContext.http.path must be a string (got list)",
    ),
    (changed(URL, ("headers",), "x"), "headers must map strings to strings (got str)"),
    (changed(URL, ("headers",), {"a": 1}), "headers must map strings to strings (got dict)"),
    (
        changed(URL, ("isBase64Encoded",), True),
        "body is flagged isBase64Encoded but is not valid base64",
    ),
    (changed(URL, ("body",), 123), "body must be a str (got int)"),
    (changed(URL, ("body",), {"inputs": []}), "body must be a str (got dict)"),
    (changed(URL, ("isBase64Encoded",), "yes"), "isBase64Encoded must be a bool (got str)"),
    (changed(URL, ("cookies",), "c=1"), "cookies must be a list (got str)"),
    (changed(URL, ("cookies",), [1]), "cookies must be a list of strings"),
    (changed(URL, ("rawQueryString",), 5), "rawQueryString must be a str (got int)"),
    (changed(REST, ("httpMethod",), DELETE), "httpMethod must be a string (missing)"),
    (changed(REST, ("path",), None), "path must be a string (missing)"),
    (
        changed(REST, ("multiValueHeaders",), {"a": "b"}),
        "multiValueHeaders must map strings to lists of strings",
    ),
    (
        changed(REST, ("queryStringParameters",), []),
        "queryStringParameters must map strings to strings (got list)",
    ),
    (changed(REST, ("requestContext",), ["x"]), "requestContext must be an object (got list)"),
    (changed(REST, ("requestContext",), None), "requestContext must be an object (missing)"),
    (
        changed(URL, ("rawPath",), "/v2/models/\ud800/ready"),
        "rawPath holds a lone surrogate, which is not text",
    ),
    (
        changed(REST, ("headers", "Accept"), "text/\ud800"),
        "headers.Accept holds a lone surrogate",
    ),
    (
        changed(REST, ("headers", "Host"), "[::1]:8080"),
        "headers.host '[::1]:8080': expected a host name and an optional numeric port",
    ),
    (changed(ALB, ("headers", "host"), "h:abc"), "headers.host 'h:abc': expected a host name"),
    (
        changed(URL, ("headers", "x-forwarded-port"), "abc"),
        "headers.x-forwarded-port 'abc': expected a port number",
    ),
    (changed(REST, ("requestContext", "identity"), "x"), "AttributeError"),
    (changed(ALB, ("path",), DELETE), "malformed ALB event: path must be a string (missing)"),
    (
        changed(ALB, ("httpMethod",), []),
        "malformed ALB event: httpMethod must be a string (got list)",
    ),
    (
        {"version": "1.0", "requestContext": {}, "path": "/"},
        "HTTP API (1.0) event: httpMethod must be a string",
    ),
    # was "httpMethod must be a string (missing)", as if it were a 1.0 event
    (changed(URL, ("version",), "3.0"), 'version must be "1.0" or "2.0" (got \'3.0\')'),
    (changed(URL, ("version",), 2.0), 'version must be "1.0" or "2.0" (got 2.0)'),
    # these were no HTTP events at all: an error payload, which the caller took for the answer
    (changed(URL, ("requestContext",), DELETE), "requestContext must be an object (missing)"),
    (changed(REST, ("requestContext",), DELETE), "requestContext must be an object (missing)"),
    ({"httpMethod": "GET", "path": "/"}, "requestContext must be an object (missing)"),
]


@pytest.mark.parametrize(("event", "message"), MALFORMED_HTTP)
def test_a_malformed_http_event_gets_a_400_naming_the_field(
    handler: LambdaHandler, event: dict[str, Any], message: str
) -> None:
    answer = handler(event, None)

    assert answer["statusCode"] == 400, answer
    assert message in json.loads(answer["body"])["error"]


NOT_HTTP = [
    ({}, "an event with keys []"),
    ([], "a list"),
    ("ping", "a str"),
    (None, "a NoneType"),
    (42, "a int"),
    ({"Records": [{"s3": {"bucket": {"name": "b"}}}]}, "keys ['Records']"),
    ({"Records": [{"eventSource": "aws:sqs", "body": "x"}]}, "keys ['Records']"),
    ({"Records": []}, "keys ['Records']"),
    ({"Records": ["x"]}, "keys ['Records']"),
    ({"source": "aws.events", "detail-type": "Scheduled Event"}, "keys ['detail-type', 'source']"),
]


@pytest.mark.parametrize(("event", "found"), NOT_HTTP)
def test_a_non_http_invocation_gets_an_error_payload_saying_what_is_accepted(
    handler: LambdaHandler, event: Any, found: str
) -> None:
    answer = handler(event, None)

    assert set(answer) == {"error"}
    assert "answers HTTP events (API Gateway REST or HTTP API" in answer["error"]
    assert found in answer["error"].split("; it got ")[1]


def test_null_optional_fields_are_absent_fields(handler: LambdaHandler) -> None:
    event = changed(REST, ("path",), "/v2/health/live")
    event.update(httpMethod="GET", headers=None, multiValueHeaders=None, body=None)
    event.update(queryStringParameters=None, multiValueQueryStringParameters=None)

    assert handler(event, None)["statusCode"] == 200


@pytest.mark.parametrize(
    "where",
    [("requestContext", "identity"), ("headers", "X-Empty"), ("queryStringParameters", "a")],
)
def test_a_null_inside_the_event_is_an_absent_field(
    handler: LambdaHandler, where: tuple[str, str]
) -> None:
    """requestContext.identity of null was a 400 "AttributeError 'NoneType' object has no
    attribute 'get'"; a header or query parameter of null, "must map strings to strings"."""
    event = changed(REST, ("path",), "/v2/health/live")
    event.update(httpMethod="GET", body=None, multiValueHeaders=None)
    event.update(multiValueQueryStringParameters=None)
    event[where[0]] = {**(event.get(where[0]) or {}), where[1]: None}

    assert handler(event, None)["statusCode"] == 200


@pytest.mark.parametrize("headers", [None, DELETE])
def test_an_alb_event_without_headers_is_served(handler: LambdaHandler, headers: Any) -> None:
    """Mangum read an ALB event's `headers` unconditionally: a 400 "missing field 'headers'"."""
    event = changed(ALB, ("headers",), headers)
    event.update(path="/v2/health/live", multiValueHeaders=None)

    assert handler(event, None)["statusCode"] == 200


def test_a_hand_written_rest_event_without_a_resource_is_served(handler: LambdaHandler) -> None:
    """It was an error payload (Mangum infers a REST event from its `resource`): AWS always
    sends it, a test event written by hand may leave it out."""
    event = {"httpMethod": "GET", "path": "/v2/health/ready", "requestContext": {}}

    assert handler(event, None)["statusCode"] == 200


def test_a_hand_written_2_0_event_lacking_what_aws_always_sends_is_served(
    handler: LambdaHandler,
) -> None:
    """A test event written by hand: no sourceIp (Mangum read it unconditionally: a 400
    "missing field 'sourceIp'"), and the path given once, as rawPath or as
    requestContext.http.path (the other was a 400 "must be a string (missing)")."""
    body = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 16],
                                   "data": [0.5] * 16}]})  # fmt: skip
    path = "/v2/models/tiny/infer"
    by_raw_path = {"version": "2.0", "rawPath": path, "body": body,
                   "requestContext": {"http": {"method": "POST"}}}  # fmt: skip
    by_context = {"version": "2.0", "body": body,
                  "requestContext": {"http": {"method": "POST", "path": path}}}  # fmt: skip
    for event in (by_raw_path, by_context):
        answer = handler(event, None)
        assert answer["statusCode"] == 200, answer["body"]
        assert json.loads(answer["body"])["outputs"][0]["shape"] == [1, 4]


def test_a_direct_v2_infer_request_is_answered_like_the_http_route(
    handler: LambdaHandler, bundle: Bundle
) -> None:
    rows = np.linspace(-1, 1, 32, dtype=np.float32).reshape(2, 16)
    tensor = {"name": "x", "shape": [2, 16], "datatype": "FP32", "data": rows.ravel().tolist()}
    request = {"inputs": [tensor]}
    reference = ort.InferenceSession(str(bundle.model_path)).run(None, {"x": rows})[0]

    answer = handler(request, None)

    assert answer["model_name"] == "tiny"
    (output,) = answer["outputs"]
    assert (output["name"], output["shape"], output["datatype"]) == ("y", [2, 4], "FP32")
    np.testing.assert_allclose(np.reshape(output["data"], (2, 4)), reference, rtol=1e-5, atol=1e-5)


def test_a_bad_direct_v2_request_gets_the_v2_error_and_its_status(handler: LambdaHandler) -> None:
    request = {"inputs": [{"name": "nope", "shape": [1], "datatype": "FP32", "data": [1.0]}]}

    answer = handler(request, None)

    assert answer["status"] == 400
    assert "nope" in answer["error"]


def test_direct_inputs_that_are_not_a_list_are_named_as_such(handler: LambdaHandler) -> None:
    """It was told the function takes "a KServe v2 infer request ({"inputs": [...]})" and
    that it sent "an event with keys ['inputs']"."""
    for inputs in ({"name": "x"}, "not a list"):
        answer = handler({"inputs": inputs}, None)

        assert answer["status"] == 400, answer
        assert "`inputs`" in answer["error"] and "expected" in answer["error"]
        assert "an event with keys" not in answer["error"]


@pytest.mark.parametrize(
    "asked",
    [
        {"parameters": {"binary_data_output": True}},
        {"outputs": [{"name": "y", "parameters": {"binary_data": True}}]},
    ],
)
def test_a_direct_request_for_binary_outputs_is_told_the_answer_is_json(
    handler: LambdaHandler, asked: dict[str, object]
) -> None:
    """The answer to a direct invocation is JSON: binary tensors made the handler itself raise
    (a UnicodeDecodeError out of Lambda) before."""
    tensor = {"name": "x", "shape": [1, 16], "datatype": "FP32", "data": [0.5] * 16}

    answer = handler({"inputs": [tensor], **asked}, None)

    assert answer == {
        "error": "a direct invocation is answered in JSON: leave out binary_data and "
        "binary_data_output (or call the function's URL, which carries binary tensors)",
        "status": 400,
    }


def test_a_direct_request_with_binary_inputs_is_told_it_has_no_binary_part(
    handler: LambdaHandler,
) -> None:
    """It was told `binary_data_size 64 runs past the body`, of a body it never had."""
    tensor = {"name": "x", "shape": [1, 16], "datatype": "FP32"}

    answer = handler({"inputs": [{**tensor, "parameters": {"binary_data_size": 64}}]}, None)

    assert answer == {
        "error": "a direct invocation is a JSON event, with no binary part: give each input its "
        "`data` instead of binary_data_size (or call the function's URL, which carries binary "
        "tensors)",
        "status": 400,
    }
