"""Triton's logging and trace extensions, answered for what edgeserve really does.

Logging: Triton's settings map onto the level of the `edgeserve` loggers (uvicorn's and
grpcio's own are left alone). A level is a threshold, so the settings it can say are those
where every kind above an enabled one is enabled too: turning a kind on turns on the less
detailed ones a request leaves out (log_verbose_level 1 alone: DEBUG, info and warnings too),
turning one off turns off the more detailed ones, and a request that asks for both ways at
once (log_info on, log_warning off) is refused. log_verbose_level 1 is DEBUG; there is no
level above it. log_format "ISO8601" puts the UTC time first on every line the process writes
(edgeserve's, uvicorn's, grpcio's), as Triton's does; "default" is edgeserve's own `LEVEL: text`.
`serve --log-format` (EDGESERVE_LOG_FORMAT) sets it from the start. Lines go where the server's
stderr goes (log_file ""). What cannot be honoured is refused (400) saying why, never accepted
and ignored. With `--workers N` every
process has its own loggers, and so has every instance of a Lambda function: a change reaching
one of them only would be a lie, so there the settings are read, and changing them is refused.

Trace: edgeserve has no tracing. Its settings read as Triton's with tracing off (the five the
trace extension defines, at Triton's defaults: a client that reads trace_rate finds it); asking
for any trace is refused, with where the timings are instead, and setting one to what it is
already is accepted.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from edgeserve.errors import InvalidInput, echo, echo_json_text
from edgeserve.logformat import LOG_FORMATS, log_format, set_log_format

LOGGER = "edgeserve"
SILENT = logging.CRITICAL + 10
_ON_FROM = {  # each setting's flag, on where the level is at most this
    "log_verbose_level": logging.DEBUG,
    "log_info": logging.INFO,
    "log_warning": logging.WARNING,
    "log_error": logging.ERROR,
}
_FIXED = {"log_file": ""}
LOG_KEYS = (*_FIXED, "log_format", *_ON_FROM)


class LogSettings:
    """The logging extension of one process; `refusal` says why changes are refused, if so."""

    def __init__(self, refusal: str | None = None) -> None:
        self.refusal = refusal
        self.logger = logging.getLogger(LOGGER)

    def current(self) -> dict[str, Any]:
        """Triton's six settings, as the `edgeserve` loggers and the process's handlers
        stand now."""
        level = self.logger.getEffectiveLevel()
        flags = {key: level <= at for key, at in _ON_FROM.items()}
        verbose = int(flags["log_verbose_level"])
        return {**_FIXED, "log_format": log_format(), **flags, "log_verbose_level": verbose}

    def update(self, asked: Mapping[str, Any]) -> dict[str, Any]:
        """Apply `asked` (null: leave a setting as it is, as Triton does); the settings now."""
        checked = _checked(asked)
        level = _level(_implied(self.current(), checked))
        now = (self.logger.getEffectiveLevel(), log_format())
        wanted = (level, checked.get("log_format", now[1]))
        if wanted != now:
            if self.refusal is not None:
                raise InvalidInput(f"log settings: {self.refusal}")
            self.logger.setLevel(level)
            set_log_format(wanted[1])
            self.logger.info(
                "log settings changed: level %s, format %s", logging.getLevelName(level), wanted[1]
            )
        return self.current()


def _checked(asked: Mapping[str, Any]) -> dict[str, Any]:
    """The settings asked for, each checked for its type and for what edgeserve can do."""
    checked: dict[str, Any] = {}
    for key, value in asked.items():
        if value is None:
            continue
        where = f"log settings: `{echo(key)}`"
        if key not in LOG_KEYS:
            raise InvalidInput(f"{where} is not a log setting; expected {', '.join(LOG_KEYS)}")
        if key == "log_format" and value not in LOG_FORMATS:
            raise InvalidInput(
                f"{where}: expected one of {', '.join(map(echo_json_text, LOG_FORMATS))}, "
                f"got {echo_json_text(value)}"
            )
        if key in _FIXED and value != _FIXED[key]:
            raise InvalidInput(
                f"{where}: {echo_json_text(value)} cannot be honoured: edgeserve logs to the "
                f"server's stderr; only {echo_json_text(_FIXED[key])} is accepted"
            )
        if key == "log_verbose_level":
            if isinstance(value, bool) or not isinstance(value, int) or value not in (0, 1):
                raise InvalidInput(
                    f"{where}: expected 0 or 1 (edgeserve has one verbose level: DEBUG), "
                    f"got {echo_json_text(value)}"
                )
        elif key in _ON_FROM and not isinstance(value, bool):
            raise InvalidInput(f"{where}: expected true or false, got {echo_json_text(value)}")
        checked[key] = value
    return checked


def _implied(current: Mapping[str, Any], asked: Mapping[str, Any]) -> dict[str, Any]:
    """`current` changed by `asked`, with each kind it leaves out moved along with those it
    sets: on where a more detailed kind is asked on, off where a less detailed one is off."""
    wanted = {**current, **asked}
    rising = list(reversed(_ON_FROM))  # error, warning, info, verbose: rising detail
    for at, key in enumerate(rising):
        if key not in asked:
            if any(asked.get(more) for more in rising[at + 1 :]):
                wanted[key] = True
            elif any(less in asked and not asked[less] for less in rising[:at]):
                wanted[key] = False
    return wanted


def _level(wanted: Mapping[str, Any]) -> int:
    """The level that says `wanted`; 400 where no level does (info on, warnings off)."""
    rising = list(reversed(_ON_FROM))  # error, warning, info, verbose: rising detail
    flags = [bool(wanted[key]) for key in rising]
    if flags != sorted(flags, reverse=True):
        raise InvalidInput(
            "log settings: a kind asked on below one asked off cannot be honoured: edgeserve's "
            "log level is a threshold (verbose > info > warning > error). Hint: leave out or "
            "turn on every kind above the most detailed one wanted"
        )
    on = sum(flags)
    return _ON_FROM[rising[on - 1]] if on else SILENT


TRACE_OFF: dict[str, Any] = {
    "trace_file": "",
    "trace_level": ["OFF"],
    "trace_rate": "1000",
    "trace_count": "-1",
    "log_frequency": "0",
}
"""Triton's trace settings at its defaults, tracing off (its trace extension and tritonserver's
--trace-config): values are strings, trace_level a list."""


def trace_settings(asked: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The trace settings (always off) once `asked` is checked: turning tracing on, or setting
    what only a trace would use, is refused (400) with what to use instead; a setting asked as
    it is already (a list of one, as gRPC sends it, too) is accepted."""
    for key, value in asked.items():
        if value is None or value == [] or _as_it_is(key, value):
            continue
        shown = ", ".join(f"{name} {echo_json_text(off)}" for name, off in TRACE_OFF.items())
        raise InvalidInput(
            f"{where}: `{echo(key)}` = {echo_json_text(value)}: edgeserve has no tracing, so "
            f"only the settings of tracing off are accepted ({shown}). Hint: per-model timings "
            "are in the statistics extension (/v2/models/stats, gRPC ModelStatistics) and /metrics"
        )
    return {
        key: list(value) if isinstance(value, list) else value for key, value in TRACE_OFF.items()
    }


def _as_it_is(key: str, value: Any) -> bool:
    off = TRACE_OFF.get(key)
    return off is not None and (value == off or value == [off])
