"""Lambda@Edge: CloudFront's request event checked before Mangum reads it, and every answer in
the shape CloudFront takes from a function that generates the response.

CloudFront reads `status` as text, `statusDescription`, each header as a list of `{key, value}`
and `bodyEncoding` (`text` or `base64`); Mangum's own answer to such an event has `status` as a
number and `isBase64Encoded`, which CloudFront does not read (a binary body went out as text),
and the handler's own refusals had API Gateway's `statusCode`. What CloudFront takes back is
bounded by the event's trigger, headers and body together, and so is the request body it hands
over (cut where longer, `inputTruncated`): 40 KB for a viewer request, 1 MB for an origin
request (AWS, "Quotas on Lambda@Edge").
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from http import HTTPStatus
from typing import Any

from edgeserve.aws_lambda.eventchecks import found

VIEWER_LIMIT_BYTES = 40 * 1024
ORIGIN_LIMIT_BYTES = 1024 * 1024
_TEXT_FIELDS = ("method", "uri", "querystring", "clientIp")
"""What Mangum reads from every request, as text."""


def request_of(event: Mapping[str, Any]) -> Any:
    """The request of a Lambda@Edge event (`Records[0].cf.request`), None where there is none."""
    cf = event["Records"][0]["cf"]
    return cf.get("request") if isinstance(cf, Mapping) else None


def limit_bytes(event: Mapping[str, Any]) -> int:
    """What CloudFront takes back (and hands over of a body) for this event's trigger."""
    cf = event["Records"][0]["cf"]
    config = cf.get("config") if isinstance(cf, Mapping) else None
    trigger = config.get("eventType") if isinstance(config, Mapping) else None
    return VIEWER_LIMIT_BYTES if trigger == "viewer-request" else ORIGIN_LIMIT_BYTES


def problem(event: Mapping[str, Any]) -> str | None:
    """What is wrong with a Lambda@Edge event, for a 400, or None (Mangum raised KeyError,
    IndexError or ValueError on each of these)."""
    if not isinstance(event["Records"][0]["cf"], Mapping):
        return "Records[0].cf must be an object"
    request = request_of(event)
    if not isinstance(request, Mapping):
        return f"Records[0].cf.request must be an object ({found(request)})"
    for name in _TEXT_FIELDS:
        if not isinstance(request.get(name), str):
            return f"request.{name} must be a string ({found(request.get(name))})"
    if not request["uri"].startswith("/"):
        return f"request.uri must be a path starting with / (got {request['uri'][:80]!r})"
    return _headers_problem(request.get("headers")) or _body_problem(request.get("body"))


def truncated(event: Mapping[str, Any]) -> str | None:
    """Why the body cannot be read (CloudFront cut it to what it hands a function), or None."""
    body = request_of(event).get("body")
    if not isinstance(body, Mapping) or body.get("inputTruncated") is not True:
        return None
    return (
        f"the request body was cut by CloudFront at {limit_bytes(event)} bytes (what it hands "
        "a Lambda@Edge function for this trigger). Hint: send fewer items per request"
    )


def answer(given: Mapping[str, Any]) -> dict[str, Any]:
    """Mangum's answer to a Lambda@Edge event (or the handler's own refusal) in CloudFront's
    shape."""
    status = int(given["status"])
    base64_body = given.get("isBase64Encoded") or given.get("bodyEncoding") == "base64"
    return {
        "status": str(status),
        "statusDescription": _reason(status),
        "headers": given.get("headers") or {},
        "body": given.get("body") or "",
        "bodyEncoding": "base64" if base64_body else "text",
    }


def refusal(status: int, message: str) -> dict[str, Any]:
    """The handler's own error answer, as CloudFront reads it."""
    return {
        "status": str(status),
        "statusDescription": _reason(status),
        "headers": {"content-type": [{"key": "Content-Type", "value": "application/json"}]},
        "body": json.dumps({"error": message}),
        "bodyEncoding": "text",
    }


def _headers_problem(headers: object) -> str | None:
    """Each header a non-empty list of `{key, value}` under its lower-case name; Mangum reads the
    first value of each (and Host and X-Forwarded-Port as a server address)."""
    if not isinstance(headers, Mapping):
        return f"request.headers must be an object ({found(headers)})"
    for name, values in headers.items():
        if not isinstance(values, list) or not values:
            return f"request.headers.{name} must be a non-empty list of {{key, value}} objects"
        for value in values:
            if not isinstance(value, Mapping) or not isinstance(value.get("value"), str):
                return f"request.headers.{name}: each entry must be an object with a value string"
    host = headers.get("host", [{}])[0].get("value", "")
    if host.count(":") > 1 or (":" in host and not host.rsplit(":", 1)[1].isdigit()):
        return f"request.headers.host {host!r}: expected a host name and an optional numeric port"
    port = headers.get("x-forwarded-port", [{}])[0].get("value", "80")
    if not port.isdigit():
        return f"request.headers.x-forwarded-port {port!r}: expected a port number"
    return None


def _body_problem(body: object) -> str | None:
    if body is None:
        return None
    if not isinstance(body, Mapping):
        return f"request.body must be an object ({found(body)})"
    data, encoding = body.get("data", ""), body.get("encoding", "text")
    if not isinstance(data, str):
        return f"request.body.data must be a string ({found(data)})"
    if encoding not in ("base64", "text"):
        return f"request.body.encoding must be 'base64' or 'text' (got {encoding!r})"
    if encoding == "base64":
        try:
            base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError):
            return "request.body.data is encoded base64 but is not valid base64"
    return None


def _reason(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return ""
