"""Progress on long steps (tune's sweep, bench levels, downloads): rich's live display on a
terminal, nothing at all when output goes to a file, a pipe or CI logs."""

from __future__ import annotations

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
