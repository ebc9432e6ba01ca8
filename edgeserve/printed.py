"""What the command line prints to: stdout and stderr, and a line with a coloured label."""

from __future__ import annotations

from rich.console import Console
from rich.text import Text

console = Console()
err_console = Console(stderr=True)


def say(label: str, style: str, text: str, out: Console = console) -> None:
    """`label` in its colour, then `text` as plain text: never read as markup, so brackets in
    a path, an rsync message or a device's error print as they are."""
    line = Text.assemble((label, style), " ", text) if label else Text(text)
    out.print(line, highlight=False, soft_wrap=True)
