"""The one place where errors become HTTP responses: JSON `{"error": message}` with its status.

An `EdgeserveError` carries its status; `Unavailable` adds `Retry-After`, `Unauthorized`
`WWW-Authenticate`. Starlette's own
HTTPExceptions (unknown route, wrong method) answer in the same JSON shape. A 500 (any other
exception, or an EdgeserveError of status 500: a backend out of memory, a broken handler) is a
fault of ours: logged with its traceback, answered with a generic message that leaks nothing.
A handler that broke its contract (`HandlerError`) is answered 500 with what it returned and
what was expected: type names and tensor names, which the v2 metadata shows anyway.
A client that hung up gets 499 (nginx's "client closed request"), which no one reads.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable, Sequence
from http import HTTPStatus

import orjson
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from edgeserve.errors import EdgeserveError, HandlerError, Unauthorized, Unavailable, echo

logger = logging.getLogger("edgeserve.http")

CLIENT_CLOSED_REQUEST = 499
INTERNAL_ERROR = "internal server error; the server log has the details"


def error_response(exc: Exception, where: str = "", routes: str = "") -> Response:
    """The response for an exception raised while handling `where` (method and path); `routes`,
    the routes served, are named to a request for none of them."""
    if isinstance(exc, EdgeserveError) and exc.status != 500:
        headers = {}
        if isinstance(exc, Unavailable):
            headers["Retry-After"] = str(max(1, math.ceil(exc.retry_after_s)))
        if isinstance(exc, Unauthorized):
            invalid = ', error="invalid_token"' if exc.invalid else ""
            headers["WWW-Authenticate"] = f'Bearer realm="edgeserve"{invalid}'

        return JSONResponse({"error": exc.message}, status_code=exc.status, headers=headers)
    if isinstance(exc, HandlerError):  # the function's bug, said plainly to its caller
        logger.error("%s: %s (%s)", exc.origin or "handler", exc.message, where)
        body = {"error": f"{exc.message} (a bug in the function's handler, not in the request)"}
        return JSONResponse(body, status_code=500)
    if isinstance(exc, HTTPException):
        body = {"error": _routing_message(exc, where, routes)}
        return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)
    if isinstance(exc, ClientDisconnect):
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    logger.error("unexpected error in %s", where, exc_info=exc)
    return JSONResponse({"error": INTERNAL_ERROR}, status_code=500)


def raw_response(error: EdgeserveError, headers: Sequence[tuple[bytes, bytes]] = ()) -> bytes:
    """`error` as HTTP/1.1 bytes that close the connection, with `headers` added (CORS): for
    the protocol layer, which answers (a slow client's 408) where no ASGI response can be sent."""
    body = orjson.dumps({"error": error.message})
    head = (
        f"HTTP/1.1 {error.status} {HTTPStatus(error.status).phrase}\r\n"
        f"content-type: application/json\r\ncontent-length: {len(body)}\r\n"
        "connection: close\r\n"
    )
    added = b"".join(name + b": " + value + b"\r\n" for name, value in headers)
    return head.encode("ascii") + added + b"\r\n" + body


def _routing_message(exc: HTTPException, where: str, routes: str) -> str:
    """A bare "Not Found" read as a wrong model or server to a client that had the path
    wrong (`/predict`, the infer URL given to `edgeserve invoke`): say which request it was,
    and what is served instead."""
    allowed = (exc.headers or {}).get("Allow")
    if not where:
        return exc.detail
    if exc.status_code == 405 and allowed:
        return f"{exc.detail}: {where}; this route takes {', '.join(sorted(allowed.split(', ')))}"
    if exc.status_code == 404 and routes:
        return f"{exc.detail}: no route {where}. Hint: this function serves {routes}"
    return f"{exc.detail}: {where}"


def routing_error_handler(routes: str) -> Callable[[Request, Exception], Awaitable[Response]]:
    """Starlette's routing errors (404 no route, 405 method) in the same JSON shape, naming
    the request and, to one for no route, `routes`."""

    async def handler(request: Request, exc: Exception) -> Response:
        return error_response(exc, f"{echo(request.method)} {echo(request.url.path)}", routes)

    return handler


class ErrorMiddleware:
    """Turns any exception raised before the response started into `error_response`."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception as exc:
            if started:
                raise
            response = error_response(exc, f"{scope['method']} {scope['path']}")
            await response(scope, receive, send)
