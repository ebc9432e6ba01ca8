"""Before anything goes to AWS: the bundle answers its readiness check as Lambda runs it.

Why here and not after `publish_version`: a version whose init fails publishes as readily as
a good one, and invoking it on AWS cannot be tested here (moto runs code only in Docker
images pulled from the internet). So `deploy` runs the shipped `app.py` under the real runtime
interface client on the emulated Runtime API, as `serve --emulate aws-lambda` does, with the
profile's memory size, timeout and environment, and sends one Function URL event
`GET /v2/health/ready`.

Covered: the handler imports, the model loads and warms up, the adapter answers 200.
Not covered: the package's wheels (built for Lambda's platform; the check runs on this
machine's Python packages) and what only AWS knows (role permissions, quotas).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Mapping
from contextlib import AsyncExitStack
from pathlib import Path

from edgeserve.aws_lambda.emulator import open_emulator
from edgeserve.aws_lambda.environment import Limits, Outcome
from edgeserve.aws_lambda.events import HttpRequest, from_result, to_event
from edgeserve.errors import DeployError

READY = HttpRequest("GET", "/v2/health/ready", "", [("host", "preflight.local")], b"")


def preflight(
    bundle: Path, function_name: str, limits: Limits, variables: Mapping[str, str]
) -> None:
    """Raise DeployError, with the function's own error, unless the bundle answers ready.
    `variables`: the function's environment variables, as deploy configures them."""
    outcome = asyncio.run(_ready(bundle, function_name, limits, variables))
    status = _status(outcome)
    if status != 200:
        raise DeployError(
            f"lambda {function_name}: preflight before upload failed: {_what(outcome, status)}; "
            "nothing was changed on AWS. Hint: reproduce with `edgeserve serve <bundle> "
            "--emulate aws-lambda` and GET /v2/health/ready"
        )


async def _ready(
    bundle: Path, function_name: str, limits: Limits, variables: Mapping[str, str]
) -> Outcome:
    async with AsyncExitStack() as stack:
        emulator = await open_emulator(
            stack, bundle, function_name, limits, log=_quiet, variables=variables
        )
        request_id = str(uuid.uuid4())
        return await emulator.environments[0].invoke(to_event(READY, "url", request_id), request_id)


def _status(outcome: Outcome) -> int | None:
    if outcome.status != "ok":
        return None
    answer = from_result(json.loads(outcome.payload or b"null"), "url")
    return answer.status if answer is not None else None


def _what(outcome: Outcome, status: int | None) -> str:
    if status is not None:
        return f"GET /v2/health/ready answered {status}"
    try:
        message = str(json.loads(outcome.payload).get("errorMessage", ""))
    except (ValueError, AttributeError):
        message = outcome.payload.decode(errors="replace")
    return f"{outcome.error_type}: {message}".rstrip(": ")


def _quiet(line: str) -> None:
    """START/END/REPORT lines: the emulator's log, not the deploy's."""
