"""The Lambda side of a function: the same ASGI app, behind Mangum, built once per container.

Mangum would run the ASGI lifespan (and so load the model) on every invocation
(Kludex/mangum#342), so the lifespan is off and `create_handler` enters the data plane's
`serving(runtime)` once per container, on the event loop Mangum then reuses for every
invocation: the batcher's workers live on that loop, and the runtime serves while the
container lives.
"""

from __future__ import annotations

import asyncio
import os
from contextlib import AsyncExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgeserve.aws_lambda import direct
from edgeserve.aws_lambda import incoming as events
from edgeserve.aws_lambda.remaining import Bounded
from edgeserve.dataplane.lifecycle import serving

if TYPE_CHECKING:
    from mangum import Mangum
    from mangum.types import ASGI

    from edgeserve.http.cors import Cors

TARGET = "aws-lambda"
QUIET_LIBRARIES = {"ORT_DISABLE_TELEMETRY": "1"}
"""ONNX Runtime's telemetry writes a device id under ~/.cache, which Lambda mounts read-only:
it warned "Failed to persist telemetry device ID" at every cold start. Read when onnxruntime
is imported, so set before the runtime loads; the function's environment may set it back."""
BUNDLE_ENV = "EDGESERVE_BUNDLE"
BUNDLE_DIR = "bundle"
"""Where packaging puts the bundle, relative to the task root (LAMBDA_TASK_ROOT)."""


def bundle_path() -> Path:
    """`EDGESERVE_BUNDLE`, else `$LAMBDA_TASK_ROOT/bundle` (the layout of the zip and the image)."""
    if explicit := os.environ.get(BUNDLE_ENV):
        return Path(explicit)
    return Path(os.environ.get("LAMBDA_TASK_ROOT", ".")) / BUNDLE_DIR


def create_handler(path: Path | None = None) -> LambdaHandler:
    """Load the bundle, start its runtime in Lambda mode, and wrap its app for Lambda events."""
    for name, value in QUIET_LIBRARIES.items():
        os.environ.setdefault(name, value)
    from edgeserve.bundle import Bundle
    from edgeserve.dataplane.settings import LogSettings
    from edgeserve.http.app import create_app
    from edgeserve.kinds import KINDS
    from edgeserve.runtime import Runtime

    # the backend Lambda ships (ONNX Runtime alone): the emulator computes the same numbers, not
    # OpenVINO's (bf16 under precision "auto") where OpenVINO happens to be installed
    backend = KINDS[TARGET].backends[0]
    bundle = Bundle.open(path or bundle_path())
    # one invocation at a time per instance: waiting for company is pure latency, so the batcher
    # adds no delay and runs one batch at a time
    batching = bundle.manifest.batching.model_copy(
        update={"max_queue_delay_ms": 0.0, "instances": 1}
    )
    runtime = Runtime.load(bundle, backend=backend, batching=batching)
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    lifetime = AsyncExitStack()  # held by the handler: never left while the container lives
    loop.run_until_complete(lifetime.enter_async_context(serving(runtime)))
    logs = LogSettings(
        "on AWS Lambda each instance of the function logs on its own, and a change would "
        "reach only the instance that answered it, for as long as that instance lives"
    )
    handler = wrap(create_app(runtime, log_settings=logs), model=runtime.name, loop=loop)
    handler.lifetime = lifetime
    return handler


def wrap(
    app: ASGI, model: str | None = None, loop: asyncio.AbstractEventLoop | None = None
) -> LambdaHandler:
    """The Lambda handler for an ASGI app: REST v1, HTTP v2, Function URL and ALB events, and
    direct invocations carrying a v2 infer request for `model`; every invocation runs on
    `loop` (a new one when not given), answered 504 before Lambda's timeout (remaining.py).
    The handler's own refusals carry the app's CORS headers (`app.cors`, where it has one)."""
    from mangum import Mangum

    bounded = Bounded(app)  # each request within its invocation's remaining time
    mangum = Mangum(bounded, lifespan="off")
    return LambdaHandler(
        mangum, model, loop or asyncio.new_event_loop(), getattr(app, "cors", None)
    )


class LambdaHandler:
    """Every event gets an answer; nothing raises out of the handler (Lambda would report an
    unhandled error and the caller would learn nothing).

    Mangum runs each invocation on the thread's current event loop. The handler makes its own
    loop current first: anything that ran `asyncio.run` in the container since (an import, a
    library) leaves the thread with none, and Mangum then failed every event with "There is
    no current event loop"."""

    def __init__(
        self,
        mangum: Mangum,
        model: str | None,
        loop: asyncio.AbstractEventLoop,
        cors: Cors | None = None,
    ) -> None:
        self.mangum, self.model, self.loop, self.cors = mangum, model, loop, cors
        self.lifetime: AsyncExitStack | None = None  # what keeps the runtime serving

    def __call__(self, event: object, context: Any) -> dict[str, Any]:
        if not isinstance(event, dict):
            return direct.not_http(event)
        kind = events.kind_of(event)
        if kind is None:
            if self.model is not None and direct.is_infer_request(event):
                if why := direct.binary_asked(event):
                    return {"error": why, "status": 400}
                response = self._http(direct.infer_event(event, self.model), "http-v2", context)
                return direct.direct_answer(response)
            return direct.not_http(event)
        event = events.without_nulls(event, kind)
        return events.finished(self._http(event, kind, context), event, kind, self.cors)

    def _http(self, event: dict[str, Any], kind: str, context: Any) -> dict[str, Any]:
        where = f"malformed {events.KINDS[kind]} event"
        problem = events.problem_in(event, kind)
        if problem:
            return events.refusal(400, f"{where}: {problem}", event, kind, self.cors)
        if cut := events.cut_short(event, kind):
            return events.refusal(413, cut, event, kind, self.cors)
        asyncio.set_event_loop(self.loop)
        try:
            as_sent = events.decoded(events.routed(event, kind), kind)
            answer: dict[str, Any] = self.mangum(as_sent, context)
        except (KeyError, IndexError, TypeError, AttributeError, ValueError, RuntimeError) as exc:
            # Mangum's own reading of the event (the app's errors are responses already; its
            # RuntimeError: no handler of its own takes the event)
            found = (
                f"missing field {exc}"
                if isinstance(exc, KeyError)
                else f"{type(exc).__name__} {exc}"
            )
            return events.refusal(400, f"{where}: {found}", event, kind, self.cors)
        return answer
