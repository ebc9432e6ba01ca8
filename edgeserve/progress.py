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


class _StatusHandler(logging.Handler):
    def __init__(self, show: Callable[[str], None]) -> None:
        super().__init__(logging.INFO)
        self.show = show

    def emit(self, record: logging.LogRecord) -> None:
        self.show(record.getMessage())
