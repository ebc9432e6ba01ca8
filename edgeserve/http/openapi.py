"""The function's own API as an OpenAPI 3.1 document (`GET /openapi.json`), and a page that
renders it (`GET /docs`): KServe v2 with the model's own tensors, `/invoke` with an example
from the function's samples, health and metrics.

The page is one self-contained HTML file shipped in the package (no CDN: an edge box, and the
machine that builds it, may have no internet); its script reads /openapi.json and draws it.
The document is pure data built once per app from the signature, the manifest and the samples.
"""

from __future__ import annotations

import itertools
import re
from importlib.resources import files
from pathlib import Path
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from edgeserve import __version__
from edgeserve.manifest import Manifest
from edgeserve.samples import (
    IMAGE_TYPES,
    example_inputs,
    is_v2_request,
    sample_request,
    v2_request,
)
from edgeserve.types import Signature, TensorSpec

_UNSAFE_KEY = re.compile(r"[^A-Za-z0-9._-]")
JSON_TYPES = {"FP16": "number", "FP32": "number", "FP64": "number", "BF16": "number"}
JSON_TYPES |= {"BOOL": "boolean", "BYTES": "string"}
ERRORS = {
    "400": "bad input: which tensor, what was expected",
    "413": "request body too large",
    "422": "the model failed on the request's values (in the backend's words)",
    "500": "a fault of the function (its handler's bug, said plainly) or of the server",
    "503": "queue full or not ready (with Retry-After)",
    "504": "the request's deadline passed before it could run",
}


def openapi_document(
    name: str,
    version: str,
    signature: Signature,
    manifest: Manifest,
    samples: Path | None,
) -> dict[str, Any]:
    """The OpenAPI 3.1 document of one function (pure but for reading its samples)."""
    infer = f"/v2/models/{name}/infer"
    return {
        "openapi": "3.1.0",
        "info": {
            "title": name,
            "version": version,
            "description": manifest.function.description
            or f"The `{name}` function, served by edgeserve {__version__}.",
        },
        "paths": {
            "/invoke": {"post": _invoke_operation(signature, manifest, samples)},
            infer: {"post": _infer_operation(name, signature)},
            f"/v2/models/{name}": {"get": _get("the model's name, versions, inputs and outputs")},
            "/v2/health/ready": {
                "get": _get(
                    "200 once warmed up (with a JSON body naming what is away while one of "
                    "several inference processes restarts); 503 while loading or draining"
                )
            },
            "/v2/health/live": {"get": _get("200 while the process runs")},
            "/metrics": {"get": _get("Prometheus text: requests, queue and compute time")},
        },
        "components": {"schemas": _schemas(signature)},
        "x-edgeserve-tensors": {
            "batched": signature.batched,
            "inputs": [spec.to_json() for spec in signature.inputs],
            "outputs": [spec.to_json() for spec in signature.outputs],
        },
    }


def _get(summary: str) -> dict[str, Any]:
    return {"summary": summary, "responses": {"200": {"description": summary}}}


def _responses(ok: dict[str, Any]) -> dict[str, Any]:
    error = {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
    answers = {code: {"description": text, "content": error} for code, text in ERRORS.items()}
    return {"200": ok, **answers}


def _invoke_operation(
    signature: Signature, manifest: Manifest, samples: Path | None
) -> dict[str, Any]:
    content: dict[str, Any] = {}
    example = _json_sample(samples)
    if manifest.handler.module is None:
        schema = {"$ref": "#/components/schemas/InvokeRequest"}
        content["application/json"] = _example({"schema": schema}, sample_request(signature))
    elif example is not None:
        content["application/json"] = _example({"schema": {}}, example)
    if _has_images(samples):
        binary = {"schema": {"type": "string", "format": "binary"}}
        content |= dict.fromkeys(sorted(set(IMAGE_TYPES.values())), binary)
    content.setdefault("application/json", {"schema": {}})
    content["application/msgpack"] = {"schema": {}}
    handler = manifest.handler.module
    description = (
        f"The function's own interface: the body goes through `{handler}.preprocess`, the "
        f"model and `{handler}.postprocess`."
        if handler
        else "The model's tensors by input name, as nested lists "
        + ("with the batch axis" if signature.batched else "of the model's dims (no batch axis)")
        + "; the answer holds the outputs the same way."
    )
    return {
        "summary": "call the function",
        "description": description + " JSON or msgpack out, by Accept.",
        "requestBody": {"required": True, "content": content},
        "responses": _responses({"description": "the function's answer"}),
    }


def _infer_operation(name: str, signature: Signature) -> dict[str, Any]:
    example = v2_request(example_inputs(signature, 1), signature)
    ok = {
        "description": "the model's outputs",
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/InferResponse"}}},
    }
    return {
        "summary": f"run the model `{name}` (KServe v2, as Triton speaks it)",
        "description": "JSON tensors, or Triton's binary tensor extension "
        "(Inference-Header-Content-Length). Inputs: "
        + ", ".join(_describe(spec) for spec in signature.inputs),
        "requestBody": {
            "required": True,
            "content": {
                "application/json": _example(
                    {"schema": {"$ref": "#/components/schemas/InferRequest"}}, example
                )
            },
        },
        "responses": _responses(ok),
    }


def _describe(spec: TensorSpec) -> str:
    optional = " (optional: the model's default where left out)" if spec.optional else ""
    return f"`{spec.name}` {spec.datatype} {spec.shown}{optional}"


def _schemas(signature: Signature) -> dict[str, Any]:
    inputs = _keyed("input", signature.inputs)
    outputs = _keyed("output", signature.outputs)
    return {
        **inputs,
        **outputs,
        "InferRequest": _message("inputs", inputs),
        "InferResponse": _message("outputs", outputs),
        "InvokeRequest": {
            "type": "object",
            "required": [s.name for s in signature.required],
            "properties": {s.name: _nested(s) for s in signature.inputs},
        },
        "Error": {
            "type": "object",
            "required": ["error"],
            "properties": {"error": {"type": "string", "description": "what, where, expected"}},
        },
    }


def _keyed(role: str, specs: tuple[TensorSpec, ...]) -> dict[str, Any]:
    """Each tensor's schema under a component key OpenAPI allows (`[A-Za-z0-9._-]+`): exported
    models name tensors `serving_default_x:0` or `onnx::Gemm_0`; the schema's title keeps the
    name. Keys that the replacement makes equal get a number."""
    keyed: dict[str, Any] = {}
    for spec in specs:
        key = base = f"{role}_{_UNSAFE_KEY.sub('_', spec.name)}"
        for number in itertools.count(2):
            if key not in keyed:
                break
            key = f"{base}_{number}"
        keyed[key] = _tensor_schema(spec, role)
    return keyed


def _message(key: str, tensors: dict[str, Any]) -> dict[str, Any]:
    refs = [{"$ref": f"#/components/schemas/{name}"} for name in tensors]
    return {
        "type": "object",
        "required": [key],
        "properties": {
            "id": {"type": "string"},
            key: {"type": "array", "items": {"oneOf": refs}},
            "parameters": {"type": "object"},
        },
    }


def _tensor_schema(spec: TensorSpec, role: str) -> dict[str, Any]:
    return {
        "type": "object",
        "title": spec.name,
        "description": f"{role} {_describe(spec)} (-1: any size)",
        "required": ["name", "datatype", "shape", "data"],
        "properties": {
            "name": {"const": spec.name},
            "datatype": {"const": spec.datatype},
            "shape": _shape_schema(spec),
            "data": {"type": "array", "items": {"type": _json_type(spec)}},
        },
    }  # fmt: skip


def _shape_schema(spec: TensorSpec) -> dict[str, Any]:
    """A list of one size per dim (of any length where the model declares no shape)."""
    schema: dict[str, Any] = {"type": "array", "items": {"type": "integer"}}
    if not spec.ranked:
        return schema
    return {**schema, "minItems": len(spec.dims), "maxItems": len(spec.dims)}


def _nested(spec: TensorSpec) -> dict[str, Any]:
    """Nested lists, one level a dim (any nesting, or a bare value, where the model declares
    no shape)."""
    if not spec.ranked:
        return {"description": _describe(spec)}
    schema: dict[str, Any] = {"type": _json_type(spec)}
    for _ in spec.dims:
        schema = {"type": "array", "items": schema}
    return {**schema, "description": _describe(spec)}


def _json_type(spec: TensorSpec) -> str:
    return JSON_TYPES.get(spec.datatype, "integer")


EXAMPLE_BYTES = 64 * 1024
"""The largest example the document carries: an image model's /invoke and v2 examples (150,528
numbers each) made it 1.5 MB, which every /docs page fetched; past it, the schema alone."""


def _example(media: dict[str, Any], example: Any) -> dict[str, Any]:
    """`media` with `example`, where it is small enough to carry."""
    if len(orjson.dumps(example, option=orjson.OPT_SERIALIZE_NUMPY)) > EXAMPLE_BYTES:
        return media
    return {**media, "example": example}


def _json_sample(samples: Path | None) -> Any:
    """The first JSON sample that is an /invoke payload (not a v2 request), if any."""
    for path in sorted(samples.glob("*.json")) if samples else []:
        try:
            payload = orjson.loads(path.read_bytes())
        except orjson.JSONDecodeError:
            continue
        if not is_v2_request(payload):
            return payload
    return None


def _has_images(samples: Path | None) -> bool:
    return bool(samples) and any(
        path.suffix.lower() in IMAGE_TYPES
        for path in samples.iterdir()  # type: ignore[union-attr]
    )


class DocsRoutes:
    """GET /openapi.json and GET /docs for one function."""

    def __init__(self, document: dict[str, Any]) -> None:
        self.document = document
        page = files("edgeserve").joinpath("templates", "openapi", "docs.html")
        self.page = page.read_text(encoding="utf-8")

    def routes(self) -> list[Route]:
        return [Route("/openapi.json", self.openapi), Route("/docs", self.docs)]

    async def openapi(self, request: Request) -> Response:
        return JSONResponse(self.document)

    async def docs(self, request: Request) -> Response:
        return HTMLResponse(self.page)
