"""Triton's model-repository extension over HTTP: the routes of `dataplane.repository`.

`POST /v2/repository/index` lists the function (what `tritonclient`'s
`get_model_repository_index` and `edgeserve bench URL` read to learn the model's name); load
and unload answer as `dataplane.repository` explains.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from edgeserve.dataplane import repository
from edgeserve.errors import InvalidInput, echo, echo_json
from edgeserve.http.body import json_object

if TYPE_CHECKING:
    from edgeserve.dataplane import ServedFunction


class RepositoryRoutes:
    """The repository index and model-control routes of one function."""

    def __init__(self, runtime: ServedFunction, limit: int) -> None:
        self.runtime, self.limit = runtime, limit

    def routes(self) -> list[Route]:
        models = "/v2/repository/models/{model}"
        return [
            Route("/v2/repository/index", self.index, methods=["POST"]),
            Route(models + "/load", self.load, methods=["POST"]),
            Route(models + "/unload", self.unload, methods=["POST"]),
        ]

    async def index(self, request: Request) -> Response:
        """[{name, version, state, reason}]; `{"ready": true}` keeps only ready models."""
        body = await json_object(request, self.limit)
        ready = body.get("ready", False)
        if not isinstance(ready, bool):
            raise InvalidInput(
                f"/v2/repository/index: `ready`: expected true or false, got {echo_json(ready)}"
            )
        return JSONResponse(repository.index(self.runtime, ready))

    async def load(self, request: Request) -> Response:
        model = request.path_params["model"]
        body = await json_object(request, self.limit)
        parameters = body.get("parameters", {})
        if not isinstance(parameters, dict):
            raise InvalidInput(
                f"load `{echo(model)}`: `parameters`: expected a JSON object, "
                f"got {echo_json(parameters)}"
            )
        repository.check_load(self.runtime, model, list(parameters))
        return Response()

    async def unload(self, request: Request) -> Response:
        await json_object(request, self.limit)
        raise repository.refuse_unload(self.runtime, request.path_params["model"])
