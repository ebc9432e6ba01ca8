"""The one place where errors become gRPC status codes, as `http/errors.py` makes them HTTP
responses: the same messages, the code read from the error's HTTP status.

A 500 that is not the handler's (a backend out of memory, a bug of ours) is logged with its
traceback and answered INTERNAL with a message that leaks nothing, as over HTTP.
"""

from __future__ import annotations

import logging

import grpc

from edgeserve.errors import EdgeserveError, HandlerError

logger = logging.getLogger("edgeserve.grpc")

INTERNAL_ERROR = "internal server error; the server log has the details"

CODES = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    408: grpc.StatusCode.DEADLINE_EXCEEDED,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    422: grpc.StatusCode.INVALID_ARGUMENT,  # ModelRefused: the same request fails again
    431: grpc.StatusCode.RESOURCE_EXHAUSTED,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}
"""Each HTTP status of the error tree (errors.py) as its gRPC code; any other is INTERNAL."""


def status_of(exc: Exception, method: str) -> tuple[grpc.StatusCode, str]:
    """The code and message answering `exc`, raised while serving `method`."""
    if isinstance(exc, EdgeserveError) and exc.status in CODES:
        return CODES[exc.status], exc.message
    if isinstance(exc, HandlerError):  # the function's bug, said plainly to its caller
        logger.error("%s: %s (%s)", exc.origin or "handler", exc.message, method)
        return (
            grpc.StatusCode.INTERNAL,
            f"{exc.message} (a bug in the function's handler, not in the request)",
        )
    logger.error("unexpected error in %s", method, exc_info=exc)
    return grpc.StatusCode.INTERNAL, INTERNAL_ERROR
