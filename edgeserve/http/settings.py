"""Triton's logging and trace extensions over HTTP: the routes of `dataplane.settings`.

`GET` reads the settings, `POST` a JSON object of them changes what edgeserve can honour, as
tritonclient's get/update_log_settings and get/update_trace_settings call them.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from edgeserve.dataplane import DataPlane
from edgeserve.dataplane.settings import LogSettings, trace_settings
from edgeserve.http.body import json_object


class SettingsRoutes:
    """`/v2/logging`, `/v2/trace/setting` and a model's `trace/setting`."""

    def __init__(self, plane: DataPlane, logs: LogSettings, limit: int) -> None:
        self.plane, self.logs, self.limit = plane, logs, limit

    def routes(self, model: str) -> list[Route]:
        both = ["GET", "POST"]
        return [
            Route("/v2/logging", self.logging, methods=both),
            Route("/v2/trace/setting", self.trace, methods=both),
            Route(model + "/trace/setting", self.trace, methods=both),
        ]

    async def logging(self, request: Request) -> Response:
        if request.method == "GET":
            return JSONResponse(self.logs.current())
        return JSONResponse(self.logs.update(await json_object(request, self.limit)))

    async def trace(self, request: Request) -> Response:
        if "model" in request.path_params:
            self.plane.check_model(request.path_params["model"], None)
        asked = await json_object(request, self.limit) if request.method == "POST" else {}
        return JSONResponse(trace_settings(asked, request.url.path))
