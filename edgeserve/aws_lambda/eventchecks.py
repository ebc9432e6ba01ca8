"""The checks of an HTTP event's fields, for incoming.py and cloudfront.py: what Mangum would
raise on (a field of the wrong type, a body flagged base64 that is not, a Host it cannot read)
found first and named, with where it is and what was found."""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping
from typing import Any

from edgeserve.errors import echo, echo_repr

TEXT_MAPS = ("headers", "queryStringParameters")
LIST_MAPS = ("multiValueHeaders", "multiValueQueryStringParameters")
_TYPED = {"body": str, "isBase64Encoded": bool, "rawQueryString": str, "cookies": list}
_SURROGATE = re.compile("[\ud800-\udfff]")
"""Any surrogate left in a str is a lone one (JSON's escaped pairs decode to one code point)."""


def typed_problem(event: Mapping[str, Any]) -> str | None:
    """The first top-level field of the wrong type (body, the header and query maps...)."""
    for key, kind in _TYPED.items():
        if key in event and not isinstance(event[key], kind):
            return f"{key} must be a {kind.__name__} ({found(event[key])})"
    for key in TEXT_MAPS + LIST_MAPS:
        if key in event and not is_map(event[key], of_lists=key in LIST_MAPS):
            shape = "lists of strings" if key in LIST_MAPS else "strings"
            return f"{key} must map strings to {shape} ({found(event[key])})"
    cookies = event.get("cookies", [])
    if not all(isinstance(cookie, str) for cookie in cookies):
        return "cookies must be a list of strings"
    return None


def text_problem(value: object, where: tuple[str, ...]) -> str | None:
    """The first string that is not Unicode text (a lone surrogate, which JSON can escape and
    UTF-8 cannot carry: it failed the answer's own encoding, a 500)."""
    if isinstance(value, str):
        if _SURROGATE.search(value):  # searched, not encoded: a body may be 6 MB
            return f"{echo('.'.join(where)) or 'a key'} holds a lone surrogate, which is not text"
    elif isinstance(value, Mapping):
        for key, item in value.items():
            if problem := text_problem(key, where) or text_problem(item, (*where, str(key))):
                return problem
    elif isinstance(value, list):
        for item in value:
            if problem := text_problem(item, where):
                return problem
    return None


def server_problem(event: Mapping[str, Any]) -> str | None:
    """Mangum reads the server from Host as `name[:port]` and X-Forwarded-Port as a number,
    and raised on anything else (an IPv6 literal, a port that is not a number): every value
    it might read, single or multi-value, is checked."""
    for key, value in header_values(event):
        name = key.lower()
        host, colon, port = value.partition(":")
        if name == "host" and colon and (":" in port or not port.isdigit() or not host):
            return (
                f"headers.host {echo_repr(value)}: expected a host name and an optional numeric "
                "port"
            )
        if name == "x-forwarded-port" and not value.isdigit():
            return f"headers.x-forwarded-port {echo_repr(value)}: expected a port number"
    return None


def header_values(event: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(name, value) of every header value an event carries, single or multi-value."""
    values = list(event.get("headers", {}).items())
    for key, listed in event.get("multiValueHeaders", {}).items():
        values += [(key, value) for value in listed]
    return values


def body_problem(event: Mapping[str, Any]) -> str | None:
    """A body flagged isBase64Encoded that is not base64."""
    if not event.get("isBase64Encoded") or "body" not in event:
        return None
    try:
        base64.b64decode(event["body"], validate=True)
    except (binascii.Error, ValueError):
        return "body is flagged isBase64Encoded but is not valid base64"
    return None


def is_map(value: object, *, of_lists: bool) -> bool:
    """Whether `value` maps strings to strings (or, `of_lists`, to lists of strings)."""
    if not isinstance(value, Mapping):
        return False
    for key, item in value.items():
        items = item if of_lists and isinstance(item, list) else [item]
        if not isinstance(key, str) or (of_lists and not isinstance(item, list)):
            return False
        if not all(isinstance(text, str) for text in items):
            return False
    return True


def lookup(event: Mapping[str, Any], path: tuple[str, ...]) -> object:
    """The value at `path` in nested objects, None where any step is missing."""
    value: object = event
    for key in path:
        if not isinstance(value, Mapping):
            return None
        value = value.get(key)
    return value


def found(value: object) -> str:
    """What was found instead, for an error: missing, or the type it has."""
    return "missing" if value is None else f"got {type(value).__name__}"
