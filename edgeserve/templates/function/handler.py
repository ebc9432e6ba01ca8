"""Pre- and post-processing for this function: JSON in, tensors to the model, JSON out.

edgeserve calls these two hooks around the model for every `POST /invoke`:

1. `preprocess(payload, ctx)` turns one request into a list of items (one dict of arrays per
   item, without a batch axis). Items of all concurrent requests share one batcher.
2. the model runs on batches of items.
3. `postprocess(items, ctx)` turns this request's items (now holding the model outputs) into the
   response.

This example accepts `{"x": [16 numbers]}` or a list of such objects and answers `{"y": [4
numbers]}` (or a list of them). Replace it with whatever your model needs: decoding images,
tokenizing text, ...; `ctx.options` holds the `[handler.options]` table of function.toml.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from edgeserve.errors import InvalidInput
from edgeserve.types import Context

FEATURES = 16


def preprocess(payload: Any, ctx: Context) -> list[dict[str, np.ndarray]]:
    """One request -> one item per `{"x": [...]}` object it holds."""
    ctx.state["single"] = isinstance(payload, dict)
    requests = [payload] if isinstance(payload, dict) else payload
    if not isinstance(requests, list):
        raise InvalidInput('expected {"x": [16 numbers]} or a list of them')
    return [{"x": _features(request, index)} for index, request in enumerate(requests)]


def postprocess(items: list[dict[str, np.ndarray]], ctx: Context) -> Any:
    """This request's items, each now with the model's `y`, -> the response body."""
    answers = [{"y": item["y"].tolist()} for item in items]
    return answers[0] if ctx.state["single"] else answers


def _features(request: Any, index: int) -> np.ndarray:
    values = request.get("x") if isinstance(request, dict) else None
    try:
        array = np.asarray(values, dtype=np.float32)
    except (TypeError, ValueError):
        array = np.zeros(0, dtype=np.float32)
    if array.shape != (FEATURES,):
        raise InvalidInput(
            f'item {index}: expected {{"x": [{FEATURES} numbers]}}, got {request!r:.80}'
        )
    return array
