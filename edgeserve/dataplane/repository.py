"""Triton's model-repository extension for a server that holds exactly one function, whatever
the transport: the index lists the function; loading and unloading answer what a fixed
function can do.

- load of the served model, with no new config or files: done, as Triton's EXPLICIT mode
  answers a load of a model that is already loaded (nothing to do);
- any other load, and every unload: InvalidInput with the reason. Triton in its default NONE
  mode refuses both with 503 ("explicit model load / unload is not allowed ..."), but 503 tells
  retry policies to try again, and here no retry can ever succeed: the function is fixed when
  its bundle is built. Serving another model means deploying another bundle.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from edgeserve.errors import InvalidInput, echo, echo_repr

if TYPE_CHECKING:
    from edgeserve.dataplane.function import ServedFunction

ONE_FUNCTION = "this server serves one function, `{name}`, fixed when its bundle was built"


def index(function: ServedFunction, ready: bool) -> list[dict[str, Any]]:
    """[{name, version, state, reason}]; `ready` keeps only ready models."""
    if ready and not function.ready:
        return []
    state, reason = ("READY", "") if function.ready else ("UNAVAILABLE", "loading or draining")
    entry = {"name": function.name, "version": function.model_version}
    return [{**entry, "state": state, "reason": reason}]


def check_load(function: ServedFunction, model: str, parameters: Sequence[str]) -> None:
    """Nothing to do for the served model as it is; InvalidInput for anything else."""
    one = ONE_FUNCTION.format(name=function.name)
    if model != function.name:
        raise InvalidInput(
            f"cannot load `{echo(model)}`: {one}. Hint: build and deploy a bundle for "
            f"`{echo(model)}`"
        )
    if parameters:
        raise InvalidInput(
            f"load `{echo(model)}`: parameters {echo_repr(sorted(parameters))} cannot change a "
            f"running function ({one}). Hint: rebuild the bundle with the new config or files"
        )


def refuse_unload(function: ServedFunction, model: str) -> InvalidInput:
    one = ONE_FUNCTION.format(name=function.name)
    return InvalidInput(
        f"cannot unload `{echo(model)}`: {one}. Hint: stop the server (SIGTERM drains it) "
        "or scale its deployment to zero"
    )
