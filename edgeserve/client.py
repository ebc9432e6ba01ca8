"""A small client for a function's /invoke, used by `edgeserve invoke`; a KServe v2 infer
request (`{"inputs": [...]}`, init's samples/v2.json) goes to the served model's v2 infer route
instead, which is where it belongs (/invoke refused it, pointing there)."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
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
        try:
            json.loads(json_text)
        except ValueError as exc:  # it went to the server, whose 400 said less of where
            raise ConfigError(f"invoke --json: not valid JSON: {exc}") from None
        return json_text.encode(), "application/json"
    if file is not None:
        from edgeserve.samples import content_type

        path = Path(file)
        try:
            return path.read_bytes(), content_type(path)
        except OSError as exc:
            raise ConfigError(f"invoke --file {file}: cannot read it ({exc.strerror})") from None
    raise ConfigError("invoke needs --json TEXT or --file PATH")


def invoke(
    url: str,
    body: bytes,
    content_type: str,
    *,
    timeout_s: float = 60.0,
    headers: Sequence[tuple[str, str]] = (),
) -> Any:
    """POST `body` to URL/invoke and return the decoded JSON answer (or raise with its error).

    A URL without a scheme (`127.0.0.1:8080`) is taken as http://. A v2 infer request is
    POSTed to /v2/models/<the served model>/infer (a URL that names the route: there).
    `headers` go with every request (a function with auth on takes a token so).
    """
    endpoint = _endpoint(url)
    sent = [*headers, ("Content-Type", content_type)]
    if _is_v2_request(body, content_type) and endpoint.endswith("/invoke"):
        base = endpoint.removesuffix("/invoke")
        index = _answer(f"{base}/v2/repository/index", b"{}", sent, timeout_s)
        names = [model["name"] for model in index if isinstance(model, dict) and "name" in model]
        if len(names) != 1:
            raise EdgeserveError(
                f"{_USERINFO.sub('', base)}: a v2 infer request needs the model to send it to, "
                f"and the server lists {names}. Hint: give the URL of its route, "
                "http://HOST:PORT/v2/models/NAME/infer"
            )
        endpoint = f"{base}/v2/models/{names[0]}/infer"
    return _answer(endpoint, body, sent, timeout_s, url)


def _answer(
    endpoint: str, body: bytes, headers: list[tuple[str, str]], timeout_s: float, url: str = ""
) -> Any:
    """The decoded JSON answer of one POST (or raise with its error)."""
    shown = _USERINFO.sub("", endpoint)  # a password in the URL is not repeated in errors
    try:
        response = httpx.post(endpoint, content=body, headers=headers, timeout=timeout_s)
    except httpx.InvalidURL as exc:
        raise ConfigError(
            f"URL {_USERINFO.sub('', url or endpoint)!r}: {exc}; {EXPECTED}"
        ) from None
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


def _is_v2_request(body: bytes, content_type: str) -> bool:
    """A JSON body that is a KServe v2 infer request: `inputs` a list of tensors, each with its
    name, shape and datatype (a handler's own payload may have `inputs` of another kind)."""
    if content_type != "application/json" or b'"inputs"' not in body:
        return False
    try:
        request = json.loads(body)
    except ValueError:
        return False
    inputs = request.get("inputs") if isinstance(request, dict) else None
    return (
        isinstance(inputs, list)
        and bool(inputs)
        and all(
            isinstance(tensor, dict) and {"name", "shape", "datatype"} <= tensor.keys()
            for tensor in inputs
        )
    )


def _endpoint(url: str) -> str:
    """`HOST:PORT` or `http(s)://...` as the full /invoke URL (a route's URL as it is); any
    other scheme is refused."""
    if "://" not in url:
        url = f"http://{url}"
    scheme, _, rest = url.partition("://")
    base = url.rstrip("/")
    if scheme.lower() not in ("http", "https") or not rest.strip("/"):
        raise ConfigError(f"URL {_USERINFO.sub('', url)!r}: {EXPECTED}")
    return base if base.endswith(("/invoke", "/infer")) else base + "/invoke"
