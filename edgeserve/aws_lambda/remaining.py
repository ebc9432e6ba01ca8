"""An invocation's time left: a request still running shortly before Lambda's timeout is
answered 504 by the function itself.

Past the function's timeout Lambda stops the invocation ("Task timed out after N seconds"): the
caller gets the gateway's bare 502 or 504 with no word of what ran out, and the environment is
replaced, so the next request waits for a cold start (the model loads again). So the app runs
under the time the invocation has left (`context.get_remaining_time_in_millis()`, which
Mangum puts in the scope as `aws.context`), less RESERVE_S to send the answer back. Work that
was cut off (a handler hook on its worker thread, a batch on the device) finishes in the
background and is dropped; only code that holds the event loop (a hook learned to be cheap
enough to run on it) or the GIL cannot be cut off, and then Lambda's own timeout stands.
"""

from __future__ import annotations

import asyncio

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from edgeserve.errors import DeadlineExceeded
from edgeserve.http.errors import error_response

RESERVE_S = 0.5
"""Time kept back from the invocation's remaining time: for the 504 to leave the function, with
room for an event loop that wakes late."""


class Bounded:
    """The ASGI app, each request bounded by its invocation's remaining time (where Lambda's
    context says it; no context, or none left: unbounded, as when a test calls the handler)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        remaining = getattr(scope.get("aws.context"), "get_remaining_time_in_millis", None)
        left_ms = remaining() if remaining is not None else None
        if scope["type"] != "http" or not isinstance(left_ms, int | float) or left_ms <= 0:
            # none left is no deadline Lambda gave (it ends invocations itself): a context
            # made without one (a runtime client that got no deadline, a test harness's)
            await self.app(scope, receive, send)
            return
        timer = asyncio.timeout(max(0.0, left_ms / 1000 - RESERVE_S))

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":  # answered: no cut-off now
                timer.reschedule(None)
            await send(message)

        try:
            async with timer:
                await self.app(scope, receive, sending)
        except TimeoutError:
            if not timer.expired():  # the app's own, not the invocation's time running out
                raise
            await self._too_late(left_ms, scope, receive, send)

    async def _too_late(self, left_ms: float, scope: Scope, receive: Receive, send: Send) -> None:
        response = error_response(
            DeadlineExceeded(
                f"the invocation's time ran out: Lambda stops the function at its timeout, and "
                f"{left_ms} ms were left when this request arrived (answered {RESERVE_S:g} s "
                "before, so that this answer gets back). Hint: raise timeout_s in the "
                "aws-lambda target profile (Lambda allows up to 900 s), or send fewer items "
                "per request"
            )
        )
        cors = getattr(self.app, "cors", None)  # the app's CORS layer, outside which this is
        origin = dict(scope["headers"]).get(b"origin")
        if cors is not None and origin is not None:
            response.raw_headers += cors.answer_headers(origin.decode("latin-1"))
        await response(scope, receive, send)
