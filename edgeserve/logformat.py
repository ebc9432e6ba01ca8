"""How this process's log lines look: edgeserve's own `LEVEL: text`, or Triton's ISO8601 with
the UTC time first; set at start (`serve --log-format`, EDGESERVE_LOG_FORMAT) and by the
logging extension (dataplane/settings.py). Light: the command line imports it."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping

from edgeserve.errors import ConfigError, echo

LOG_FORMATS = ("default", "ISO8601")
LOG_FORMAT_ENV = "EDGESERVE_LOG_FORMAT"
_HANDLED_BY = ("", "uvicorn", "uvicorn.access")  # the loggers whose handlers write the lines


def configure_logging(level: str, environ: Mapping[str, str]) -> None:
    """This process's log lines: `LEVEL: text` to stderr at `level`, in the format
    EDGESERVE_LOG_FORMAT names (a wrong name is refused here, before the model loads)."""
    logging.basicConfig(level=level.upper(), format="%(levelname)s: %(message)s")
    set_log_format(log_format_from(environ))


def log_format_from(environ: Mapping[str, str]) -> str:
    name = environ.get(LOG_FORMAT_ENV, "default")
    if name not in LOG_FORMATS:
        raise ConfigError(
            f"{LOG_FORMAT_ENV}={echo(name)}: expected one of {', '.join(LOG_FORMATS)}"
        )
    return name


def set_log_format(name: str) -> None:
    """Every handler this process writes its lines through, in format `name` (ISO8601: the UTC
    time before what the handler wrote so far; default: as it was)."""
    for handler in _handlers():
        plain = handler.formatter.plain if isinstance(handler.formatter, _Stamped) else None
        plain = plain or handler.formatter or logging.Formatter()
        handler.setFormatter(_Stamped(plain) if name == "ISO8601" else plain)


def log_format() -> str:
    stamped = any(isinstance(handler.formatter, _Stamped) for handler in _handlers())
    return "ISO8601" if stamped else "default"


def _handlers() -> Iterator[logging.Handler]:
    seen: set[int] = set()
    for name in _HANDLED_BY:
        for handler in logging.getLogger(name).handlers:
            if id(handler) not in seen:
                seen.add(id(handler))
                yield handler


class _Stamped(logging.Formatter):
    """A line as `plain` writes it, after the UTC time as Triton's ISO8601 format has it."""

    def __init__(self, plain: logging.Formatter) -> None:
        super().__init__()
        self.plain = plain

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(record.created))
        return f"{stamp} {self.plain.format(record)}"
