"""Reading a request body under a size limit, and undoing its codings: Transfer-Encoding's
beyond `chunked` (`gzip, chunked`: the HTTP server has undone the chunks, not the gzip), then
Content-Encoding's.

The limit holds while reading (a declared Content-Length over it is refused before any byte is
read, a streamed body as soon as it passes it) and again after decompression, so a small gzip
bomb cannot grow past it either (Triton caps the decompressed size the same way). A header
given twice is one list (`request_headers`), except those that hold one value.
"""

from __future__ import annotations

import zlib
from typing import Any

from starlette.requests import ClientDisconnect, Request
from starlette.types import Receive

from edgeserve.errors import InvalidInput, PayloadTooLarge, echo, echo_header, echo_json
from edgeserve.values import from_json

# Content-Encoding -> zlib wbits: gzip framing, or a zlib stream (HTTP's "deflate")
_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}
# header -> (its name as written, the codings that leave the body as it is)
_CODINGS = {
    "transfer-encoding": ("Transfer-Encoding", {"", "identity", "chunked"}),
    "content-encoding": ("Content-Encoding", {"", "identity"}),
}


async def read_body(receive: Receive, headers: dict[str, str], limit: int) -> bytes:
    """The whole (decoded) body, or PayloadTooLarge as soon as it exceeds `limit` bytes.

    `headers` are the request's, names in lower case. A client that hangs up while sending
    raises ClientDisconnect.
    """
    declared = headers.get("content-length", "")
    if declared.isascii() and declared.isdigit() and int(declared) > limit:
        raise _too_large(limit, f"Content-Length is {echo(declared)}")
    chunks: list[bytes] = []
    size, more = 0, True
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise _too_large(limit, "the body is longer")
        chunks.append(chunk)
        more = message.get("more_body", False)
    body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
    for header, (_, unchanged) in _CODINGS.items():
        codings = [c.strip() for c in headers.get(header, "").split(",")]
        for coding in reversed(codings):  # the last one applied is undone first
            if coding.lower() not in unchanged:
                body = decompress(body, coding, limit, header)
    return body


def decompress(body: bytes, encoding: str, limit: int, header: str = "content-encoding") -> bytes:
    coding = encoding.lower()  # `encoding` as sent, for the echo (lowered, its UTF-8 broke)
    wbits = _WBITS.get(coding)
    if wbits is None:
        raise InvalidInput(
            f"{_CODINGS[header][0]} {echo_header(encoding)} is not supported; expected gzip, "
            "deflate or identity"
        )
    decoder = zlib.decompressobj(wbits)
    try:
        data = decoder.decompress(body, limit + 1)
    except zlib.error as exc:
        raise InvalidInput(f"request body: not valid {coding} data: {exc}") from None
    if len(data) > limit:
        raise _too_large(limit, f"the body decompresses past it ({coding})")
    if not decoder.eof:
        raise InvalidInput(f"request body: truncated {coding} data")
    if decoder.unused_data:
        raise InvalidInput(
            f"request body: {len(decoder.unused_data)} bytes follow the end of the {coding} "
            "data (a gzip file of several members is not supported: send one)"
        )
    return data


SINGLE = ("content-type", "inference-header-content-length")
"""Headers whose value is one item: given twice, which one to read would be a guess."""


def request_headers(raw: list[tuple[bytes, bytes]]) -> dict[str, str]:
    """A request's headers by name (lower case). A header given more than once is its values
    joined by ", ", as RFC 9110 (5.3) combines a list (Content-Encoding, Accept); one of SINGLE
    is refused."""
    headers = {name.decode("latin-1"): value.decode("latin-1") for name, value in raw}
    if len(headers) == len(raw):  # nearly every request: each header once
        return headers
    joined: dict[str, list[str]] = {}
    for name, value in raw:
        joined.setdefault(name.decode("latin-1"), []).append(value.decode("latin-1"))
    for single in SINGLE:
        if len(given := joined.get(single, [])) > 1:
            raise InvalidInput(
                f"header {single}: given {len(given)} times {echo_header(given)}; expected once"
            )
    return {key: ", ".join(values) for key, values in joined.items()}


def _too_large(limit: int, why: str) -> PayloadTooLarge:
    return PayloadTooLarge(
        f"request body: over the limit of {limit} bytes ({why}). "
        "Hint: raise [resources] max_body_mb in function.toml"
    )


async def json_object(request: Request, limit: int) -> dict[str, Any]:
    """The JSON object a control route takes (Triton's repository and shared-memory routes),
    under the body limit that every route holds to; an empty body is {}."""
    raw = await read_body(request.receive, request_headers(request.scope["headers"]), limit)
    if not raw.strip():
        return {}
    path = echo(request.url.path)
    body = from_json(raw, f"{path}: body", unique=True)
    if not isinstance(body, dict):
        raise InvalidInput(f"{path}: expected a JSON object, got {echo_json(body)}")
    return body
