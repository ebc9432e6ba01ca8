"""The inference routes, v2 infer and `/invoke`, as plain ASGI: the path every request takes.

For a small model this path *is* the serving cost, so it skips what the other routes use:
no router (the app looks the exact path up in a dict), no middleware stack, no Request or
Response objects. Errors still become responses in one place (`errors.error_response`).

A request that waits watches its connection, so that a client that hangs up has its queued
items dropped before they run; the watch starts only once the request has waited
`WATCH_AFTER_S`, because a watcher task per request costs more than the short requests it
would guard.
"""

from __future__ import annotations

import asyncio
import re
import time
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from edgeserve.dataplane import DataPlane
from edgeserve.dataplane.regions import ClientRegions
from edgeserve.errors import InvalidInput, echo
from edgeserve.http import forms, invoke, v2
from edgeserve.http.body import read_body, request_headers
from edgeserve.http.drain import Drain
from edgeserve.http.errors import error_response
from edgeserve.samples import is_media
from edgeserve.sharedmemory import Regions

if TYPE_CHECKING:
    from edgeserve.dataplane import ServedFunction

T = TypeVar("T")
WATCH_AFTER_S = 0.02
OFF_LOOP_BYTES = 1 << 20
"""Bodies over this size are decoded on a worker thread, where the event loop and every other
client get their turns: a 56 MB JSON request of a million tiny inputs held the loop for 9 s,
and a health probe waited as long. Smaller ones stay on the loop (a hop costs ~0.1 ms)."""


@dataclass(frozen=True)
class Call:
    """What a handler gets of a request: its path, headers (names in lower case) and body."""

    path: str
    headers: dict[str, str]
    body: bytes
    arrived: float  # time.monotonic() when the request reached the app
    client: str = ""  # the client's host (after uvicorn's trusted proxy headers)


@dataclass(frozen=True)
class Reply:
    body: bytes
    media_type: str
    header_length: int | None = None  # v2 binary responses: Inference-Header-Content-Length


Handler = Callable[[Call], Awaitable[Reply]]
_V2_INFER = re.compile(r"/v2/models/(?P<model>[^/]+)(?:/versions/(?P<version>[^/]+))?/infer")


class InferenceRoutes:
    """The inference routes of one function: `app_for` says whether a path is one."""

    def __init__(self, runtime: ServedFunction, limit: int, regions: Regions) -> None:
        self.runtime = runtime
        self.plane = DataPlane(runtime)
        self.limit = limit
        self.regions = regions
        self.drain = Drain()
        self._v2_infer = self._asgi(self.v2_infer, self._check_v2_path)
        self._invoke = self._asgi(self.invoke)

    def app_for(self, path: str) -> ASGIApp | None:
        """The ASGI app serving `path`, or None when it is not an inference route."""
        if path == "/invoke":
            return self._invoke
        return self._v2_infer if _V2_INFER.fullmatch(path) else None

    def _check_v2_path(self, path: str) -> None:
        """The model and version in the path, checked before the body is read: a client that
        sent `Expect: 100-continue` to a wrong URL was told to go on, and its body uploaded."""
        match = _V2_INFER.fullmatch(path)
        assert match is not None  # app_for routes only matching paths here
        self.plane.check_model(match["model"], match["version"])

    async def v2_infer(self, call: Call) -> Reply:
        shared = ClientRegions(self.regions, call.client, self.limit)
        try:
            decoded = await off_loop(
                call.body,
                v2.decode_request,
                call.body,
                call.headers.get(v2.HEADER_LENGTH),
                shared.read,
                self.runtime.signature,
            )
        except InvalidInput:
            media = invoke.media_type(call.headers.get("content-type"))
            if is_media(media):
                raise InvalidInput(_a_file(len(call.body), media)) from None
            if media in invoke.MSGPACK_TYPES:
                raise InvalidInput(_msgpack_to_v2(len(call.body), media)) from None
            raise
        shared.check_outputs(decoded.outputs or ())
        outputs = await self.plane.infer(decoded, arrived=call.arrived)
        shared.write_outputs(outputs)
        function = self.plane.function
        content, header_length = v2.encode_response(
            function.name, function.model_version, decoded.id, outputs
        )
        if header_length is None:
            return Reply(content, "application/json")
        return Reply(content, "application/octet-stream", header_length)

    async def invoke(self, call: Call) -> Reply:
        header = call.headers.get("content-type")
        content_type, body = invoke.media_type(header), call.body
        if content_type == forms.FORM_TYPE and header is not None:  # off the loop: 30 MB, 0.1 s
            body, content_type = await asyncio.to_thread(forms.form_file, body, header)
        try:
            payload = await off_loop(body, invoke.decode_payload, body, content_type)
        except InvalidInput as exc:
            if v2.HEADER_LENGTH not in call.headers:
                raise
            raise InvalidInput(f"{exc.message}. {_BINARY_TO_INVOKE}") from None
        result = await self.runtime.invoke(payload, content_type, arrived=call.arrived)
        content, media_type = invoke.encode_result(result, call.headers.get("accept"))
        return Reply(content, media_type)

    def _asgi(self, handler: Handler, check_path: Callable[[str], None] | None = None) -> ASGIApp:
        """`handler` as an ASGI app; `check_path` refuses a path before the body is read."""
        drain, runtime, limit = self.drain, self.runtime, self.limit

        async def app(scope: Scope, receive: Receive, send: Send) -> None:
            arrived = time.monotonic()
            task = asyncio.current_task()
            assert task is not None
            drain.tasks.add(task)
            reply: Reply | Response
            try:
                headers = request_headers(scope["headers"])
                if scope["method"] != "POST":
                    raise HTTPException(405, headers={"Allow": "POST"})
                drain.check_open()
                path = route_path(scope)
                if check_path is not None:
                    check_path(path)
                await runtime.admit(arrived)  # a full queue costs no reading nor decoding
                body = await read_body(receive, headers, limit)
                client = (scope.get("client") or ("",))[0]
                call = Call(path, headers, body, arrived, client)
                reply = await until_disconnected(receive, handler(call), task)
            except asyncio.CancelledError as cancelled:  # at the drain bound: the 503 saying so
                reply = error_response(drain.answer(cancelled), _where(scope))
            except Exception as exc:
                reply = error_response(exc, _where(scope))
            finally:
                drain.tasks.discard(task)
            if isinstance(reply, Reply):
                await _send(send, reply)
            else:
                await reply(scope, receive, send)

        return app


async def off_loop(body: bytes, decode: Callable[..., T], *args: Any) -> T:
    """`decode(*args)`, on a worker thread when `body` is over OFF_LOOP_BYTES, one such body
    at a time (in each event loop: a process's HTTP and gRPC share one). Decoding holds the
    GIL, so several at once finished no sooner, but each held its Python objects meanwhile:
    a 60 MB JSON body of numbers peaked near 1 GB, and four sent at once near 2 GB."""
    if len(body) <= OFF_LOOP_BYTES:
        return decode(*args)
    async with _decoding():
        return await asyncio.to_thread(decode, *args)


_DECODING: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
    weakref.WeakKeyDictionary()
)


def _decoding() -> asyncio.Semaphore:
    """The running loop's turn at decoding a large body (a semaphore serves one loop)."""
    loop = asyncio.get_running_loop()
    gate = _DECODING.get(loop)
    if gate is None:
        gate = _DECODING[loop] = asyncio.Semaphore(1)
    return gate


def _a_file(size: int, media: str) -> str:
    """What to do with a file sent to the v2 route (an image to a classifier, a user's first
    try), which read as "not UTF-8 text, so not JSON"."""
    return (
        f"request body: {size} bytes sent as {echo(media)}; a KServe v2 request is a JSON "
        "object naming the input tensors (their data in it, or as binary after it: "
        "Inference-Header-Content-Length). Hint: POST the file to /invoke, where a handler's "
        "preprocess turns it into the model's tensors (`edgeserve help manifest`, [handler]), "
        "or send its decoded values as a tensor"
    )


def _msgpack_to_v2(size: int, media: str) -> str:
    """What to do with msgpack sent to the v2 route, which read as "not UTF-8 text, so not
    JSON (... msgpack sent with Content-Type application/json?)"."""
    return (
        f"request body: {size} bytes sent as {media}; a KServe v2 request is JSON (binary "
        "tensors follow a JSON header: Inference-Header-Content-Length). Hint: POST msgpack "
        "to /invoke, which reads it"
    )


_BINARY_TO_INVOKE = (
    "Hint: the request has an Inference-Header-Content-Length header, which only the v2 "
    "route reads (a JSON header, then binary tensors): POST it to /v2/models/<name>/infer; "
    "/invoke reads the whole body as JSON, msgpack or a file"
)


def _where(scope: Scope) -> str:
    return f"{scope['method']} {scope['path']}"


def route_path(scope: Scope) -> str:
    """The path the app routes on: behind a proxy prefix (root_path), the part after it."""
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    if root and path.startswith(root + "/"):
        return path[len(root) :]
    return path


async def _send(send: Send, reply: Reply) -> None:
    headers = [
        (b"content-type", reply.media_type.encode()),
        (b"content-length", str(len(reply.body)).encode()),
    ]
    if reply.header_length is not None:
        headers.append((v2.HEADER_LENGTH.encode(), str(reply.header_length).encode()))
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": reply.body})


async def until_disconnected(receive: Receive, work: Awaitable[T], task: asyncio.Task[None]) -> T:
    """Await `work` in `task` (this one); once it has waited WATCH_AFTER_S, also watch the
    connection and cancel the work if the client hangs up (raising ClientDisconnect)."""
    hung_up = False
    watcher: asyncio.Task[None] | None = None

    async def watch() -> None:
        nonlocal hung_up
        while (await receive())["type"] != "http.disconnect":
            pass
        hung_up = True
        task.cancel()

    def start_watching() -> None:
        nonlocal watcher
        watcher = asyncio.ensure_future(watch())

    timer = asyncio.get_running_loop().call_later(WATCH_AFTER_S, start_watching)
    try:
        return await work
    except asyncio.CancelledError:
        if not hung_up:
            raise
        task.uncancel()
        raise ClientDisconnect() from None
    finally:
        timer.cancel()
        if watcher is not None:
            watcher.cancel()
