"""Reading order: top to bottom, and where the page runs in columns, each column top to
bottom before the next.

A gutter that several lines in a row share cuts them into columns, whose lines are then found
in each column alone: without it, two columns side by side were read across as one line.
"""

from __future__ import annotations

import numpy as np
from lines import Box, find_lines, runs

GUTTER = 0.8  # x the line height: the narrowest gap between columns (word gaps: about 0.3)
COLUMN = 10.0  # x the line height: the narrowest column (a price or a date is narrower)
# x the line height: the gaps between a table's cells (a monospaced font's word gaps reach 1.0)
CELL = 2.0
FILL = 0.75  # the median line of a column fills this much of it (wrapped text: 0.8-1.0)


def read_order(mask: np.ndarray, depth: int = 0) -> list[Box]:
    """Line boxes in reading order: top to bottom, and where the page runs in columns, each
    column top to bottom before the next.

    Lines of two columns side by side were one line, read across the gutter ('Total: $13.60
    VAT 21% = 15%'; stress.py: CER 78 %). A gutter is a gap of at least GUTTER x the line
    height that three or more lines in a row share, with at least COLUMN x the line height of
    text on either side and no wider than the narrower side (a receipt's prices, a form's
    short labels and values stay rows, and so do rows that mostly have two gaps of CELL x the
    line height or more: a table's cells, an invoice's description, quantity and amount, were
    read a column at a time: 9.9 % CER on documents.py's invoices, none now); the lines of
    each column are then found in it alone (columns whose lines do not line up came out as one
    band), a column in two at most."""
    lines = find_lines(mask)
    if depth >= 2 or len(lines) < 3:
        return lines
    height = float(np.median([y1 - y0 for _, y0, _, y1 in lines]))
    gaps = [_gaps(mask, box, GUTTER * height) for box in lines]
    out: list[Box] = []
    start = 0
    while start < len(lines):
        end, cut = _column_run(lines, gaps, start, height)
        if cut is None:
            out.append(lines[start])
            start += 1
            continue
        y0 = (lines[start - 1][3] + lines[start][1]) // 2 if start else 0
        y1 = (lines[end - 1][3] + lines[end][1]) // 2 if end < len(lines) else mask.shape[0]
        for x0, x1 in ((0, cut), (cut, mask.shape[1])):
            column = read_order(mask[y0:y1, x0:x1], depth + 1)
            out += [(a + x0, b + y0, c + x0, d + y0) for a, b, c, d in column]
        start = end
    return out


def _gaps(mask: np.ndarray, box: Box, least: float) -> list[tuple[int, int]]:
    """The gaps of at least LEAST px between the ink of a line, in page columns."""
    x0, y0, x1, y1 = box
    ink = mask[y0:y1, x0:x1].any(axis=0)
    return [(x0 + a, x0 + b) for a, b in runs(~ink) if b - a >= least]


def _column_run(
    lines: list[Box], gaps: list[list[tuple[int, int]]], start: int, height: float
) -> tuple[int, int | None]:
    """The lines from START on that share a gap (a line all on one side of it joins too),
    and the column where a gutter among those gaps cuts them, if one does."""
    common, end = gaps[start], start + 1
    while common and end < len(lines):
        shared = _shared(common, gaps[end], lines[end], GUTTER * height)
        if not shared:
            break
        common, end = shared, end + 1
    run = lines[start:end]
    cells = [sum(d - c >= CELL * height for c, d in own) for own in gaps[start:end]]
    if np.median(cells) >= 2:  # rows of three cells or more: a table, read row by row
        return end, None
    for a, b in sorted(common, key=lambda gap: gap[0] - gap[1]):  # the widest first
        across = [box for box in run if box[0] < a and box[2] > b]
        left = a - min(box[0] for box in run)
        right = max(box[2] for box in run) - b
        if len(across) < 3 or min(left, right) < max(COLUMN * height, b - a):
            continue
        lefts, rights = _sides(run, gaps[start:end], (a, b))
        if min(float(np.median(lefts)) / left, float(np.median(rights)) / right) >= FILL:
            return end, (a + b) // 2
    return end, None


def _sides(
    run: list[Box], gaps: list[list[tuple[int, int]]], gutter: tuple[int, int]
) -> tuple[list[int], list[int]]:
    """The widths of the lines' ink left and right of GUTTER (a line on one side only counts
    on that side)."""
    a, b = gutter
    lefts, rights = [], []
    for (x0, _, x1, _), own in zip(run, gaps, strict=True):
        if x0 < a and x1 > b:
            c, d = next((c, d) for c, d in own if c <= a and d >= b)
            lefts.append(c - x0)
            rights.append(x1 - d)
        elif x1 <= b:
            lefts.append(x1 - x0)
        else:
            rights.append(x1 - x0)
    return lefts, rights


def _shared(
    common: list[tuple[int, int]], gaps: list[tuple[int, int]], box: Box, least: float
) -> list[tuple[int, int]]:
    """The parts of the COMMON gaps that a line's own GAPS also hold, or where the line is all
    on one side of a gap (a column's line with nothing beside it), the part its ink (BOX)
    leaves free; those at least LEAST px wide."""
    out = []
    for a, b in common:
        if box[2] <= b or box[0] >= a:
            parts = [(max(a, box[2]), b) if box[2] <= b else (a, min(b, box[0]))]
        else:
            parts = [(max(a, c), min(b, d)) for c, d in gaps]
        out += [(c, d) for c, d in parts if d - c >= least]
    return out
