"""Triton's model-repository extension for a server that holds exactly one function.

`POST /v2/repository/index` lists the function (what `tritonclient`'s
`get_model_repository_index` and `edgeserve bench URL` read to learn the model's name).
Loading and unloading are answered the way Triton answers them where they cannot change
anything, with one deliberate difference:

- load of the served model, with no new config or files: 200, as Triton's EXPLICIT mode
  answers a load of a model that is already loaded (nothing to do);
- any other load, and every unload: 400 with the reason. Triton in its default NONE mode
  refuses both with 503 ("explicit model load / unload is not allowed ..."), but 503 tells
  retry policies to try again, and here no retry can ever succeed: the function is fixed when
  its bundle is built. Serving another model means deploying another bundle.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from edgeserve.errors import InvalidInput, echo, echo_json, echo_repr
from edgeserve.http.body import json_object

if TYPE_CHECKING:
    from edgeserve.dataplane import ServedFunction

ONE_FUNCTION = "this server serves one function, `{name}`, fixed when its bundle was built"


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
        runtime = self.runtime
        ready = body.get("ready", False)
        if not isinstance(ready, bool):
            raise InvalidInput(
                f"/v2/repository/index: `ready`: expected true or false, got {echo_json(ready)}"
            )
        if ready and not runtime.ready:
            return JSONResponse([])
        state, reason = ("READY", "") if runtime.ready else ("UNAVAILABLE", "loading or draining")
        entry = {"name": runtime.name, "version": runtime.model_version}
        return JSONResponse([{**entry, "state": state, "reason": reason}])

    async def load(self, request: Request) -> Response:
        model = echo(request.path_params["model"])
        body = await json_object(request, self.limit)
        one = ONE_FUNCTION.format(name=self.runtime.name)
        if request.path_params["model"] != self.runtime.name:
            raise InvalidInput(
                f"cannot load `{model}`: {one}. Hint: build and deploy a bundle for `{model}`"
            )
        parameters = body.get("parameters") or {}
        if not isinstance(parameters, dict):
            raise InvalidInput(
                f"load `{model}`: `parameters`: expected a JSON object, got {echo_json(parameters)}"
            )
        if parameters:
            raise InvalidInput(
                f"load `{model}`: parameters {echo_repr(sorted(parameters))} cannot change a "
                f"running function ({one}). Hint: rebuild the bundle with the new config or files"
            )
        return Response()

    async def unload(self, request: Request) -> Response:
        model = echo(request.path_params["model"])
        await json_object(request, self.limit)
        one = ONE_FUNCTION.format(name=self.runtime.name)
        raise InvalidInput(
            f"cannot unload `{model}`: {one}. Hint: stop the server (SIGTERM drains it) "
            "or scale its deployment to zero"
        )
