"""A direct invocation (`aws lambda invoke`, Step Functions): no HTTP event around it.

A payload that is a KServe v2 infer request is served as the Function URL event that would
carry it (`infer_event`), and answered as the JSON a direct caller reads (`direct_answer`),
JSON both ways (`binary_asked` says why binary tensors cannot be); any other payload gets an
error saying what the function accepts (`not_http`).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from typing import Any

from edgeserve.aws_lambda.incoming import too_large
from edgeserve.aws_lambda.settings import RESPONSE_LIMIT_BYTES
from edgeserve.errors import echo

ACCEPTED = (
    "HTTP events (API Gateway REST or HTTP API, a Function URL, an ALB) and direct invocations "
    'carrying a KServe v2 infer request ({"inputs": [...]})'
)


def is_infer_request(event: Mapping[str, Any]) -> bool:
    """An event with `inputs` is meant as one: what else is wrong with it (`inputs` not a
    list) is the v2 decoder's to say, not "expected an infer request"."""
    return "inputs" in event


def infer_event(request: Mapping[str, Any], model: str) -> dict[str, Any]:
    """A direct invocation's v2 infer request, as the Function URL event that would carry it."""
    path = f"/v2/models/{model}/infer"
    return {
        "version": "2.0",
        "rawPath": path,
        "rawQueryString": "",
        "headers": {"content-type": "application/json"},
        "requestContext": {"http": {"method": "POST", "path": path, "sourceIp": "127.0.0.1"}},
        "body": json.dumps(request),
        "isBase64Encoded": False,
    }


def binary_asked(request: Mapping[str, Any]) -> str | None:
    """Why a direct invocation's request cannot be answered as asked: it is JSON both ways,
    which cannot carry the binary tensor extension's bytes (None: it can)."""
    top = request.get("parameters")
    wanted = [*_parameters(request.get("outputs")), *([top] if isinstance(top, Mapping) else [])]
    if any(p.get("binary_data") or p.get("binary_data_output") for p in wanted):
        return (
            "a direct invocation is answered in JSON: leave out binary_data and "
            "binary_data_output (or call the function's URL, which carries binary tensors)"
        )
    sized = [p for p in _parameters(request.get("inputs")) if "binary_data_size" in p]
    if sized:  # it read "binary_data_size 64 runs past the body": a body it never had
        return (
            "a direct invocation is a JSON event, with no binary part: give each input its "
            "`data` instead of binary_data_size (or call the function's URL, which carries "
            "binary tensors)"
        )
    return None


def _parameters(entries: object) -> list[Mapping[str, Any]]:
    """The `parameters` objects of a request's inputs or outputs (entries of other shapes are
    the v2 decoder's to refuse)."""
    if not isinstance(entries, list):
        return []
    found = [entry.get("parameters") for entry in entries if isinstance(entry, Mapping)]
    return [parameters for parameters in found if isinstance(parameters, Mapping)]


def direct_answer(response: Mapping[str, Any]) -> dict[str, Any]:
    """The HTTP response to a direct invocation, as the JSON a direct caller reads."""
    body = response.get("body", "")
    try:
        if response.get("isBase64Encoded"):
            body = base64.b64decode(body).decode()
        answer: dict[str, Any] = json.loads(body) if body else {}
    except ValueError as exc:  # never raise out of the handler: say what came back instead
        return {"error": f"the function's answer is not JSON ({exc})", "status": 500}
    if response["statusCode"] >= 400:
        answer["status"] = response["statusCode"]
    what = "a synchronous invocation's answer"
    if problem := too_large(answer, RESPONSE_LIMIT_BYTES, what, body):
        return {"error": problem, "status": 413}
    return answer


def not_http(event: object) -> dict[str, Any]:
    keys = (
        [echo(key) for key in sorted(map(str, event))[:8]] if isinstance(event, Mapping) else None
    )
    what = f"an event with keys {keys}" if keys is not None else f"a {type(event).__name__}"
    return {"error": f"this function answers {ACCEPTED}; it got {what}"}
