"""Table rules, underlines and a scan's dark edges taken out of the ink mask, and painted
with the paper's grey on the page.

They are ink but not text: a vertical rule joined every row of a table into one band, an
underline was read as letters. What tells them from strokes (runs far longer than the page's
strokes are high, and thin) is this module's whole concern.
"""

from __future__ import annotations

import numpy as np
from tones import paper_grey


def remove_rules(gray: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """Table rules, underlines and a scan's dark edges out of the ink mask and the page.

    Vertical rules joined every row of a ruled table into one band, horizontal ones ran through
    a line's crop and were read as letters, a dark scan edge was ink in every row. A rule is a
    run of ink longer than RULE_LENGTH x the page's stroke height (_stroke_height: about the
    cap height) and at most 1/RULE_THINNESS as thick as long, so the stems of a heading several
    times the body's size stay; an edge is the rows or columns along the page's sides that are
    mostly ink. Their pixels, and one around them (the anti-aliased edge), are painted with the
    paper's grey for the line crops."""
    stroke = _stroke_height(mask)
    if stroke is None:
        return gray, mask
    length = max(12, int(RULE_LENGTH * stroke))
    rules = _thin_runs(mask, length) | _thin_runs(mask.T, length).T | _dark_edges(mask, length)
    if not rules.any():
        return gray, mask
    grown = _grow(rules)
    gray = gray.copy()
    gray[grown] = paper_grey(gray)
    mask = mask & ~grown
    return gray, (mask if mask.any() else None)


RULE_LENGTH = 4.0
RULE_THINNESS = 15


def _run_sizes(major: np.ndarray, minor: np.ndarray) -> np.ndarray:
    """Pixel coordinates sorted by (major, minor) -> the length of the run each one is in."""
    breaks = np.flatnonzero((np.diff(major) != 0) | (np.diff(minor) != 1)) + 1
    starts = np.concatenate(([0], breaks))
    sizes = np.diff(np.concatenate((starts, [major.size])))
    return np.repeat(sizes, sizes)


def _dark_edges(mask: np.ndarray, length: int) -> np.ndarray:
    """The rows and columns along the page's edges that are mostly ink (a scan's dark border),
    where they are at least 2 x LENGTH long: not the first stem of a word cropped tight."""
    edges = np.zeros_like(mask)
    for view, ink in ((edges, mask), (edges.T, mask.T)):  # columns, then rows
        size = ink.shape[0]
        if size < 2 * length:
            continue
        for side in (slice(None), slice(None, None, -1)):  # from the left, then the right
            lines = ink[:, side]
            depth = 0
            while depth < lines.shape[1] and np.count_nonzero(lines[:, depth]) > 0.6 * size:
                depth += 1
            view[:, side][:, :depth] = True
    return edges & mask


def _stroke_height(mask: np.ndarray) -> float | None:
    """95th percentile of the lengths of vertical ink runs in every other column (300 at most),
    those longer than 2 pixels and at most 4 x the 75th percentile (a small ruled table's rules
    were its longest 5 %): about the cap height. The longest run in a line of text, a '(' or an
    italic 'f', was at most 2.6 x it on 18 fonts at 10-100 px."""
    cols = np.ascontiguousarray(mask[:, :: max(2, mask.shape[1] // 300)].T)
    edges = np.diff(np.pad(cols, ((0, 0), (1, 1))).view(np.int8), axis=1)
    lengths = np.flatnonzero(edges == -1) - np.flatnonzero(edges == 1)
    counts = np.bincount(lengths, minlength=4)
    counts[:3] = 0  # not thin strokes across, nor a rule crossed
    below = counts.cumsum()
    if not below[-1]:
        return None
    p75 = int(np.searchsorted(below, 0.75 * below[-1]))
    below = counts[: 4 * p75 + 1].cumsum()  # nor the rules along
    return float(np.searchsorted(below, 0.95 * below[-1]))


def _thin_runs(mask: np.ndarray, length: int) -> np.ndarray:
    """Pixels of horizontal runs of at least LENGTH that are thin: RULE_THINNESS times their
    thickness (the vertical run through them among such pixels) is at most their length.

    Only rows where four columns LENGTH // 4 apart are ink in a row can hold such a run (it
    covers at least four of them); on those, an opening by a 1 x LENGTH line (by doubling),
    then the check on what is left (few pixels)."""
    out = np.zeros_like(mask)
    w, step = mask.shape[1], max(1, length // 4)
    probe = mask[:, ::step]
    if w < length or probe.shape[1] < 4:
        return out
    rows = np.flatnonzero((probe[:, :-3] & probe[:, 1:-2] & probe[:, 2:-1] & probe[:, 3:]).any(1))
    if not rows.size:
        return out
    eroded, span = mask[rows], 1  # eroded[:, x] = mask[rows, x : x + span].all()
    while 2 * span <= length:
        eroded = eroded[:, : w - 2 * span + 1] & eroded[:, span : w - span + 1]
        span *= 2
    if span < length:
        shift = length - span
        eroded = eroded[:, : w - length + 1] & eroded[:, shift : shift + w - length + 1]
    opened = np.zeros((rows.size, w), dtype=bool)  # dilate back: every pixel of such a run
    opened[:, : eroded.shape[1]] = eroded
    span = 1
    while 2 * span <= length:
        opened[:, span:] |= opened[:, :-span].copy()
        span *= 2
    if span < length:
        opened[:, length - span :] |= opened[:, : w - length + span].copy()
    ys, xs = np.nonzero(opened)  # few pixels: run lengths and thicknesses from coordinates
    ys = rows[ys]
    along = _run_sizes(ys, xs)
    order = np.lexsort((ys, xs))  # column by column
    across = np.empty_like(along)
    across[order] = _run_sizes(xs[order], ys[order])
    thin = across * RULE_THINNESS <= along
    out[ys[thin], xs[thin]] = True  # the others are a block of ink (a bar, a photo)
    return out


def _grow(mask: np.ndarray) -> np.ndarray:
    """Mask dilated by one pixel (3 x 3)."""
    grown = mask.copy()
    grown[1:] |= mask[:-1]
    grown[:-1] |= mask[1:]
    rows = grown.copy()
    grown[:, 1:] |= rows[:, :-1]
    grown[:, :-1] |= rows[:, 1:]
    return grown
