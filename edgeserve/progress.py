"""Progress on long steps (tune's sweep, bench levels, downloads): rich's live display on a
terminal, nothing at all when output goes to a file, a pipe or CI logs."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.text import Text


def progress_display(console: Console) -> Progress:
    """A transient bar with a spinner, `done/total` and the elapsed time; off unless a terminal."""
    return Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=not console.is_terminal,
    )


@contextmanager
def live_log(console: Console, title: str, logger: str = "edgeserve") -> Iterator[None]:
    """While the block runs, one live line: `title` and the latest INFO message of `logger`
    (a library reports its steps by logging; this is how the CLI shows them). Off unless a
    terminal."""
    if not console.is_terminal:
        yield
        return
    target = logging.getLogger(logger)
    level = target.level
    with console.status(title) as status:
        handler = _StatusHandler(lambda text: status.update(f"{title}: {text}"))
        target.addHandler(handler)
        target.setLevel(min(level or logging.INFO, logging.INFO))
        try:
            yield
        finally:
            target.removeHandler(handler)
            target.setLevel(level)


@contextmanager
def warnings_shown(console: Console, logger: str = "edgeserve") -> Iterator[None]:
    """While the block runs, each warning `logger` logs printed at once as a `warning:` line,
    as the CLI says its own (Python's last-resort handler printed it bare)."""
    target = logging.getLogger(logger)
    handler, level = _WarningHandler(console), target.level
    target.addHandler(handler)
    target.setLevel(min(target.getEffectiveLevel(), logging.WARNING))
    try:
        yield
    finally:
        target.removeHandler(handler)
        target.setLevel(level)


class _WarningHandler(logging.Handler):
    def __init__(self, console: Console) -> None:
        super().__init__(logging.WARNING)
        self.console = console

    def emit(self, record: logging.LogRecord) -> None:
        line = Text.assemble(("warning:", "yellow"), " ", record.getMessage())
        self.console.print(line, highlight=False, soft_wrap=True)


class _StatusHandler(logging.Handler):
    def __init__(self, show: Callable[[str], None]) -> None:
        super().__init__(logging.INFO)
        self.show = show

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno < logging.WARNING:  # a warning would vanish with the line
            self.show(record.getMessage())
