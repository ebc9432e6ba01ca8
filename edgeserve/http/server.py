"""uvicorn as every target runs a function's app: its timeouts kept, its drain told to begin."""

from __future__ import annotations

import math
import socket
from typing import TYPE_CHECKING, Any, cast

import uvicorn

from edgeserve.http.timeouts import protocol_class
from edgeserve.memory import freeze_long_lived

if TYPE_CHECKING:
    from edgeserve.http.app import FunctionApp

BACKSTOP_S = 2.0
"""uvicorn's own graceful timeout is the drain bound plus this: the app answers what is left at
the bound itself (drain.py), so uvicorn's cancelling, and its plain-text 500, is only a backstop
for a request stuck where nothing awaits."""


def uvicorn_config(app: FunctionApp, http: str = "auto", **settings: Any) -> uvicorn.Config:
    """uvicorn's settings for `app`: its timeouts kept, no access log; `settings` add to them
    (`http`: uvicorn's name of the HTTP implementation)."""
    timeouts = app.timeouts
    return uvicorn.Config(
        app,
        http=protocol_class(timeouts, http),
        timeout_keep_alive=max(1, math.ceil(timeouts.idle_s)),
        timeout_graceful_shutdown=math.ceil(timeouts.drain_s + BACKSTOP_S),
        access_log=False,
        **settings,
    )


class DrainingServer(uvicorn.Server):
    """uvicorn, telling the app as its shutdown starts, so that the app keeps the drain bound;
    once started (the app's lifespan has loaded and warmed up the model), what the process holds
    leaves the cyclic GC's sight (memory.freeze_long_lived)."""

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        freeze_long_lived()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        cast("FunctionApp", self.config.app).begin_drain()
        await super().shutdown(sockets=sockets)
