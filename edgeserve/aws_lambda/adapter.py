"""The Lambda side of a function: the same ASGI app, behind Mangum, built once per container.

Mangum would run the ASGI lifespan (and so load the model) on every invocation
(Kludex/mangum#342), so the lifespan is off and `create_handler` starts the runtime itself, on
the event loop Mangum then reuses for every invocation: the batcher's workers live on that loop.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mangum import Mangum
    from mangum.types import ASGI

BUNDLE_ENV = "EDGESERVE_BUNDLE"
BUNDLE_DIR = "bundle"
"""Where packaging puts the bundle, relative to the task root (LAMBDA_TASK_ROOT)."""


def bundle_path() -> Path:
    """`EDGESERVE_BUNDLE`, else `$LAMBDA_TASK_ROOT/bundle` (the layout of the zip and the image)."""
    if explicit := os.environ.get(BUNDLE_ENV):
        return Path(explicit)
    return Path(os.environ.get("LAMBDA_TASK_ROOT", ".")) / BUNDLE_DIR


def create_handler(path: Path | None = None) -> Mangum:
    """Load the bundle, start its runtime in Lambda mode, and wrap its app for Lambda events."""
    from edgeserve.bundle import Bundle
    from edgeserve.http.app import create_app
    from edgeserve.runtime import Runtime

    # Lambda ships ONNX Runtime alone (build.PLATFORM_BACKENDS): the emulator computes the same
    # numbers, not OpenVINO's (bf16 under precision "auto") where OpenVINO happens to be installed
    runtime = Runtime.load(
        Bundle.open(path or bundle_path()), backend="onnxruntime", lambda_mode=True
    )
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    loop.run_until_complete(runtime.start())
    return wrap(create_app(runtime))


def wrap(app: ASGI) -> Mangum:
    """The Lambda handler for an ASGI app: REST v1, HTTP v2, Function URL and ALB events."""
    from mangum import Mangum

    return Mangum(app, lifespan="off")
