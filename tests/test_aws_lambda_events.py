"""Lambda events in and out: AWS's published sample events through the Lambda handler (whole
response dicts compared), and the emulator's HTTP <-> event translation, table-driven."""

from __future__ import annotations

import asyncio
import base64
import gzip
import io
import json
import zlib
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import onnxruntime as ort
import pytest
from PIL import Image
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from edgeserve.aws_lambda.adapter import create_handler, wrap
from edgeserve.aws_lambda.events import (
    ALB_TOO_LARGE,
    EVENT_KINDS,
    TARGET_GROUP,
    UNSUPPORTED,
    HttpRequest,
    HttpResponse,
    from_result,
    through_gateway,
    to_event,
)
from tests.aws_lambda_support import small_bundle

FIXTURES = Path(__file__).parent / "fixtures" / "aws_events"
BINARY_TYPES = ("image/png", "application/msgpack")


async def echo(request: Request) -> Response:
    """Binary bodies come back as they are; anything else is described as JSON."""
    body = await request.body()
    content_type = request.headers.get("content-type", "")
    if content_type in BINARY_TYPES:
        return Response(body, media_type=content_type)
    return JSONResponse(
        {
            "method": request.method,
            "path": request.url.path,
            "query": sorted(request.query_params.multi_items()),
            "body": body.decode(),
            "cookies": request.headers.get("cookie"),
        }
    )


ECHO = wrap(Starlette(routes=[Route("/{path:path}", echo, methods=["GET", "POST"])]))


def fixture(name: str) -> dict[str, Any]:
    event: dict[str, Any] = json.loads((FIXTURES / name).read_text())
    return event


def json_body(**fields: Any) -> str:
    return json.dumps(fields, separators=(",", ":"))


SAMPLES = [
    (
        "lambda-urls-request.json",
        {
            "statusCode": 200,
            "headers": {"content-length": "173", "content-type": "application/json"},
            "body": json_body(
                method="POST",
                path="/my/path",
                query=[["parameter1", "value1"], ["parameter1", "value2"], ["parameter2", "value"]],
                body="Hello from client!",
                cookies="cookie1; cookie2",
            ),
            "isBase64Encoded": False,
        },
    ),
    (
        "apigw-v2-request-no-authorizer.json",
        {
            "statusCode": 200,
            "headers": {"content-length": "63", "content-type": "application/json"},
            "body": json_body(method="GET", path="/", query=[], body="", cookies=None),
            "isBase64Encoded": False,
        },
    ),
    (
        "apigw-request.json",
        {
            "statusCode": 200,
            "headers": {"content-length": "108", "content-type": "application/json"},
            "multiValueHeaders": {},
            "body": json_body(
                method="POST",
                path="/hello/world",
                query=[["name", "me"]],
                body='{\r\n\t"a": 1\r\n}',
                cookies=None,
            ),
            "isBase64Encoded": False,
        },
    ),
    (
        "alb-lambda-target-request.json",
        {
            "statusCode": 200,
            # the sample carries multiValueHeaders, so the answer does too (and its query wins)
            "multiValueHeaders": {"content-length": ["86"], "content-type": ["application/json"]},
            "body": json_body(
                method="GET", path="/", query=[["name", "me"]], body="Who there?", cookies=None
            ),
            "isBase64Encoded": False,
            "statusDescription": "200 OK",
        },
    ),
]


@pytest.mark.parametrize(("name", "response"), SAMPLES, ids=[name for name, _ in SAMPLES])
def test_aws_sample_events_through_the_handler(name: str, response: dict[str, Any]) -> None:
    assert ECHO(fixture(name), None) == response


def png_bytes() -> bytes:
    out = io.BytesIO()
    Image.fromarray((np.arange(16, dtype=np.uint8) * 16).reshape(4, 4), mode="L").save(
        out, format="PNG"
    )
    return out.getvalue()


def with_binary_body(event: dict[str, Any], body: bytes, content_type: str) -> dict[str, Any]:
    """The sample event carrying a binary body, as the gateways send one (base64)."""
    event = {
        **event,
        "body": base64.b64encode(body).decode(),
        "isBase64Encoded": True,
        "httpMethod": "POST",
    }
    for key in ("headers", "multiValueHeaders"):
        if key in event:
            single = [content_type] if key == "multiValueHeaders" else content_type
            event[key] = {k: v for k, v in event[key].items() if k.lower() != "content-type"}
            event[key]["content-type"] = single
    if "requestContext" in event and "http" in event["requestContext"]:
        event["requestContext"] = {
            **event["requestContext"],
            "http": {**event["requestContext"]["http"], "method": "POST"},
        }
    return event


BINARY = [
    (name, body, kind)
    for name, _ in SAMPLES
    for body, kind in (
        (png_bytes(), "image/png"),
        (msgpack.packb({"rows": [[1.5] * 16]}), "application/msgpack"),
    )
]


@pytest.mark.parametrize(("name", "body", "content_type"), BINARY)
def test_binary_bodies_round_trip_base64_through_every_sample(
    name: str, body: bytes, content_type: str
) -> None:
    result = ECHO(with_binary_body(fixture(name), body, content_type), None)

    headers = {"content-length": str(len(body)), "content-type": content_type}
    if name.startswith("alb"):
        expected = {
            "statusCode": 200,
            "statusDescription": "200 OK",
            "multiValueHeaders": {k: [v] for k, v in headers.items()},
        }
    elif name == "apigw-request.json":
        expected = {"statusCode": 200, "headers": headers, "multiValueHeaders": {}}
    else:
        expected = {"statusCode": 200, "headers": headers}
    assert result == {**expected, "body": base64.b64encode(body).decode(), "isBase64Encoded": True}


def staged(
    event: dict[str, Any], stage: str, path: str, domain: str | None = None
) -> dict[str, Any]:
    """The sample as the gateway sends it on `stage`, for `path` (as it arrives), from `domain`."""
    context = {**event["requestContext"], "stage": stage}
    if domain is not None:
        context["domainName"] = domain
    if "rawPath" in event:
        context["http"] = {**context["http"], "path": path}
        return {**event, "rawPath": path, "requestContext": context}
    return {**event, "path": path, "requestContext": context}


def echoed_get(path: str, *, rest: bool) -> dict[str, Any]:
    """ECHO's whole answer to a GET of `path` without a body: REST and HTTP API 1.0 events
    with the REST sample's query, 2.0 ones with none."""
    query = [["name", "me"]] if rest else []
    body = json_body(method="GET", path=path, query=query, body="", cookies=None)
    headers = {"content-length": str(len(body)), "content-type": "application/json"}
    if rest:
        return {
            "statusCode": 200,
            "headers": headers,
            "multiValueHeaders": {},
            "body": body,
            "isBase64Encoded": False,
        }
    return {"statusCode": 200, "headers": headers, "body": body, "isBase64Encoded": False}


def rest_on_stage(stage: str, path: str) -> dict[str, Any]:
    """A GET of `path` through resource /{proxy+} of a REST API's own endpoint on `stage`:
    `path` without the stage, requestContext.path with it."""
    context = {**REST_GET["requestContext"], "stage": stage, "path": f"/{stage}{path}"}
    proxy = {"proxy": path.removeprefix("/")}
    return {**REST_GET, "path": path, "pathParameters": proxy, "requestContext": context}


V2, REST = "apigw-v2-request-no-authorizer.json", "apigw-request.json"
REST_GET = {**fixture(REST), "httpMethod": "GET", "body": None}
HTTP_V1_GET = {**REST_GET, "version": "1.0"}
ROUTED = [
    # an HTTP API's own endpoint keeps a named stage in the path (2.0 and 1.0 payloads)
    (staged(fixture(V2), "prod", "/prod/v2/health/ready"), "/v2/health/ready", False),
    (staged(fixture(V2), "prod", "/prod"), "/", False),
    (staged(HTTP_V1_GET, "prod", "/prod/v2/health/ready"), "/v2/health/ready", True),
    # a custom domain's API mapping chose the stage: a path that starts like it is the route's
    (staged(fixture(V2), "v2", "/v2/health/ready", "api.example.com"), "/v2/health/ready", False),
    # the one route named like the stage, on a stage that is $default: nothing to take away
    (staged(fixture(V2), "$default", "/prod/x"), "/prod/x", False),
    # a REST API's base path mapping (`ml`) on a custom domain, resource /{proxy+}
    ({**REST_GET, "path": "/ml/hello/world"}, "/hello/world", True),
    ({**REST_GET, "path": "/ml", "resource": "/", "pathParameters": None}, "/", True),
    # the REST API's own endpoint: the stage is never in `path`
    ({**REST_GET, "path": "/hello/world"}, "/hello/world", True),
    # ... unless the event carries it there, as requestContext.path does (stage testStage)
    ({**REST_GET, "path": "/testStage/hello/world"}, "/hello/world", True),
    ({**REST_GET, "path": "/testStage/hello/world", "pathParameters": None}, "/hello/world", True),
    # a stage named like the path's first segment, which the resource's path makes whole
    (rest_on_stage("v2", "/v2/health/ready"), "/v2/health/ready", True),
    (rest_on_stage("invoke", "/invoke"), "/invoke", True),
]
ROUTED_IDS = [
    "http-api-stage",
    "http-api-stage-root",
    "http-api-1.0-stage",
    "custom-domain-stage-named-like-a-route",
    "default-stage",
    "rest-base-path",
    "rest-base-path-root",
    "rest-own-endpoint",
    "rest-stage-in-path",
    "rest-stage-in-path-no-parameters",
    "rest-stage-named-like-the-path",
    "rest-stage-named-like-the-route",
]


@pytest.mark.parametrize(("event", "path", "rest"), ROUTED, ids=ROUTED_IDS)
def test_the_routes_see_the_path_without_the_gateways_prefix(
    event: dict[str, Any], path: str, rest: bool
) -> None:
    """A named stage or a base path mapping put in front of every path made every request a
    404 behind an HTTP API stage or a REST API's custom domain, and a REST event whose path
    carried its stage a 404."""
    assert ECHO(event, None) == echoed_get(path, rest=rest)


def as_head(event: dict[str, Any]) -> dict[str, Any]:
    """`event` with its method HEAD and no body."""
    if "rawPath" in event:
        context = event["requestContext"]
        http = {**context["http"], "method": "HEAD"}
        return {**event, "body": None, "requestContext": {**context, "http": http}}
    return {**event, "httpMethod": "HEAD", "body": None}


@pytest.mark.parametrize(
    "name",
    ["lambda-urls-request.json", "apigw-request.json", "alb-lambda-target-request.json"],
)
def test_a_head_request_is_answered_without_a_body(name: str) -> None:
    """The answer to a GET, headers and status, with no body: the JSON went along."""
    answer = ECHO(as_head(fixture(name)), None)
    assert answer["statusCode"] == 200
    assert (answer["body"], answer["isBase64Encoded"]) == ("", False)
    headers = answer.get("headers") or {
        key: values[-1] for key, values in answer["multiValueHeaders"].items()
    }
    assert headers["content-type"] == "application/json"


ALB = "alb-lambda-target-request.json"
ALB_SINGLE = {
    key: value
    for key, value in fixture(ALB).items()
    if key not in ("multiValueHeaders", "multiValueQueryStringParameters")
}
NOT_BASE64 = {"body": "not base64!", "isBase64Encoded": True}
REFUSED = json.dumps(
    {"error": "malformed ALB event: body is flagged isBase64Encoded but is not valid base64"}
)


ALB_HEALTH_CHECK = {  # as an ALB sends it to a Lambda target: its user agent, no Host
    "requestContext": {"elb": {"targetGroupArn": TARGET_GROUP}},
    "httpMethod": "GET",
    "path": "/",
    "queryStringParameters": {},
    "headers": {"user-agent": "ELB-HealthChecker/2.0"},
    "body": "",
    "isBase64Encoded": False,
}
MULTI_VALUE_HEALTH_CHECK = {
    **{key: value for key, value in ALB_HEALTH_CHECK.items() if key != "headers"},
    "multiValueQueryStringParameters": {},
    "multiValueHeaders": {"user-agent": ["ELB-HealthChecker/2.0"]},
}


@pytest.mark.parametrize("check", [ALB_HEALTH_CHECK, MULTI_VALUE_HEALTH_CHECK])
def test_an_albs_health_check_at_its_default_path_asks_the_readiness_route(
    tmp_path: Path, check: dict[str, Any]
) -> None:
    """A target group's health check asks GET / unless told otherwise, and the function served
    no `/`: a 404, and the target was reported unhealthy."""
    handler = create_handler(small_bundle(tmp_path).root)
    browser = {**ALB_HEALTH_CHECK, "headers": {"user-agent": "Mozilla/5.0"}}

    answer = handler(check, None)

    assert (answer["statusCode"], answer["statusDescription"]) == (200, "200 OK")
    assert ("multiValueHeaders" in answer) == ("multiValueHeaders" in check)
    assert handler({**check, "path": "/v2/health/ready"}, None)["statusCode"] == 200
    assert handler(browser, None)["statusCode"] == 404


@pytest.mark.parametrize(
    ("event", "headers"),
    [
        (
            {**fixture(ALB), **NOT_BASE64},
            {"multiValueHeaders": {"content-type": ["application/json"]}},
        ),
        ({**ALB_SINGLE, **NOT_BASE64}, {"headers": {"content-type": "application/json"}}),
    ],
    ids=["multi-value-headers-on", "multi-value-headers-off"],
)
def test_the_handlers_own_400_to_an_alb_uses_the_headers_field_the_alb_reads(
    event: dict[str, Any], headers: dict[str, Any]
) -> None:
    """With multi-value headers on, an ALB reads the response's multiValueHeaders alone: the
    handler's own 400 carried `headers`, so its content-type was lost."""
    assert ECHO(event, None) == {
        "statusCode": 400,
        "statusDescription": "400 Bad Request",
        **headers,
        "body": REFUSED,
        "isBase64Encoded": False,
    }


ROWS_JSON = b'{"rows": [[0.5, 0.25]]}'


def coded(coding: str, body: bytes, content_type: str = "application/json") -> HttpRequest:
    headers = [("content-type", content_type), ("content-encoding", coding)]
    return HttpRequest("POST", "/invoke", "", headers, body)


GATEWAYS = [
    ("rest", coded("gzip", gzip.compress(ROWS_JSON)), coded("gzip", ROWS_JSON)),
    ("rest", coded("deflate", zlib.compress(ROWS_JSON)), coded("deflate", ROWS_JSON)),
    ("rest", coded("GZIP ", gzip.compress(ROWS_JSON)), coded("GZIP ", ROWS_JSON)),
    ("rest", coded("identity", ROWS_JSON), coded("identity", ROWS_JSON)),
    ("rest", coded("br", b"\x0b\x02\x80"), UNSUPPORTED),
    ("rest", coded("gzip", ROWS_JSON), UNSUPPORTED),  # says gzip, is not
    ("url", coded("gzip", gzip.compress(ROWS_JSON)), coded("gzip", gzip.compress(ROWS_JSON))),
    ("alb", coded("br", b"\x0b\x02\x80"), coded("br", b"\x0b\x02\x80")),
    # an ALB sends a Lambda target bodies of 1 MB at most (it passed them on)
    ("alb", coded("identity", b"x" * 2**20), coded("identity", b"x" * 2**20)),
    ("alb", coded("identity", b"x" * (2**20 + 1)), ALB_TOO_LARGE),
    ("url", coded("identity", b"x" * (2**20 + 1)), coded("identity", b"x" * (2**20 + 1))),
]


@pytest.mark.parametrize(("kind", "request_", "passed"), GATEWAYS)
def test_the_gateway_decompresses_or_refuses_a_body_before_the_function(
    kind: Any, request_: HttpRequest, passed: HttpRequest | HttpResponse
) -> None:
    assert through_gateway(request_, kind) == passed


def test_a_rest_body_the_gateway_decompressed_is_not_gunzipped_again(tmp_path: Path) -> None:
    """API Gateway REST hands the function the decompressed body with Content-Encoding: gzip
    still in the headers: the function gunzipped plain JSON and answered 400."""
    handler = create_handler(small_bundle(tmp_path).root)
    request = {"inputs": [{"name": "x", "shape": [1, 16], "datatype": "FP32", "data": [0.5] * 16}]}
    plain = _to_path(
        {**fixture("apigw-request.json"), "body": json.dumps(request)}, "/v2/models/tiny/infer"
    )
    decompressed = json.loads(json.dumps(plain))
    decompressed["headers"]["Content-Encoding"] = "gzip"
    decompressed["multiValueHeaders"]["Content-Encoding"] = ["gzip"]

    answer = handler(plain, None)
    assert answer["statusCode"] == 200
    assert handler(decompressed, None) == answer


REQUEST = HttpRequest(
    method="POST",
    path="/invoke",
    query="a=1&a=2&b=3",
    headers=[
        ("content-type", "image/png"),
        ("user-agent", "curl/8"),
        ("cookie", "s=1; t=2"),
        ("x-k", "1"),
        ("x-k", "2"),
    ],
    body=b"\x89PNG",
    source_ip="10.0.0.9",
)


def test_function_url_event_whole() -> None:
    assert to_event(REQUEST, "url", "req-1", now=1700000000.5) == {
        "version": "2.0",
        "routeKey": "$default",
        "rawPath": "/invoke",
        "rawQueryString": "a=1&a=2&b=3",
        "cookies": ["s=1", "t=2"],
        "headers": {
            "content-type": "image/png",
            "user-agent": "curl/8",
            "x-k": "1,2",
            "host": "edgeserve0emulator0url0id000000.lambda-url.us-east-1.on.aws",
        },
        "queryStringParameters": {"a": "1,2", "b": "3"},
        "requestContext": {
            "accountId": "anonymous",
            "apiId": "edgeserve0emulator0url0id000000",
            "domainName": "edgeserve0emulator0url0id000000.lambda-url.us-east-1.on.aws",
            "domainPrefix": "edgeserve0emulator0url0id000000",
            "http": {
                "method": "POST",
                "path": "/invoke",
                "protocol": "HTTP/1.1",
                "sourceIp": "10.0.0.9",
                "userAgent": "curl/8",
            },
            "requestId": "req-1",
            "routeKey": "$default",
            "stage": "$default",
            "time": "14/Nov/2023:22:13:20 +0000",
            "timeEpoch": 1700000000500,
        },
        "body": "iVBORw==",
        "isBase64Encoded": True,
    }


def test_rest_event_whole_with_an_empty_text_body() -> None:
    request = HttpRequest("GET", "/", "", [("accept", "application/json")], b"")
    assert to_event(request, "rest", "req-2", now=1.0) == {
        "resource": "/{proxy+}",
        "path": "/",
        "httpMethod": "GET",
        "headers": {"accept": "application/json"},
        "multiValueHeaders": {"accept": ["application/json"]},
        "queryStringParameters": None,
        "multiValueQueryStringParameters": None,
        "pathParameters": None,
        "stageVariables": None,
        "requestContext": {
            "accountId": "123456789012",
            "apiId": "edgeserve0",
            "resourcePath": "/{proxy+}",
            "httpMethod": "GET",
            "path": "/prod/",
            "stage": "prod",
            "protocol": "HTTP/1.1",
            "requestId": "req-2",
            "requestTimeEpoch": 1000,
            "identity": {"sourceIp": "127.0.0.1", "userAgent": None},
        },
        "body": None,
        "isBase64Encoded": False,
    }


@pytest.mark.parametrize("kind", EVENT_KINDS)
def test_emulated_events_round_trip_through_the_handler(kind: Any) -> None:
    for body, content_type in ((png_bytes(), "image/png"), (b'{"rows": [1]}', "application/json")):
        request = HttpRequest("POST", "/invoke", "q=1", [("content-type", content_type)], body)
        response = from_result(ECHO(to_event(request, kind, "r"), None), kind)
        assert response is not None and response.status == 200
        if content_type == "image/png":
            assert (response.body, dict(response.headers)["content-type"]) == (body, "image/png")
        else:
            assert json.loads(response.body) == {
                "method": "POST",
                "path": "/invoke",
                "query": [["q", "1"]],
                "body": '{"rows": [1]}',
                "cookies": None,
            }


RESULTS = [
    (
        "url",
        "just a string",
        HttpResponse(200, [("content-type", "application/json")], b'"just a string"'),
    ),
    (
        "url",
        {
            "statusCode": 201,
            "headers": {"Content-Type": "text/plain"},
            "cookies": ["a=1", "b=2"],
            "body": "hi",
        },
        HttpResponse(
            201,
            [("content-type", "text/plain"), ("set-cookie", "a=1"), ("set-cookie", "b=2")],
            b"hi",
        ),
    ),
    (
        "alb",
        {
            "statusCode": 200,
            "multiValueHeaders": {"X-A": ["1", "2"]},
            "body": "AAE=",
            "isBase64Encoded": True,
        },
        HttpResponse(200, [("x-a", "1"), ("x-a", "2")], b"\x00\x01"),
    ),
    ("rest", {"body": "no status"}, None),
    ("rest", "not a proxy response", None),
]


@pytest.mark.parametrize(("kind", "result", "response"), RESULTS)
def test_results_become_http_responses(
    kind: Any, result: Any, response: HttpResponse | None
) -> None:
    assert from_result(result, kind) == response


def test_the_real_function_behind_every_sample_event(tmp_path: Path) -> None:
    """`create_handler`: the real bundle, runtime (lambda mode) and app, PNG and msgpack in."""
    bundle = small_bundle(tmp_path)
    handler = create_handler(bundle.root)
    rows = np.linspace(0, 1, 32, dtype=np.float32).reshape(2, 16)
    reference = ort.InferenceSession(str(bundle.model_path)).run(None, {"x": rows})[0]
    for name, _ in SAMPLES:
        event = with_binary_body(
            fixture(name), msgpack.packb({"x": rows.tolist()}), "application/msgpack"
        )
        event = _to_path(event, "/invoke")
        result = handler(event, None)
        assert result["statusCode"] == 200, (name, result)
        body = (
            base64.b64decode(result["body"])
            if result["isBase64Encoded"]
            else result["body"].encode()
        )
        np.testing.assert_allclose(json.loads(body)["y"], reference, rtol=1e-5, atol=1e-5)


def test_the_handler_answers_after_something_ran_asyncio_run(tmp_path: Path) -> None:
    """`asyncio.run` (an import's, a library's) leaves the thread without a current event loop;
    Mangum, which runs on the current one, then failed every event. Both the real function and
    a bare wrapped app answer before and after it, the real one from the loop its runtime
    serves on."""
    handler = create_handler(small_bundle(tmp_path).root)
    event = _to_path(fixture("apigw-v2-request-no-authorizer.json"), "/v2/health/ready")
    name, expected = SAMPLES[0]
    for _ in range(2):
        assert handler(event, None)["statusCode"] == 200
        assert ECHO(fixture(name), None) == expected
        asyncio.run(asyncio.sleep(0))  # leaves no current event loop behind
    with pytest.raises(RuntimeError, match="no current event loop"):
        asyncio.get_event_loop()  # the state the handlers met, and answered from


def _to_path(event: dict[str, Any], path: str) -> dict[str, Any]:
    if "rawPath" in event:
        return {
            **event,
            "rawPath": path,
            "requestContext": {
                **event["requestContext"],
                "http": {**event["requestContext"]["http"], "path": path},
            },
        }
    return {**event, "path": path}
