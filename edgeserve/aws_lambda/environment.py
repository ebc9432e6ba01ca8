"""One emulated Lambda execution environment: a runtime process that initializes once.

The process is the real Lambda runtime interface client (`python -m awslambdaric app.handler`)
talking to this environment's emulated Runtime API, as in the AWS base image. Init is timed
from the spawn to the runtime's first `next`; each invocation runs under the function timeout
and memory size; a timeout or a process over its memory is killed, and the next invocation
starts a fresh environment (a cold start again), as Lambda does.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from edgeserve.aws_lambda.runtime_api import RESPONSE_TOO_LARGE, Invocation, RuntimeApi

INIT_TIMEOUT_S = 10.0
"""Lambda's limit on the init phase of on-demand functions."""
WATCH_INTERVAL_S = 0.05
"""How often a running invocation's memory peak (/proc/<pid>/status VmHWM) is read."""


@dataclass(frozen=True)
class Limits:
    memory_mb: int
    timeout_s: float


@dataclass(frozen=True)
class Outcome:
    """How an invocation ended: `ok` (payload = the handler's JSON result) or a function error
    (payload = Lambda's `{"errorType", "errorMessage"}`)."""

    status: str  # "ok" | "error" | "timeout" | "killed"
    payload: bytes

    @property
    def error_type(self) -> str | None:
        if self.status == "ok":
            return None
        try:
            return str(json.loads(self.payload).get("errorType", "Unhandled"))
        except (ValueError, AttributeError):
            return "Unhandled"


class Environment:
    """A runtime process plus its Runtime API; `invoke` runs one event at a time."""

    def __init__(
        self,
        task_root: Path,
        env: dict[str, str],
        limits: Limits,
        log: Callable[[str], None],
    ) -> None:
        self.task_root = task_root
        self.env = env
        self.limits = limits
        self.log = log
        self.api = RuntimeApi(env.get("AWS_LAMBDA_FUNCTION_NAME", "function"))
        self.address = ""
        self.process: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        self.address = await self.api.start()

    async def close(self) -> None:
        await self._kill()
        await self.api.close()

    async def invoke(self, event: object, request_id: str) -> Outcome:
        """Run one event; init first when this environment has no live runtime process."""
        init_ms = None if self._alive() else await self._init()
        if self.api.init_error is not None:
            await self._kill()
            return Outcome("error", self.api.init_error)
        self.log(f"START RequestId: {request_id} Version: $LATEST")
        started = time.perf_counter()
        outcome = await self._run(request_id, event)
        duration_ms = (time.perf_counter() - started) * 1000
        if outcome.status == "timeout":
            self.log(
                f"{_now()} {request_id} Task timed out after {self.limits.timeout_s:.2f} seconds"
            )
        self.log(f"END RequestId: {request_id}")
        self.log(self._report(request_id, duration_ms, init_ms, outcome))
        if outcome.status in ("timeout", "killed") or outcome.error_type == RESPONSE_TOO_LARGE:
            await self._kill()  # the runtime client exits after a refused response anyway
        return outcome

    async def _init(self) -> float:
        self.api.reset()
        started = time.perf_counter()
        self.process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "awslambdaric", "app.handler",
            cwd=self.task_root,
            env={**self.env, "AWS_LAMBDA_RUNTIME_API": self.address},
        )  # fmt: skip
        ready = asyncio.ensure_future(self.api.ready.wait())
        exited = asyncio.ensure_future(self.process.wait())
        await asyncio.wait({ready, exited}, timeout=max(INIT_TIMEOUT_S, self.limits.timeout_s),
                           return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
        for waiter in (ready, exited):
            waiter.cancel()
        if not self.api.ready.is_set():
            self.api.init_error = _error(
                "Runtime.ExitError", "runtime exited or timed out during init"
            )
        return (time.perf_counter() - started) * 1000

    async def _run(self, request_id: str, event: object) -> Outcome:
        deadline = time.monotonic() + self.limits.timeout_s
        deadline_ms = int((time.time() + self.limits.timeout_s) * 1000)
        invocation = Invocation(request_id, json.dumps(event).encode(), deadline_ms)
        await self.api.pending.put(invocation)
        while not invocation.outcome.done():
            if self._over_memory() or not self._alive():
                return KILLED
            if time.monotonic() >= deadline:
                message = f"Task timed out after {self.limits.timeout_s:.2f} seconds"
                return Outcome("timeout", _error("Sandbox.Timedout", message))
            await asyncio.wait({invocation.outcome}, timeout=WATCH_INTERVAL_S)
        if self._over_memory():  # a spike between two looks still counts, as on Lambda
            return KILLED
        kind, payload = invocation.outcome.result()
        return Outcome("ok" if kind == "response" else "error", payload)

    def _report(
        self, request_id: str, duration_ms: float, init_ms: float | None, outcome: Outcome
    ) -> str:
        used = min(self._peak_mb(), self.limits.memory_mb)
        if outcome.status == "killed":
            used = self.limits.memory_mb
        fields = [
            f"REPORT RequestId: {request_id}",
            f"Duration: {duration_ms:.2f} ms",
            f"Billed Duration: {math.ceil(duration_ms + (init_ms or 0))} ms",
            f"Memory Size: {self.limits.memory_mb} MB",
            f"Max Memory Used: {used} MB",
        ]
        if init_ms is not None:
            fields.append(f"Init Duration: {init_ms:.2f} ms")
        if outcome.status in ("timeout", "killed"):
            fields.append(f"Status: {outcome.status}")
        return "\t".join(fields)

    def _alive(self) -> bool:
        return self.process is not None and self.process.returncode is None

    def _over_memory(self) -> bool:
        return self._peak_mb() > self.limits.memory_mb

    def _peak_mb(self) -> int:
        """Peak resident memory (VmHWM) of the runtime process, in MB."""
        if self.process is None:
            return 0
        try:
            status = Path(f"/proc/{self.process.pid}/status").read_text()
        except OSError:
            return 0
        line = next((line for line in status.splitlines() if line.startswith("VmHWM:")), "x 0")
        return int(line.split()[1]) // 1024

    async def _kill(self) -> None:
        if self._alive() and self.process is not None:
            self.process.kill()
            await self.process.wait()
        self.process = None


def _error(error_type: str, message: str) -> bytes:
    return json.dumps({"errorType": error_type, "errorMessage": message}).encode()


KILLED = Outcome("killed", _error("Runtime.ExitError", "Runtime exited with error: signal: killed"))


def _now() -> str:
    return (
        time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
        + f".{int(time.time() * 1000) % 1000:03d}Z"
    )


def runtime_env(
    function_name: str,
    limits: Limits,
    bundle: Path,
    task_root: Path,
    variables: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The environment variables Lambda sets for a function: its own `variables` (the
    profile's `environment`, as deploy configures them) and Lambda's, plus where the bundle
    lies."""
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith(("AWS_LAMBDA_", "_HANDLER"))},
        **(variables or {}),
        "AWS_LAMBDA_FUNCTION_NAME": function_name,
        "AWS_LAMBDA_FUNCTION_VERSION": "$LATEST",
        "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": str(limits.memory_mb),
        "AWS_LAMBDA_FUNCTION_TIMEOUT": str(int(limits.timeout_s)),
        "AWS_REGION": os.environ.get("AWS_REGION", "us-east-1"),
        "LAMBDA_TASK_ROOT": str(task_root),
        "_HANDLER": "app.handler",
        "PYTHONPATH": os.pathsep.join(
            [str(task_root), *filter(None, [os.environ.get("PYTHONPATH")])]
        ),
        "EDGESERVE_BUNDLE": str(bundle),
    }
