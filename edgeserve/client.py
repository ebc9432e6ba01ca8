"""A small client for a function's /invoke, used by `edgeserve invoke`."""

from __future__ import annotations

from typing import Any

import httpx

from edgeserve.errors import ConfigError, EdgeserveError


def invoke(url: str, body: bytes, content_type: str, *, timeout_s: float = 60.0) -> Any:
    """POST `body` to URL/invoke and return the decoded JSON answer (or raise with its error).

    A URL without a scheme (`127.0.0.1:8080`) is taken as http://.
    """
    endpoint = _endpoint(url)
    try:
        response = httpx.post(
            endpoint, content=body, headers={"Content-Type": content_type}, timeout=timeout_s
        )
    except httpx.InvalidURL as exc:
        raise ConfigError(
            f"URL {url!r}: {exc}; expected http://HOST:PORT or HOST:PORT (as `edgeserve serve` "
            "prints)"
        ) from None
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


def _endpoint(url: str) -> str:
    """`HOST:PORT` or `http(s)://...` as the full /invoke URL; any other scheme is refused."""
    if "://" not in url:
        url = f"http://{url}"
    scheme = url.split("://", 1)[0].lower()
    base = url.rstrip("/")
    if scheme not in ("http", "https") or base.endswith("://"):
        raise ConfigError(
            f"URL {url!r}: expected http://HOST:PORT or HOST:PORT (as `edgeserve serve` prints)"
        )
    return base if base.endswith("/invoke") else base + "/invoke"
