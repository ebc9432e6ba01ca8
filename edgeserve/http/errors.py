"""The one place where errors become HTTP responses: JSON `{"error": message}` with its status.

An `EdgeserveError` carries its status; `Unavailable` adds `Retry-After`, `Unauthorized`
`WWW-Authenticate`. Starlette's own
HTTPExceptions (unknown route, wrong method) answer in the same JSON shape. A 500 (any other
exception, or an EdgeserveError of status 500 such as a failed batch or handler) is a fault of
ours: logged with its traceback, answered with a generic message that leaks nothing.
A client that hung up gets 499 (nginx's "client closed request"), which no one reads.
"""

from __future__ import annotations

import logging
import math

from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from edgeserve.errors import EdgeserveError, Unauthorized, Unavailable

logger = logging.getLogger("edgeserve.http")

CLIENT_CLOSED_REQUEST = 499
INTERNAL_ERROR = "internal server error; the server log has the details"


def error_response(exc: Exception, where: str = "") -> Response:
    """The response for an exception raised while handling `where` (method and path)."""
    if isinstance(exc, EdgeserveError) and exc.status != 500:
        headers = {}
        if isinstance(exc, Unavailable):
            headers["Retry-After"] = str(max(1, math.ceil(exc.retry_after_s)))
        if isinstance(exc, Unauthorized):
            invalid = ', error="invalid_token"' if exc.invalid else ""
            headers["WWW-Authenticate"] = f'Bearer realm="edgeserve"{invalid}'

        return JSONResponse({"error": exc.message}, status_code=exc.status, headers=headers)
    if isinstance(exc, HTTPException):
        return JSONResponse({"error": exc.detail}, status_code=exc.status_code, headers=exc.headers)
    if isinstance(exc, ClientDisconnect):
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    logger.error("unexpected error in %s", where, exc_info=exc)
    return JSONResponse({"error": INTERNAL_ERROR}, status_code=500)


async def http_exception_handler(request: Request, exc: Exception) -> Response:
    """Starlette's routing errors (404 no route, 405 method) in the same JSON shape."""
    return error_response(exc)


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
