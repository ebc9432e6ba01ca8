"""A tiny real KServe v2 server for the bench tests: uvicorn on 127.0.0.1, port 0, in a thread.

It answers infer requests (binary or JSON) after a short real compute pause, and keeps Triton's
statistics schema with real counts and nanoseconds, so a bench's figures can be checked.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

MODEL = "tiny"
COMPUTE_S = 0.001
METADATA = {
    "name": MODEL,
    "versions": ["1"],
    "platform": "onnxruntime_onnx",
    "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}],
    "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 4]}],
}


def _phase() -> dict[str, int]:
    return {"count": 0, "ns": 0}


class Stats:
    """Triton's /stats counters for one model, updated by each infer."""

    def __init__(self) -> None:
        self.inference_count = 0
        self.execution_count = 0
        self.phases = {
            name: _phase()
            for name in (
                "success",
                "fail",
                "queue",
                "compute_input",
                "compute_infer",
                "compute_output",
            )
        }

    def add(self, rows: int, compute_ns: int) -> None:
        self.inference_count += rows
        self.execution_count += 1
        for name, ns in (("success", compute_ns), ("queue", 0), ("compute_input", 0)):
            self.phases[name]["count"] += 1
            self.phases[name]["ns"] += ns
        for name in ("compute_infer", "compute_output"):
            self.phases[name]["count"] += 1
        self.phases["compute_infer"]["ns"] += compute_ns

    def to_json(self) -> dict[str, Any]:
        return {
            "model_stats": [
                {
                    "name": MODEL,
                    "version": "1",
                    "inference_count": self.inference_count,
                    "execution_count": self.execution_count,
                    "inference_stats": self.phases,
                    "batch_stats": [],
                }
            ]
        }


def create_app() -> Starlette:
    stats = Stats()

    async def infer(request: Request) -> Response:
        body = await request.body()
        header_length = request.headers.get("inference-header-content-length")
        header = orjson.loads(body[: int(header_length)] if header_length else body)
        rows = header["inputs"][0]["shape"][0]
        start = time.perf_counter_ns()
        await asyncio.sleep(COMPUTE_S)
        stats.add(rows, time.perf_counter_ns() - start)
        out = {"name": "y", "datatype": "FP32", "shape": [rows, 4], "data": [0.0] * rows * 4}
        return JSONResponse({"model_name": MODEL, "outputs": [out]})

    async def chunked(request: Request) -> Response:
        async def parts() -> Any:
            for part in (b"hello ", b"chunked ", b"world"):
                yield part

        return StreamingResponse(parts())

    async def status(request: Request) -> Response:
        code = int(request.path_params["code"])
        return Response(b"" if code == 204 else b"nope", status_code=code)

    routes = [
        Route("/v2/health/ready", lambda r: Response()),
        Route("/v2/models/{m}", lambda r: JSONResponse(METADATA)),
        Route(
            "/v2/models/{m}/config", lambda r: JSONResponse({"name": MODEL, "max_batch_size": 8})
        ),
        Route("/v2/models/{m}/stats", lambda r: JSONResponse(stats.to_json())),
        Route("/v2/models/{m}/infer", infer, methods=["POST"]),
        Route("/chunked", chunked),
        Route("/status/{code:int}", status),
    ]
    return Starlette(routes=routes)


@contextlib.contextmanager
def running(app: Starlette, timeout_keep_alive: int = 5) -> Iterator[int]:
    """Serve `app` on 127.0.0.1 (port 0) in a thread; yields the port."""
    config = uvicorn.Config(
        app, host="127.0.0.1", port=0, log_level="error", timeout_keep_alive=timeout_keep_alive
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start within 10 s"
        time.sleep(0.01)
    try:
        yield int(server.servers[0].sockets[0].getsockname()[1])
    finally:
        server.should_exit = True
        thread.join(10)
