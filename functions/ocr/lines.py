"""Text lines found on an ink mask: the bands of its horizontal profile, thin bands (i-dots,
accents, commas' tails) folded into their line, touching lines cut at their sparsest rows.

`Box`, a line's (x0, y0, x1, y1), is named here: columns.py puts the boxes in reading order,
strips.py cuts them out.
"""

from __future__ import annotations

import itertools

import numpy as np

Box = tuple[int, int, int, int]  # x0, y0, x1, y1


def find_lines(mask: np.ndarray) -> list[Box]:
    """Line boxes (x0, y0, x1, y1), top to bottom, from the horizontal ink profile."""
    profile = mask.sum(axis=1)
    bands = runs(profile >= 2)
    if not bands:
        return []
    bands = _attach_small(bands, _typical_height(bands))
    typical = _typical_height(bands)
    boxes = []
    for y0, y1 in (piece for band in bands for piece in _split_tall(band, profile, typical)):
        columns = np.flatnonzero(mask[y0:y1].any(axis=0))
        if y1 - y0 >= 0.3 * typical and columns.size:
            boxes.append((int(columns[0]), y0, int(columns[-1]) + 1, y1))
    return boxes


def _typical_height(bands: list[tuple[int, int]]) -> float:
    """The height of a typical line: the bands' median height, the upper one of an even count.
    The mean of the middle two took a lone line and its i-dots for two lines of half their
    height each, so a 48 px bold dot stayed a line of its own, read 'o', over 'ln'."""
    heights = sorted(b - a for a, b in bands)
    return float(heights[len(heights) // 2])


def runs(flags: np.ndarray) -> list[tuple[int, int]]:
    """Half-open [start, end) runs of True."""
    edges = np.flatnonzero(np.diff(np.concatenate(([0], flags.astype(np.int8), [0]))))
    return [(int(a), int(b)) for a, b in zip(edges[::2], edges[1::2], strict=True)]


def _attach_small(bands: list[tuple[int, int]], typical: float) -> list[tuple[int, int]]:
    """Fold thin bands (i-dots, accents, commas' tails) into the nearest band close enough."""
    bands, settled = list(bands), set()
    while len(bands) > 1:
        thin = [b for b in bands if b[1] - b[0] < 0.5 * typical and b not in settled]
        if not thin:
            break
        small = min(thin, key=lambda b: b[1] - b[0])
        i = bands.index(small)
        gaps = [(small[0] - bands[i - 1][1], i - 1)] if i > 0 else []
        gaps += [(bands[i + 1][0] - small[1], i + 1)] if i + 1 < len(bands) else []
        gap, j = min(gaps)
        if gap > 0.6 * typical:
            settled.add(small)
            continue
        lo, hi = min(i, j), max(i, j)
        bands[lo : hi + 1] = [(bands[lo][0], bands[hi][1])]
    return bands


def _split_tall(
    band: tuple[int, int], profile: np.ndarray, typical: float
) -> list[tuple[int, int]]:
    """Cut a band holding several touching lines at its sparsest rows."""
    y0, y1 = band
    pieces = round((y1 - y0) / typical)
    if pieces < 2 or (y1 - y0) < 1.6 * typical:
        return [band]
    dense = float(np.median(profile[y0:y1]))
    cuts = []
    for k in range(1, pieces):
        centre, reach = y0 + k * (y1 - y0) // pieces, int(0.3 * typical)
        window = profile[centre - reach : centre + reach + 1]
        cut = centre - reach + int(np.argmin(window))
        if profile[cut] <= 0.25 * dense:
            cuts.append(cut)
    edges = [y0, *sorted(set(cuts)), y1]
    # A piece without a dense core of rows is no line: the ascenders or descenders of one tall
    # line (a heading several times the body's height), so its cut goes.
    while len(edges) > 2:
        cores = [
            np.count_nonzero(profile[a:b] >= 0.5 * dense) >= 0.25 * typical
            for a, b in itertools.pairwise(edges)
        ]
        if all(cores):
            break
        k = cores.index(False)  # of its two cuts, the one through denser rows goes
        inner = [j for j in (k, k + 1) if 0 < j < len(edges) - 1]
        edges.pop(max(inner, key=lambda j: profile[edges[j]]))
    return [(a, b) for a, b in itertools.pairwise(edges) if b > a]
