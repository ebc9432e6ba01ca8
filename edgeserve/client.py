"""A small client for a function's /invoke, used by `edgeserve invoke`."""

from __future__ import annotations

from typing import Any

import httpx

from edgeserve.errors import EdgeserveError


def invoke(url: str, body: bytes, content_type: str, *, timeout_s: float = 60.0) -> Any:
    """POST `body` to URL/invoke and return the decoded JSON answer (or raise with its error)."""
    endpoint = url.rstrip("/") + ("" if url.rstrip("/").endswith("/invoke") else "/invoke")
    try:
        response = httpx.post(
            endpoint, content=body, headers={"Content-Type": content_type}, timeout=timeout_s
        )
    except httpx.HTTPError as exc:
        raise EdgeserveError(
            f"{endpoint}: request failed: {exc}. Hint: is `edgeserve serve` running there?"
        ) from None
    try:
        answer = response.json()
    except ValueError:
        answer = response.text
    if response.is_error:
        message = answer.get("error", answer) if isinstance(answer, dict) else answer
        raise EdgeserveError(f"{endpoint}: HTTP {response.status_code}: {message}")
    return answer
