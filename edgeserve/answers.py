"""An answer as `edgeserve invoke` prints it: JSON laid out a row per line.

Pretty-printed JSON put every number on its own line (a classifier's 1000 logits: 1000+
lines). Here an array of numbers is one line and an array of arrays a row per line; on a
terminal (`width` given) a row too long for it is cut, saying how many values it left out, and
so are rows past MAX_ROWS. Without a width the text is the whole answer, exact JSON.
"""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console

INDENT = 2
MAX_ROWS = 20
"""Rows of one array a terminal shows; the rest is counted."""
_FITS = 100  # a table or an array of arrays this short stays on one line


def render(answer: Any, width: int | None = None) -> str:
    """`answer` laid out; `width`: a terminal's columns, to which long rows are cut."""
    return "\n".join(_lines(answer, 0, width))


def _lines(value: Any, indent: int, width: int | None) -> list[str]:
    """`value`'s lines, the first to follow a key, the others indented `indent` columns."""
    if not isinstance(value, dict | list):
        return [_dumps(value)]
    room = min(width or _FITS, _FITS) - indent
    if 3 * len(value) <= room and len(flat := _dumps(value)) <= room:  # n items: 3n chars at least
        return [flat]
    if isinstance(value, list) and not any(isinstance(item, dict | list) for item in value):
        return [_dumps(value) if width is None else _cut_row(value, width - indent)]
    inner = indent + INDENT
    pad = " " * inner
    if isinstance(value, dict):
        items = [(key, _lines(item, inner, width)) for key, item in value.items()]
        keyed = [[f"{_dumps(key)}: {lines[0]}", *lines[1:]] for key, lines in items]
        return ["{", *_joined(keyed, pad), " " * indent + "}"]
    shown = value if width is None else value[:MAX_ROWS]
    rows = _joined([_lines(item, inner, width) for item in shown], pad)
    if len(shown) < len(value):
        rows[-1] += ","
        rows.append(f"{pad}… ({len(value) - len(shown)} more rows)")
    return ["[", *rows, " " * indent + "]"]


def _joined(items: list[list[str]], pad: str) -> list[str]:
    """Each item's lines under `pad`, a comma after every item but the last."""
    lines: list[str] = []
    for number, item in enumerate(items):
        item = [pad + item[0], *item[1:]]
        item[-1] += "," if number < len(items) - 1 else ""
        lines += item
    return lines


def _cut_row(row: list[Any], width: int) -> str:
    """`[1, 2, … (998 more)]`: as many values as fit in `width` columns."""
    values = [_dumps(item) for item in row]
    room = width - len(f"[, … ({len(row)} more)]")
    shown = 0
    while shown < len(values) and len(", ".join(values[: shown + 1])) <= room:
        shown += 1
    if shown == len(values):
        return f"[{', '.join(values)}]"
    shown = max(shown, 1)
    return f"[{', '.join(values[:shown])}, … ({len(row) - shown} more)]"


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def show(answer: Any, out: Console, whole: bool = False) -> None:
    """On a terminal, laid out to its width; elsewhere (a pipe, a file) or `whole`: the whole
    answer as exact JSON, for scripts (a text answer as it came)."""
    if isinstance(answer, str) or whole or not out.is_terminal:
        out.file.write(f"{answer if isinstance(answer, str) else render(answer)}\n")
    else:
        out.print(render(answer, out.width), markup=False, emoji=False, soft_wrap=True)
