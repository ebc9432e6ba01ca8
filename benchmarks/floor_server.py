"""The floor: a plain Starlette + uvicorn server calling the backend once per request.

No batcher, no validation beyond what decoding needs, no thread hop: the request's tensors are
decoded (Triton's binary extension, or JSON), the backend runs in the handler, the outputs go
back in binary. Whatever edgeserve adds on top of this is its overhead.

    .venv/bin/python benchmarks/floor_server.py MODEL.onnx NAME PORT --backend onnxruntime
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from edgeserve.backends import load_backend
from edgeserve.types import Backend, TensorDict


def decode(body: bytes, header_length: str | None) -> TensorDict:
    """Inputs of a v2 request: binary when the header length is given, else JSON data."""
    if header_length is None:
        header = orjson.loads(body)
        return {
            t["name"]: np.asarray(t["data"], np.float32).reshape(t["shape"])
            for t in header["inputs"]
        }
    start = int(header_length)
    header, tensors = orjson.loads(body[:start]), {}
    for t in header["inputs"]:
        size = t["parameters"]["binary_data_size"]
        tensors[t["name"]] = np.frombuffer(body, np.float32, size // 4, start).reshape(t["shape"])
        start += size
    return tensors


def encode(outputs: TensorDict) -> Response:
    raws = [np.ascontiguousarray(a).tobytes() for a in outputs.values()]
    header = orjson.dumps(
        {
            "outputs": [
                {
                    "name": n,
                    "datatype": "FP32",
                    "shape": list(a.shape),
                    "parameters": {"binary_data_size": len(r)},
                }
                for (n, a), r in zip(outputs.items(), raws, strict=True)
            ]
        }
    )
    return Response(
        header + b"".join(raws),
        media_type="application/octet-stream",
        headers={"Inference-Header-Content-Length": str(len(header))},
    )


def create_app(engine: Backend) -> Starlette:
    async def infer(request: Request) -> Response:
        tensors = decode(
            await request.body(), request.headers.get("inference-header-content-length")
        )
        return encode(engine.infer(tensors))

    async def ready(request: Request) -> Response:
        return Response(b"")

    return Starlette(
        routes=[
            Route("/v2/models/{name}/infer", infer, methods=["POST"]),
            Route("/v2/health/ready", ready),
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model", type=Path)
    parser.add_argument("name")
    parser.add_argument("port", type=int)
    parser.add_argument("--backend", default="onnxruntime")
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--threads", type=int, default=0)
    args = parser.parse_args()
    engine = load_backend(args.backend, args.model, precision=args.precision, threads=args.threads)
    uvicorn.run(
        create_app(engine), host="127.0.0.1", port=args.port, log_level="warning", access_log=False
    )


if __name__ == "__main__":
    main()
