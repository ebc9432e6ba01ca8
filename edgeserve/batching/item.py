"""What the batcher queues: one item, a request's rows (or a part of a larger request)."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Collection, Hashable
from contextvars import ContextVar
from dataclasses import dataclass

from edgeserve.errors import EdgeserveError, InvalidElement, as_edgeserve_error
from edgeserve.types import TensorDict


@dataclass(eq=False)
class Item:
    inputs: TensorDict
    rows: int
    key: Hashable
    enqueued: float
    arrived: float
    deadline: float
    future: asyncio.Future[TensorDict]
    request: object | None = None  # items of one request (ONE_REQUEST) share one outcome
    first_row: int = 0  # where a part of a request split into several starts in it

    def error_of(self, exc: Exception, whole: Collection[str]) -> EdgeserveError:
        """What failed this item, run alone, as its request's error: an element named at its
        row in the request (the client sent the request, not this part), unless its tensor
        was sent `whole` to each part."""
        error = as_edgeserve_error(exc, f"batch of {self.rows} rows")
        if self.first_row and isinstance(error, InvalidElement) and error.tensor not in whole:
            return error.moved(self.first_row)
        return error


ONE_REQUEST: ContextVar[object | None] = ContextVar("edgeserve_request", default=None)
"""Set to a token around the submits of one request that became several items (a handler's):
when one of them fails, those still waiting fail with it instead of running for nothing."""
REQUEST_NUMBERS = itertools.count(1)
"""Tokens for ONE_REQUEST: a number, unlike a bare object, names its request to another process
(workers.wire)."""
