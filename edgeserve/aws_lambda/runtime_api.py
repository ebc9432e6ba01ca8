"""The Lambda Runtime API of one execution environment, served on 127.0.0.1 for `awslambdaric`.

    GET  /2018-06-01/runtime/invocation/next          -> the next event (blocks until one comes)
    POST /2018-06-01/runtime/invocation/{id}/response -> the handler's result
    POST /2018-06-01/runtime/invocation/{id}/error    -> the handler raised
    POST /2018-06-01/runtime/init/error               -> the handler module failed to import

A small HTTP/1.1 server on asyncio streams (keep-alive, Content-Length or chunked bodies,
`Expect: 100-continue`): the runtime client is the only caller, and a second uvicorn in the
process would interleave its log lines with the front's.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

from edgeserve.aws_lambda.settings import RESPONSE_LIMIT_BYTES

PREFIX = "/2018-06-01/runtime"
RESPONSE_TOO_LARGE = "Function.ResponseSizeTooLarge"
FUNCTION_ARN = "arn:aws:lambda:us-east-1:123456789012:function:{name}"


@dataclass
class Invocation:
    """One event handed to the runtime, and the future its outcome lands in."""

    request_id: str
    event: bytes
    deadline_ms: int
    outcome: asyncio.Future[tuple[str, bytes]] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class RuntimeApi:
    """Queues invocations for one runtime process and collects their outcomes."""

    def __init__(self, function_name: str) -> None:
        self.function_name = function_name
        self.pending: asyncio.Queue[Invocation] = asyncio.Queue()
        self.inflight: dict[str, Invocation] = {}
        self.ready = asyncio.Event()
        """Set on the runtime's first `next` (init done) or on an init error."""
        self.init_error: bytes | None = None
        self.server: asyncio.Server | None = None
        self.connections: set[asyncio.Task[None]] = set()

    async def start(self) -> str:
        """Listen on a free port on 127.0.0.1; return `host:port` for AWS_LAMBDA_RUNTIME_API."""
        self.server = await asyncio.start_server(self._connection, "127.0.0.1", 0)
        host, port = self.server.sockets[0].getsockname()[:2]
        return f"{host}:{port}"

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
        for task in self.connections:
            task.cancel()
        await asyncio.gather(*self.connections, return_exceptions=True)

    def reset(self) -> None:
        """Forget the runtime process: the next one starts a fresh init."""
        self.ready = asyncio.Event()
        self.init_error = None
        for invocation in self.inflight.values():
            if not invocation.outcome.done():
                invocation.outcome.cancel()
        self.inflight.clear()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self.connections.add(task)
        try:
            while request := await _read_request(reader, writer):
                method, path, body = request
                status, headers, payload = await self._route(method, path, body)
                writer.write(_response(status, headers, payload))
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:  # `close`: a handler asyncio's server started must end
            pass  # quietly, or asyncio prints its cancellation as a traceback at every Ctrl-C
        finally:
            writer.close()
            if task is not None:
                self.connections.discard(task)

    async def _route(
        self, method: str, path: str, body: bytes
    ) -> tuple[int, dict[str, str], bytes]:
        if method == "GET" and path == f"{PREFIX}/invocation/next":
            return await self._next()
        if method == "POST" and path == f"{PREFIX}/init/error":
            self.init_error = body
            self.ready.set()
            return 202, {}, b'{"status":"OK"}'
        parts = path.removeprefix(f"{PREFIX}/invocation/").split("/")
        if method == "POST" and len(parts) == 2 and parts[1] in ("response", "error"):
            return self._outcome(parts[0], parts[1], body)
        return 404, {}, b'{"errorType":"InvalidRequest","errorMessage":"unknown path"}'

    async def _next(self) -> tuple[int, dict[str, str], bytes]:
        self.ready.set()
        invocation = await self.pending.get()
        request_id = invocation.request_id
        self.inflight[request_id] = invocation
        headers = {
            "Lambda-Runtime-Aws-Request-Id": request_id,
            "Lambda-Runtime-Deadline-Ms": str(invocation.deadline_ms),
            "Lambda-Runtime-Invoked-Function-Arn": FUNCTION_ARN.format(name=self.function_name),
            "Lambda-Runtime-Trace-Id": f"Root=1-{int(time.time()):08x}-{request_id[:24]}",
        }
        return 200, headers, invocation.event

    def _outcome(
        self, request_id: str, kind: str, body: bytes
    ) -> tuple[int, dict[str, str], bytes]:
        invocation = self.inflight.pop(request_id, None)
        if invocation is None or invocation.outcome.done():
            return 400, {}, b'{"errorType":"InvalidRequestID","errorMessage":"unknown request id"}'
        if kind == "response" and len(body) > RESPONSE_LIMIT_BYTES:
            error = {
                "errorType": RESPONSE_TOO_LARGE,
                "errorMessage": f"Response payload size ({len(body)} bytes) exceeded maximum "
                f"allowed payload size ({RESPONSE_LIMIT_BYTES} bytes).",
            }
            invocation.outcome.set_result(("error", json.dumps(error).encode()))
            return (
                413,
                {},
                b'{"errorType":"RequestEntityTooLarge","errorMessage":"payload too large"}',
            )
        invocation.outcome.set_result((kind, body))
        return 202, {}, b'{"status":"OK"}'


async def _read_request(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> tuple[str, str, bytes] | None:
    line = await reader.readline()
    if not line.strip():
        return None
    method, target, _ = line.decode("latin-1").split(" ", 2)
    headers: dict[str, str] = {}
    while (header := await reader.readline()) not in (b"\r\n", b"\n", b""):
        name, _, value = header.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    if headers.get("expect", "").lower() == "100-continue":
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    if headers.get("transfer-encoding", "").lower() == "chunked":
        return method, target.split("?")[0], await _read_chunked(reader)
    return (
        method,
        target.split("?")[0],
        await reader.readexactly(int(headers.get("content-length", 0))),
    )


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    chunks = []
    while size := int((await reader.readline()).split(b";")[0].strip() or b"0", 16):
        chunks.append(await reader.readexactly(size))
        await reader.readline()
    await reader.readline()
    return b"".join(chunks)


def _response(status: int, headers: dict[str, Any], body: bytes) -> bytes:
    lines = [f"HTTP/1.1 {status} {'OK' if status < 300 else 'Error'}"]
    lines += [
        f"{name}: {value}"
        for name, value in {"Content-Type": "application/json", **headers}.items()
    ]
    lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body
