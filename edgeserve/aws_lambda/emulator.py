"""`serve --emulate aws-lambda`: run a bundle locally the way AWS Lambda runs it.

    HTTP request -> front (Starlette on 127.0.0.1) -> Lambda event (url | http | rest | alb)
        -> a free execution environment: the real runtime interface client (`awslambdaric`)
           in its own process, on an emulated Runtime API, running the shipped `app.handler`
        -> the handler's result -> HTTP response, or the answer the gateway gives on failure

Why awslambdaric and not a direct call: it is the client the AWS base image runs, so init
(the model loads once per environment), the event/context marshalling, errors and the
one-invocation-at-a-time loop are Lambda's own; it installs from a manylinux wheel here.

Limits, as Lambda and its gateways answer them:
- request event over 6 MB: 413 RequestTooLargeException, the function is not called;
- response over 6 MB: the runtime gets 413, the invocation fails with
  Function.ResponseSizeTooLarge, and the gateway answers its function-error status;
- timeout or memory over the limit: the process is killed (the next call is a cold start),
  and the gateway answers its function-error status.
Function-error answers (`GATEWAY_ERRORS`): API Gateway REST 502 `{"message": "Internal server
error"}` (AWS docs, services-apigateway-errors); HTTP API, Function URL and ALB are assumed to
answer 502 as well (not verified against AWS); `x-amzn-errortype` carries Lambda's errorType.
`--instances N` runs N environments; a request waits for a free one.

`POST /2015-03-31/functions/function/invocations` (the Invoke API's path, as AWS's Runtime
Interface Emulator serves it) takes a raw event instead: a direct invocation (a v2 infer
request, or any JSON), answered as Lambda's Invoke API answers: 200 with the function's result,
`X-Amz-Function-Error: Unhandled` when it failed, 400 InvalidRequestContentException for a body
that is not strict JSON; `X-Amz-Invocation-Type: Event` 202 at once (the invocation runs
after), `DryRun` 204 without one.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import tempfile
import uuid
from collections.abc import Callable, Mapping
from contextlib import AsyncExitStack
from pathlib import Path
from typing import TYPE_CHECKING

import orjson
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from edgeserve.aws_lambda.environment import Environment, Limits, Outcome, runtime_env
from edgeserve.aws_lambda.events import (
    EVENT_KINDS,
    EventKind,
    HttpRequest,
    HttpResponse,
    from_result,
    through_gateway,
    to_event,
)
from edgeserve.aws_lambda.settings import PAYLOAD_LIMIT_BYTES, LambdaSettings, for_bundle
from edgeserve.errors import ConfigError
from edgeserve.kinds import KINDS

if TYPE_CHECKING:
    from edgeserve.bundle import Bundle

APP_TEMPLATE = Path(__file__).parent.parent / "templates" / "aws-lambda" / "app.py"
GATEWAY_ERRORS: dict[EventKind, HttpResponse] = {
    "rest": HttpResponse(
        502, [("content-type", "application/json")], b'{"message": "Internal server error"}'
    ),
    "http": HttpResponse(
        502, [("content-type", "application/json")], b'{"message":"Internal Server Error"}'
    ),
    "url": HttpResponse(
        502, [("content-type", "application/json")], b'{"Message":"Internal Server Error"}'
    ),
    "alb": HttpResponse(
        502, [("content-type", "text/html")], b"<html><body><h1>502 Bad Gateway</h1></body></html>"
    ),
}
METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]
INVOKE_PATH = "/2015-03-31/functions/{function}/invocations"
TOO_LARGE = json.dumps(
    {
        "Message": f"Request must be smaller than {PAYLOAD_LIMIT_BYTES} bytes "
        "for the InvokeFunction operation"
    }
).encode()


class LambdaEmulator:
    """N execution environments behind one HTTP front (`open_emulator`, then `front`)."""

    def __init__(self, environments: list[Environment], event: EventKind) -> None:
        self.environments = environments
        self.event = event
        self.idle: asyncio.Queue[Environment] = asyncio.Queue()
        self.queued: set[asyncio.Task[Outcome]] = set()
        """Asynchronous (`Event`) invocations not done yet."""
        for environment in environments:
            self.idle.put_nowait(environment)

    async def handle(self, request: HttpRequest) -> HttpResponse:
        """One HTTP request through one Lambda invocation."""
        passed = through_gateway(request, self.event)
        if isinstance(passed, HttpResponse):
            return passed
        request_id = str(uuid.uuid4())
        event = to_event(passed, self.event, request_id)
        if len(json.dumps(event)) > PAYLOAD_LIMIT_BYTES:
            return _TOO_LARGE
        return self._answer(await self._invoke(event, request_id))

    async def invoke(self, body: bytes, invocation_type: str = "RequestResponse") -> HttpResponse:
        """A raw event through one invocation, answered as the Invoke API answers: `Event` is
        queued (202 at once, it runs in the background), `DryRun` does not run (204)."""
        if invocation_type == "DryRun":
            return HttpResponse(204, [], b"")
        if len(body) > PAYLOAD_LIMIT_BYTES:
            return _TOO_LARGE
        try:  # strict JSON (no NaN), nesting bounded: what the runtime can unmarshal
            event = orjson.loads(body) if body.strip() else {}
        except orjson.JSONDecodeError as exc:
            message = f"Could not parse request body into json: {exc}"
            refusal = json.dumps({"Type": "User", "message": message}).encode()
            return _json_answer(400, refusal, "InvalidRequestContentException")
        if invocation_type == "Event":
            queued = asyncio.create_task(self._invoke(event, str(uuid.uuid4())))
            self.queued.add(queued)  # held until done: the loop keeps only weak references
            queued.add_done_callback(self.queued.discard)
            return HttpResponse(202, [], b"")
        outcome = await self._invoke(event, str(uuid.uuid4()))
        headers = [("content-type", "application/json"), ("x-amz-executed-version", "$LATEST")]
        if outcome.status != "ok":
            headers.append(("x-amz-function-error", "Unhandled"))
        return HttpResponse(200, headers, outcome.payload)

    async def _invoke(self, event: object, request_id: str) -> Outcome:
        environment = await self.idle.get()
        try:
            return await environment.invoke(event, request_id)
        finally:
            self.idle.put_nowait(environment)

    def _answer(self, outcome: Outcome) -> HttpResponse:
        if outcome.status == "ok":
            response = from_result(json.loads(outcome.payload or b"null"), self.event)
            if response is not None:
                return response
        error = GATEWAY_ERRORS[self.event]
        error_type = outcome.error_type or "Function.MalformedResponse"  # ok, but not a response
        return HttpResponse(
            error.status, [*error.headers, ("x-amzn-errortype", error_type)], error.body
        )


async def open_emulator(
    stack: AsyncExitStack,
    bundle: Path,
    function_name: str,
    limits: Limits,
    event: EventKind = "url",
    instances: int = 1,
    log: Callable[[str], None] = print,
    variables: Mapping[str, str] | None = None,
) -> LambdaEmulator:
    """Start `instances` environments (their runtimes start on first use); closed with `stack`.
    `variables`: the function's environment variables (the profile's `environment`)."""
    task_root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="edgeserve-task-")))
    shutil.copyfile(APP_TEMPLATE, task_root / "app.py")
    env = runtime_env(function_name, limits, bundle.resolve(), task_root, variables)
    environments = [Environment(task_root, env, limits, log) for _ in range(instances)]
    for environment in environments:
        await environment.start()
        stack.push_async_callback(environment.close)
    return LambdaEmulator(environments, event)


def front(emulator: LambdaEmulator, max_body_bytes: int = 4 * PAYLOAD_LIMIT_BYTES) -> Starlette:
    """The HTTP front: every method and path becomes an invocation through an HTTP event, but
    the Invoke API's path, whose body is the event."""

    async def endpoint(request: Request) -> Response:
        try:
            body = await request.body()
        except ClientDisconnect:  # gone mid-body: no invocation, and nobody to answer
            return Response(status_code=499)
        if len(body) > max_body_bytes:
            return Response(TOO_LARGE, 413, media_type="application/json")
        if request.method == "POST" and "function" in request.path_params:
            kind = request.headers.get("x-amz-invocation-type", "RequestResponse")
            return _response(await emulator.invoke(body, kind))
        return _response(await emulator.handle(_http_request(request, body)))

    routes = [Route(INVOKE_PATH, endpoint, methods=["POST"])]
    return Starlette(routes=[*routes, Route("/{path:path}", endpoint, methods=METHODS)])


def _json_answer(status: int, body: bytes, error_type: str) -> HttpResponse:
    headers = [("content-type", "application/json"), ("x-amzn-errortype", error_type)]
    return HttpResponse(status, headers, body)


_TOO_LARGE = _json_answer(413, TOO_LARGE, "RequestTooLargeException")


def _http_request(request: Request, body: bytes) -> HttpRequest:
    return HttpRequest(
        method=request.method,
        path=request.url.path,
        query=request.url.query,
        headers=[(k.decode("latin-1"), v.decode("latin-1")) for k, v in request.headers.raw],
        body=body,
        source_ip=request.client.host if request.client else "127.0.0.1",
    )


def _response(answer: HttpResponse) -> Response:
    """The answer with its headers as given (repeated ones kept), Content-Length recomputed."""
    response = Response(answer.body, answer.status)
    headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in answer.headers]
    length = (b"content-length", str(len(answer.body)).encode())
    response.raw_headers = [length, *(pair for pair in headers if pair[0] != b"content-length")]
    return response


def serve_lambda_emulator(
    path: Path,
    host: str = "127.0.0.1",
    port: int = 9000,
    event: str = "url",
    instances: int = 1,
    *,
    target: str | Path = "aws-lambda",
    log_level: str = "info",
) -> None:
    """Serve a bundle (or a function source, built first) as Lambda runs it, until SIGTERM.

    Memory size, timeout and the function's environment variables come from the target
    profile (`aws-lambda` by default).
    """
    from edgeserve.builder import open_or_build
    from edgeserve.handler import import_handler
    from edgeserve.http.cors import load_cors
    from edgeserve.profiles import load_target

    bundle = open_or_build(path, targets=("aws-lambda",))
    if bundle.handler_path is not None:  # as `serve` refuses it; else every request was a 502
        import_handler(bundle.handler_path, bundle.handler_source)
    profile = load_target(target, function_dir=path if path.is_dir() else None)
    if profile.driver != "aws-lambda":
        raise ConfigError(
            f"--target {target}: a profile for {profile.driver}; --emulate aws-lambda takes an "
            "aws-lambda one (its memory and timeout)"
        )
    settings = for_bundle(profile, bundle)
    # a bad origin is refused here, not in each environment's init (every request a 502)
    load_cors(bundle.manifest.cors, {**os.environ, **settings.environment})
    kind = _event_kind(event)
    asyncio.run(_serve(bundle, settings, kind, instances, host, port, log_level))


async def _serve(
    bundle: Bundle,
    settings: LambdaSettings,
    event: EventKind,
    instances: int,
    host: str,
    port: int,
    log_level: str,
) -> None:
    import uvicorn

    # uvicorn re-raises SIGTERM once it has shut down; Python's default would end the process
    # there, before the environments close, and their orphaned runtimes print tracebacks
    signal.signal(signal.SIGTERM, _exit_on_signal)
    limits = Limits(settings.memory_mb, settings.timeout_s)
    name, variables = settings.name_for(bundle.name), settings.environment
    async with AsyncExitStack() as stack:
        emulator = await open_emulator(
            stack, bundle.root, name, limits, event, instances, _log, variables
        )
        environments = f"{instances} execution environment{'s' if instances > 1 else ''}"
        _log(
            f"emulating AWS Lambda: function {name}, {limits.memory_mb} MB, timeout "
            f"{limits.timeout_s:g} s, {environments} (each starts cold on its first request), "
            f"requests arrive as {event} events, served by {KINDS['aws-lambda'].backends[0]} "
            "as on Lambda"
        )
        config = uvicorn.Config(
            front(emulator), host=host, port=port, log_level=log_level, access_log=False
        )
        await uvicorn.Server(config).serve()


def _exit_on_signal(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def _event_kind(event: str) -> EventKind:
    for kind in EVENT_KINDS:
        if kind == event:
            return kind
    raise ConfigError(f"--event {event!r}: expected one of {list(EVENT_KINDS)}")


def _log(line: str) -> None:
    print(line, flush=True)
