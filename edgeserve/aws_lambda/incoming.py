"""What arrives at a Lambda function, sorted before Mangum sees it: pure functions on events.

Mangum assumes a well-formed HTTP event and raises KeyError, TypeError or binascii.Error out of
the handler otherwise. Here every HTTP event gets an answer: one with a missing or mistyped
field gets a 400 saying which field (what is no HTTP event is direct.py's). A valid HTTP event
reaches Mangum as the request reached the gateway: the path without the gateway's prefix
(`routed`), a REST body's spent Content-Encoding gone (`decoded`). Its answer leaves as the
source takes it (`finished`): ALB's status line, and a 413 where the answer is past what the
source carries back.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from http import HTTPStatus
from typing import TYPE_CHECKING, Any

from edgeserve.aws_lambda import cloudfront
from edgeserve.aws_lambda.eventchecks import (
    LIST_MAPS,
    TEXT_MAPS,
    body_problem,
    found,
    header_values,
    is_map,
    lookup,
    server_problem,
    text_problem,
    typed_problem,
)
from edgeserve.aws_lambda.settings import ALB_RESPONSE_LIMIT_BYTES, RESPONSE_LIMIT_BYTES
from edgeserve.errors import echo_repr

if TYPE_CHECKING:
    from edgeserve.http.cors import Cors

KINDS = {
    "alb": "ALB",
    "http-v2": "API Gateway HTTP API (2.0) or Function URL",
    "http-v1": "API Gateway HTTP API (1.0)",
    "rest": "API Gateway REST API",
    "edge": "Lambda@Edge",
}
_CODING = "content-encoding"
HEALTH_CHECKER = "ELB-HealthChecker/"
"""The user agent of an ALB's health checks."""
READY_PATH = "/v2/health/ready"
_PARAMETER = re.compile(r"\{([^{}+]+)\+?\}")
"""A path parameter in a REST API resource: `{name}`, or greedy `{proxy+}`."""


def kind_of(event: Mapping[str, Any]) -> str | None:
    """Which HTTP event this is, by the keys Mangum infers from, or by the request's own keys
    where one of those is missing (`problem_in` then says which); None when it is none."""
    context = event.get("requestContext")
    if isinstance(context, Mapping) and "elb" in context:
        return "alb"
    if "version" in event and any(key in event for key in ("requestContext", "rawPath")):
        return "http-v2" if event["version"] == "2.0" else "http-v1"
    if ("requestContext" in event and "resource" in event) or ("httpMethod" in event):
        return "rest"
    records = event.get("Records")
    if isinstance(records, list) and records and isinstance(records[0], Mapping):
        return "edge" if "cf" in records[0] else None
    return None


def without_nulls(event: Mapping[str, Any], kind: str) -> dict[str, Any]:
    """API Gateway sends null for absent headers, query and body: treat them as absent (and
    so a null header, query parameter or requestContext field, such as identity). What
    AWS always sends but an event written by hand (a test event, `sam local`) may leave out is
    filled in, where Mangum read it unconditionally (each was a 400 "missing field"): an ALB
    event's headers; a REST event's resource (Mangum infers the event from it); a 2.0
    event's requestContext.http.sourceIp (no client address) and its path, given either as
    rawPath or as requestContext.http.path."""
    present = _present(event)
    for name in (*TEXT_MAPS, *LIST_MAPS, "requestContext"):  # a header of null: no header
        if isinstance(present.get(name), Mapping):
            present[name] = _present(present[name])
    if kind == "rest" and "resource" not in present:  # the resource is the path itself
        present["resource"] = present.get("path")
    if kind == "alb" and "headers" not in present and "multiValueHeaders" not in present:
        present["headers"] = {}
    context = present.get("requestContext")
    if (
        kind == "http-v2"
        and isinstance(context, Mapping)
        and isinstance(context.get("http"), Mapping)
    ):
        http = {"sourceIp": "", **context["http"]}
        if "path" not in http and isinstance(present.get("rawPath"), str):
            http["path"] = present["rawPath"]
        if "rawPath" not in present and isinstance(http.get("path"), str):
            present["rawPath"] = http["path"]
        present["requestContext"] = {**context, "http": http}
    return present


def _present(fields: Mapping[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in fields.items() if value is not None}


def problem_in(event: Mapping[str, Any], kind: str) -> str | None:
    """What is wrong with an HTTP event of `kind` (nulls already dropped), or None."""
    if kind == "edge":
        return cloudfront.problem(event)
    if not isinstance(event.get("requestContext"), Mapping):
        return f"requestContext must be an object ({found(event.get('requestContext'))})"
    if kind.startswith("http-") and event.get("version") not in ("1.0", "2.0"):
        return f'version must be "1.0" or "2.0" (got {echo_repr(event.get("version"))})'
    required = (_METHOD_AT.get(kind, ("httpMethod",)), _PATH_AT.get(kind, ("path",)))
    for path in required:
        if not isinstance(lookup(event, path), str):
            return f"{'.'.join(path)} must be a string ({found(lookup(event, path))})"
    return (
        typed_problem(event)
        or body_problem(event)
        or text_problem(event, ())
        or server_problem(event)
    )


_METHOD_AT = {"http-v2": ("requestContext", "http", "method")}
_PATH_AT = {"http-v2": ("requestContext", "http", "path")}
"""Where an event of a kind holds its method and path (else at httpMethod and path)."""


def cut_short(event: Mapping[str, Any], kind: str) -> str | None:
    """Why the request body cannot be read whole, for a 413 (CloudFront cut it), or None."""
    return cloudfront.truncated(event) if kind == "edge" else None


def routed(event: dict[str, Any], kind: str) -> dict[str, Any]:
    """The event with the path the function's routes know, without what the gateway put in
    front of it (for an event `problem_in` passed):

    - an HTTP API's named stage, which the API's own endpoint keeps in the path
      (`/prod/v2/health/ready` on stage `prod`; `$default` is served at the root), in
      rawPath and requestContext.http.path (payload 2.0) or path (1.0);
    - a REST API's base path mapping on a custom domain (`/ml/v2/health/ready` for resource
      `/{proxy+}`), found by filling the resource's path parameters in (nothing where they
      make the whole path: on stage `v2`, `/v2/health/ready` was a 404); else, where they
      cannot say, its stage, where the path carries it as requestContext.path does
      (`/prod/v2/models/m/infer` was a 404);
    - an ALB's health check at its default path `/`, which the function does not serve (the
      target was reported unhealthy): it asks the readiness route.
    """
    if kind == "alb":
        return _health_checked(event)
    if kind not in ("http-v2", "http-v1", "rest"):
        return event
    context = event["requestContext"]
    if kind == "http-v2":
        http = context["http"]
        prefix = _stage_prefix(context, http["path"])
        if not prefix:
            return event
        raw = event.get("rawPath")
        if isinstance(raw, str) and _under(raw, prefix):
            event = {**event, "rawPath": _strip(raw, prefix)}
        http = {**http, "path": _strip(http["path"], prefix)}
        return {**event, "requestContext": {**context, "http": http}}
    path = event["path"]
    base = _base_path(event, path) if kind == "rest" else None
    prefix = _stage_prefix(context, path) if base is None else base
    return {**event, "path": _strip(path, prefix)} if prefix else event


def decoded(event: dict[str, Any], kind: str) -> dict[str, Any]:
    """API Gateway REST decompresses a body its Content-Encoding names before the integration
    (it answers 415 itself when it cannot) and leaves the header in: the body of a REST event
    is never compressed, so the header goes (the app gunzipped plain JSON: a 400)."""
    if kind != "rest":
        return event
    without: dict[str, Any] = {
        key: {name: value for name, value in event[key].items() if name.lower() != _CODING}
        for key in ("headers", "multiValueHeaders")
        if key in event
    }
    return {**event, **without}


def refusal(
    status: int, message: str, event: Mapping[str, Any], kind: str, cors: Cors | None = None
) -> dict[str, Any]:
    """The handler's own error answer, in the shape every HTTP event kind's caller reads: an
    ALB target group with multi-value headers on (its events carry multiValueHeaders) reads
    the response's multiValueHeaders alone, as Mangum answers it; CloudFront its own shape.
    With `cors`, it carries the headers the app's answers carry to the request's Origin (a
    browser showed the page an opaque CORS failure, not the 400)."""
    if kind == "edge":
        return cloudfront.refusal(status, message)
    headers = {"content-type": "application/json", **_cors_headers(event, cors)}
    fields = (
        {"multiValueHeaders": {name: [value] for name, value in headers.items()}}
        if kind == "alb" and "multiValueHeaders" in event
        else {"headers": headers}
    )
    return {
        "statusCode": status,
        **fields,
        "body": json.dumps({"error": message}),
        "isBase64Encoded": False,
    }


def finished(
    answer: dict[str, Any], event: Mapping[str, Any], kind: str, cors: Cors | None = None
) -> dict[str, Any]:
    """The answer to an HTTP event as its source takes it back: no body to a HEAD (the
    metadata's JSON was sent), a 413 in its place where it is past the source's response
    limit (Lambda failed the invocation, or the ALB dropped the answer: the caller got a 502
    with no body), an ALB's status line and CloudFront's shape."""
    limit = ALB_RESPONSE_LIMIT_BYTES if kind == "alb" else RESPONSE_LIMIT_BYTES
    if kind == "edge":
        answer, limit = cloudfront.answer(answer), cloudfront.limit_bytes(event)
    method = None if kind == "edge" else lookup(event, _METHOD_AT.get(kind, ("httpMethod",)))
    if method == "HEAD" and answer.get("body"):  # the headers alone, as uvicorn answers HEAD
        answer = {**answer, "body": "", "isBase64Encoded": False}
    if problem := too_large(answer, limit, f"the answer to an {KINDS[kind]} event"):
        answer = refusal(413, problem, event, kind, cors)
    if kind == "alb":  # the status line's text, as in AWS's examples of ALB answers
        answer = {**answer, "statusDescription": _status_line(answer["statusCode"])}
    return answer


WIDEST_ESCAPE = 12
"""The most characters json.dumps writes for one character of text: two \\uXXXX escapes for one
past the Basic Multilingual Plane."""


def too_large(answer: Mapping[str, Any], limit: int, what: str, text: str = "") -> str | None:
    """Why `answer` cannot go back (its JSON, as the runtime client sends it, is past `limit`
    bytes), or None. Measured with ASCII escapes, the larger of the client's two encodings.
    `text`: the JSON `answer` was read from, or its body: where even its widest escaping fits,
    nothing is encoded a second time (every answer passes here)."""
    body = answer.get("body")
    if isinstance(body, str):  # an HTTP answer: its body, and the few fields beside it
        text = body
        rest = {key: value for key, value in answer.items() if key != "body"}
    else:
        rest = {}
    widest = WIDEST_ESCAPE * len(text) + len(json.dumps(rest)) + 64  # 64: a status added
    if text and widest <= limit:
        return None
    size = len(json.dumps(answer))
    if size <= limit:
        return None
    return (
        f"the answer is too large for Lambda: {size} bytes as JSON, over the {limit} bytes "
        f"allowed for {what}. Hint: send fewer items per request"
    )


def _status_line(status: int) -> str:
    try:
        return f"{status} {HTTPStatus(status).phrase}"
    except ValueError:  # a status the standard library does not name
        return str(status)


def _cors_headers(event: Mapping[str, Any], cors: Cors | None) -> dict[str, str]:
    """What `cors` adds to an answer to the event's Origin (none in a malformed event)."""
    if cors is None:
        return {}
    single, multi = event.get("headers", {}), event.get("multiValueHeaders", {})
    if not (is_map(single, of_lists=False) and is_map(multi, of_lists=True)):
        return {}
    origin = next((v for k, v in header_values(event) if k.lower() == "origin"), None)
    allowed = cors.answer_headers(origin) if isinstance(origin, str) else []
    return {name.decode("latin-1"): value.decode("latin-1") for name, value in allowed}


def _health_checked(event: dict[str, Any]) -> dict[str, Any]:
    """An ALB health check (user agent ELB-HealthChecker) of `GET /`, its default path, as a
    check of the readiness route; any other request as it is."""
    if event["path"] != "/" or event["httpMethod"] != "GET":
        return event
    agents = [value for key, value in header_values(event) if key.lower() == "user-agent"]
    if not any(agent.startswith(HEALTH_CHECKER) for agent in agents):
        return event
    return {**event, "path": READY_PATH}


def _stage_prefix(context: Mapping[str, Any], path: str) -> str:
    """`/<stage>` where an HTTP API's own endpoint put its named stage in front of `path`."""
    stage, domain = context.get("stage"), context.get("domainName")
    if not isinstance(stage, str) or stage in ("", "$default"):
        return ""
    if isinstance(domain, str) and ".execute-api." not in domain:
        return ""  # a custom domain: its API mapping chose the stage, the path has none
    return f"/{stage}" if _under(path, f"/{stage}") else ""


def _base_path(event: Mapping[str, Any], path: str) -> str | None:
    """What a REST API's custom domain (or a stage) put in front of the resource's path
    (`/ml`); "" where the resource, its parameters filled in, is the whole path (a stage
    named `v2` is then no prefix of `/v2/health/ready`); None where the resource cannot say."""
    resource, parameters = event.get("resource"), event.get("pathParameters") or {}
    if not isinstance(resource, str) or not isinstance(parameters, Mapping):
        return None
    filled = _PARAMETER.sub(lambda found: str(parameters.get(found[1], found[0])), resource)
    if filled == "/":
        return path.rstrip("/")
    if not filled.startswith("/") or _PARAMETER.search(filled) or not path.endswith(filled):
        return None
    return path[: -len(filled)]


def _under(path: str, prefix: str) -> bool:
    return path == prefix or path.startswith(prefix + "/")


def _strip(path: str, prefix: str) -> str:
    return path[len(prefix) :] or "/"
