"""One owner of a runtime's start and stop, however many fronts serve it.

The HTTP app's lifespan and the Lambda adapter both enter `serving(runtime)`: the first front
in starts the runtime (load -> warm up -> ready), the last one out stops it (refuse new work
-> drain within the bound -> close). A front never starts or stops a runtime itself.
"""

from __future__ import annotations

import weakref
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Protocol


class Lifecycle(Protocol):
    async def start(self) -> None: ...
    async def stop(self, drain_timeout_s: float = ...) -> None: ...


DRAIN_TIMEOUT_S = 30.0
"""How long a stopping runtime lets queued work finish when the front names no bound."""

_fronts: weakref.WeakKeyDictionary[Lifecycle, int] = weakref.WeakKeyDictionary()
"""How many fronts serve each started runtime."""


@asynccontextmanager
async def serving(
    runtime: Lifecycle, drain_timeout_s: float = DRAIN_TIMEOUT_S
) -> AsyncIterator[None]:
    """The runtime started while the block runs; stopped when the last front leaves."""
    fronts = _fronts.get(runtime, 0)
    _fronts[runtime] = fronts + 1
    if fronts == 0:
        await runtime.start()
    try:
        yield
    finally:
        _fronts[runtime] -= 1
        if _fronts[runtime] == 0:
            del _fronts[runtime]
            await runtime.stop(drain_timeout_s)
