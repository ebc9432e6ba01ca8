"""uvicorn as every target runs a function's app: its timeouts kept, its drain told to begin."""

from __future__ import annotations

import asyncio
import math
import os
import socket
from collections.abc import Sequence
from types import FrameType
from typing import TYPE_CHECKING, Any, Protocol, cast

import uvicorn

from edgeserve.http.timeouts import protocol_class
from edgeserve.logformat import log_format_from, set_log_format
from edgeserve.memory import freeze_long_lived

if TYPE_CHECKING:
    from edgeserve.http.app import FunctionApp

BACKSTOP_S = 2.0
"""uvicorn's own graceful timeout is the drain bound plus this: the app answers what is left at
the bound itself (drain.py), so uvicorn's cancelling, and its plain-text 500, is only a backstop
for a request stuck where nothing awaits."""


def uvicorn_config(app: FunctionApp, http: str = "auto", **settings: Any) -> uvicorn.Config:
    """uvicorn's settings for `app`: its timeouts kept, no access log, no WebSocket (a handshake
    is an HTTP request the app refuses: connection.py); `settings` add to them (`http`:
    uvicorn's name of the HTTP implementation)."""
    timeouts = app.timeouts
    config = uvicorn.Config(
        app,
        http=protocol_class(timeouts, http, app.cors),
        ws="none",
        timeout_keep_alive=max(1, math.ceil(timeouts.idle_s)),
        timeout_graceful_shutdown=math.ceil(timeouts.drain_s + BACKSTOP_S),
        access_log=False,
        **settings,
    )
    set_log_format(log_format_from(os.environ))  # uvicorn's handlers are there from here on
    return config


class Companion(Protocol):
    """Another front serving beside uvicorn on its event loop (gRPC): started once the app's
    lifespan has, told when the drain begins, stopped before the lifespan ends."""

    async def start(self) -> None: ...
    def begin_drain(self) -> None: ...
    async def stop(self) -> None: ...


class DrainingServer(uvicorn.Server):
    """uvicorn, telling the app the moment SIGTERM arrives, so that the drain bound counts from
    the signal (uvicorn itself looks for it every 0.1 s, and only then starts its shutdown).
    Once started (the app's lifespan has loaded and warmed up the model), what the process holds
    leaves the cyclic GC's sight (memory.freeze_long_lived)."""

    drain_at_signal = True  # False: the drain starts with uvicorn's own shutdown
    _loop: asyncio.AbstractEventLoop | None = None

    def __init__(self, config: uvicorn.Config, companions: Sequence[Companion] = ()) -> None:
        super().__init__(config)
        self.companions = tuple(companions)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().startup(sockets=sockets)
        for companion in self.companions:
            await companion.start()
        freeze_long_lived()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        if self.drain_at_signal and self._loop is not None:  # a signal handler: to the loop
            self._loop.call_soon_threadsafe(self._begin_drain)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self._begin_drain()  # if no signal started it
        for companion in self.companions:
            await companion.stop()
        await super().shutdown(sockets=sockets)

    def _begin_drain(self) -> None:
        cast("FunctionApp", self.config.app).begin_drain()  # once: later calls change nothing
        for companion in self.companions:
            companion.begin_drain()
