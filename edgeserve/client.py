"""A small client for a function's /invoke, used by `edgeserve invoke`."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx

from edgeserve.errors import ConfigError, EdgeserveError

EXPECTED = "expected http://HOST:PORT or HOST:PORT (as `edgeserve serve` prints)"
_USERINFO = re.compile(r"(?<=://)[^/@]*@")


def request_body(json_text: str | None, file: str | None) -> tuple[bytes, str]:
    """The body and its media type, from `--json TEXT` or `--file PATH` (PNG/JPEG/JSON by
    extension, else raw bytes)."""
    if json_text is not None:
        return json_text.encode(), "application/json"
    if file is not None:
        from edgeserve.samples import content_type

        path = Path(file)
        try:
            return path.read_bytes(), content_type(path)
        except OSError as exc:
            raise ConfigError(f"invoke --file {file}: cannot read it ({exc.strerror})") from None
    raise ConfigError("invoke needs --json TEXT or --file PATH")


def invoke(url: str, body: bytes, content_type: str, *, timeout_s: float = 60.0) -> Any:
    """POST `body` to URL/invoke and return the decoded JSON answer (or raise with its error).

    A URL without a scheme (`127.0.0.1:8080`) is taken as http://.
    """
    endpoint = _endpoint(url)
    shown = _USERINFO.sub("", endpoint)  # a password in the URL is not repeated in errors
    try:
        response = httpx.post(
            endpoint, content=body, headers={"Content-Type": content_type}, timeout=timeout_s
        )
    except httpx.InvalidURL as exc:
        raise ConfigError(f"URL {_USERINFO.sub('', url)!r}: {exc}; {EXPECTED}") from None
    except httpx.HTTPError as exc:
        raise EdgeserveError(
            f"{shown}: request failed: {exc}. Hint: is `edgeserve serve` running there?"
        ) from None
    try:
        answer = response.json()
    except ValueError:
        answer = response.text
    if response.is_error:
        message = answer.get("error", answer) if isinstance(answer, dict) else answer
        raise EdgeserveError(f"{shown}: HTTP {response.status_code}: {message}")
    return answer


def _endpoint(url: str) -> str:
    """`HOST:PORT` or `http(s)://...` as the full /invoke URL; any other scheme is refused."""
    if "://" not in url:
        url = f"http://{url}"
    scheme, _, rest = url.partition("://")
    base = url.rstrip("/")
    if scheme.lower() not in ("http", "https") or not rest.strip("/"):
        raise ConfigError(f"URL {_USERINFO.sub('', url)!r}: {EXPECTED}")
    return base if base.endswith("/invoke") else base + "/invoke"
