"""HTTP request <-> Lambda event translation for the emulator (pure functions, no IO).

Four event sources, as API Gateway, Function URLs and ALB send them: `url` (Function URL,
payload 2.0), `http` (HTTP API, payload 2.0), `rest` (REST API v1 proxy) and `alb`. Bodies
that are not text travel base64-encoded (`isBase64Encoded`); the REST API is assumed to
list `*/*` in its binaryMediaTypes, as a function taking images needs. Before the event is
built, the gateway may answer itself (`through_gateway`: REST's request decompression, an
ALB's request limit).
"""

from __future__ import annotations

import base64
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal
from urllib.parse import parse_qsl

from edgeserve.aws_lambda.settings import ALB_REQUEST_LIMIT_BYTES, PAYLOAD_LIMIT_BYTES

EventKind = Literal["url", "http", "rest", "alb"]
EVENT_KINDS: tuple[EventKind, ...] = ("url", "http", "rest", "alb")
TEXT_TYPES = ("text/", "application/json", "application/javascript", "application/xml")
URL_ID = "edgeserve0emulator0url0id000000"
API_ID = "edgeserve0"
ACCOUNT = "123456789012"
TARGET_GROUP = (
    f"arn:aws:elasticloadbalancing:us-east-1:{ACCOUNT}:targetgroup/edgeserve/0123456789abcdef"
)
Headers = Sequence[tuple[str, str]]
REST_CODINGS = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}
"""The request codings API Gateway REST undoes before its integration: zlib wbits of each."""


@dataclass(frozen=True)
class HttpRequest:
    """An HTTP request as the front received it (header names lower-case, in order)."""

    method: str
    path: str
    query: str
    headers: Headers
    body: bytes
    source_ip: str = "127.0.0.1"


@dataclass(frozen=True)
class HttpResponse:
    status: int
    headers: list[tuple[str, str]]
    body: bytes


UNSUPPORTED = HttpResponse(
    415,
    [("content-type", "application/json"), ("x-amzn-errortype", "UnsupportedMediaTypeException")],
    b'{"message":"Unsupported Media Type"}',
)
ALB_TOO_LARGE = HttpResponse(
    413,
    [("content-type", "text/html")],
    b"<html><head><title>413 Request Entity Too Large</title></head><body>"
    b"<center><h1>413 Request Entity Too Large</h1></center></body></html>",
)


def through_gateway(request: HttpRequest, kind: EventKind) -> HttpRequest | HttpResponse:
    """The request as the gateway hands it on, or the gateway's own answer.

    API Gateway REST decompresses a body its Content-Encoding names (gzip, deflate) before the
    integration, leaving the header in, and answers 415 itself for any other coding or a body
    that does not decompress (AWS docs, api-gateway-make-request-with-compressed-payload). An
    ALB answers 413 itself for a body over 1 MB, which it does not send a Lambda target.
    """
    if kind == "alb" and len(request.body) > ALB_REQUEST_LIMIT_BYTES:
        return ALB_TOO_LARGE
    coding = (_header(request.headers, "content-encoding") or "identity").strip().lower()
    if kind != "rest" or coding == "identity":
        return request
    try:
        decoder = zlib.decompressobj(REST_CODINGS[coding])
        # past Lambda's payload limit the rest cannot change the answer (413)
        body = decoder.decompress(request.body, PAYLOAD_LIMIT_BYTES + 1)
    except (KeyError, zlib.error):
        return UNSUPPORTED
    return replace(request, body=body)


def to_event(
    request: HttpRequest, kind: EventKind, request_id: str, now: float | None = None
) -> dict[str, Any]:
    """The event Lambda would hand the function for this request, from this source."""
    epoch_ms = int((time.time() if now is None else now) * 1000)
    builders = {"url": _v2_event, "http": _v2_event, "rest": _rest_event, "alb": _alb_event}
    event = builders[kind](request, kind, request_id, epoch_ms)
    body, encoded = encode_body(request.body, _header(request.headers, "content-type"))
    if kind == "rest":
        event["body"] = body or None
    elif body or kind == "alb":
        event["body"] = body
    event["isBase64Encoded"] = encoded
    return event


def from_result(result: Any, kind: EventKind) -> HttpResponse | None:
    """The HTTP response for a handler's result; None when the gateway would reject it (502)."""
    if kind in ("url", "http") and not (isinstance(result, dict) and "statusCode" in result):
        return HttpResponse(200, [("content-type", "application/json")], _json_bytes(result))
    if not isinstance(result, dict) or not isinstance(result.get("statusCode"), int):
        return None
    headers = [(name.lower(), str(value)) for name, value in (result.get("headers") or {}).items()]
    for name, values in (result.get("multiValueHeaders") or {}).items():
        headers += [(name.lower(), str(value)) for value in values]
    headers += [("set-cookie", cookie) for cookie in result.get("cookies") or ()]
    body = result.get("body") or ""
    raw = base64.b64decode(body) if result.get("isBase64Encoded") else str(body).encode()
    return HttpResponse(result["statusCode"], headers, raw)


def encode_body(body: bytes, content_type: str | None) -> tuple[str, bool]:
    """Text bodies as text; anything else (images, msgpack, bytes) base64-encoded."""
    if not body:
        return "", False
    if content_type and content_type.lower().startswith(TEXT_TYPES):
        try:
            return body.decode("utf-8"), False
        except UnicodeDecodeError:
            pass
    return base64.b64encode(body).decode("ascii"), True


def _v2_event(
    request: HttpRequest, kind: EventKind, request_id: str, epoch_ms: int
) -> dict[str, Any]:
    url = kind == "url"
    domain_id = URL_ID if url else API_ID
    domain = (
        f"{URL_ID}.lambda-url.us-east-1.on.aws"
        if url
        else f"{API_ID}.execute-api.us-east-1.amazonaws.com"
    )
    cookies = [
        c.strip() for _, v in request.headers if _ == "cookie" for c in v.split(";") if c.strip()
    ]
    event: dict[str, Any] = {
        "version": "2.0",
        "routeKey": "$default",
        "rawPath": request.path,
        "rawQueryString": request.query,
        **({"cookies": cookies} if cookies else {}),
        "headers": {**_joined(_multi(request.headers)), "host": domain},
    }
    event["headers"].pop("cookie", None)
    if request.query:
        event["queryStringParameters"] = _joined(_query_lists(request.query))
    event["requestContext"] = {
        "accountId": "anonymous" if url else ACCOUNT,
        "apiId": domain_id,
        "domainName": domain,
        "domainPrefix": domain_id,
        "http": {
            "method": request.method,
            "path": request.path,
            "protocol": "HTTP/1.1",
            "sourceIp": request.source_ip,
            "userAgent": _header(request.headers, "user-agent") or "",
        },
        "requestId": request_id,
        "routeKey": "$default",
        "stage": "$default",
        "time": time.strftime("%d/%b/%Y:%H:%M:%S +0000", time.gmtime(epoch_ms / 1000)),
        "timeEpoch": epoch_ms,
    }
    return event


def _rest_event(
    request: HttpRequest, kind: EventKind, request_id: str, epoch_ms: int
) -> dict[str, Any]:
    queries = _query_lists(request.query)
    multi = _multi(request.headers)
    return {
        "resource": "/{proxy+}",
        "path": request.path,
        "httpMethod": request.method,
        "headers": {name: values[-1] for name, values in multi.items()},
        "multiValueHeaders": multi,
        "queryStringParameters": {k: v[-1] for k, v in queries.items()} or None,
        "multiValueQueryStringParameters": queries or None,
        "pathParameters": {"proxy": request.path.lstrip("/")} if request.path != "/" else None,
        "stageVariables": None,
        "requestContext": {
            "accountId": ACCOUNT,
            "apiId": API_ID,
            "resourcePath": "/{proxy+}",
            "httpMethod": request.method,
            "path": f"/prod{request.path}",
            "stage": "prod",
            "protocol": "HTTP/1.1",
            "requestId": request_id,
            "requestTimeEpoch": epoch_ms,
            "identity": {
                "sourceIp": request.source_ip,
                "userAgent": _header(request.headers, "user-agent"),
            },
        },
    }


def _alb_event(
    request: HttpRequest, kind: EventKind, request_id: str, epoch_ms: int
) -> dict[str, Any]:
    return {
        "requestContext": {"elb": {"targetGroupArn": TARGET_GROUP}},
        "httpMethod": request.method,
        "path": request.path,
        "queryStringParameters": {k: v[-1] for k, v in _query_lists(request.query).items()},
        "headers": {name: values[-1] for name, values in _multi(request.headers).items()},
    }


def _query_lists(query: str) -> dict[str, list[str]]:
    lists: dict[str, list[str]] = {}
    for key, value in parse_qsl(query, keep_blank_values=True):
        lists.setdefault(key, []).append(value)
    return lists


def _multi(headers: Headers) -> dict[str, list[str]]:
    multi: dict[str, list[str]] = {}
    for name, value in headers:
        multi.setdefault(name, []).append(value)
    return multi


def _joined(lists: dict[str, list[str]]) -> dict[str, str]:
    return {key: ",".join(values) for key, values in lists.items()}


def _header(headers: Headers, name: str) -> str | None:
    return next((value for key, value in headers if key == name), None)


def _json_bytes(value: Any) -> bytes:
    import json

    return json.dumps(value).encode()
