"""A line as the model reads it: cut into pieces at tab stops and under MAX_WIDTH, with the
margin the model was trained with, normalised to a float32 [1, 32, W] strip (ink 1.0, paper
0.0, whatever the page's polarity).

The strip is the contract between the handler and the model: training cuts its lines with
`normalize_line` too (training/train.py), so what both sides must agree on (LINE_HEIGHT,
DOWNSAMPLE, the widths) lives here, and nothing of the page.
"""

from __future__ import annotations

import numpy as np
from lines import runs
from PIL import Image
from tones import percentiles

LINE_HEIGHT = 32
DOWNSAMPLE = 4  # model output frames per input column: T = W // 4
MIN_WIDTH = 16
MAX_WIDTH = 2048


def normalize_line(gray: np.ndarray) -> np.ndarray:
    """Grey crop of one line (uint8, any polarity) -> float32 [1, 32, W], ink 1, paper 0.

    Shared with training (synth crops go through it) so both sides see the same strips.
    Polarity is per line: the median pixel of a line crop is paper.
    """
    h, w = gray.shape
    width = max(1, round(w * LINE_HEIGHT / h))
    resized = Image.fromarray(gray).resize((width, LINE_HEIGHT), Image.Resampling.BILINEAR)
    levels = np.asarray(resized, dtype=np.uint8)
    dark, paper, light = percentiles(levels, (1, 50, 99))
    ink = dark if paper - dark >= light - paper else light
    contrast = paper - ink
    if abs(contrast) < 24:
        contrast = 24.0 if contrast >= 0 else -24.0
    strip = np.clip((paper - levels.astype(np.float32)) / np.float32(contrast), 0.0, 1.0)
    if width < MIN_WIDTH:
        left = (MIN_WIDTH - width) // 2
        strip = np.pad(strip, ((0, 0), (left, MIN_WIDTH - width - left)))
    return strip[np.newaxis].astype(np.float32)


def split_line(mask: np.ndarray, box: tuple[int, int, int, int]) -> list[tuple[int, int]]:
    """Column ranges of a line: cut at wide gaps (tab stops) and wherever the strip would
    exceed MAX_WIDTH, choosing the widest gap that keeps each piece short enough. The gaps
    are read off the page's ink mask, the one that found the line."""
    x0, y0, x1, y1 = box
    ink = mask[y0:y1, x0:x1].any(axis=0)
    height = y1 - y0
    limit = int(MAX_WIDTH * height / LINE_HEIGHT * 0.8)
    pieces, start = [], 0
    gaps = [(a, b) for a, b in runs(~ink) if a > 0 and b < ink.size]
    for a, b in gaps:
        if b - a > 1.5 * height:
            pieces.append((start, a))
            start = b
    pieces.append((start, ink.size))
    return [(x0 + a, x0 + b) for p in pieces for a, b in _cap_width(p, gaps, limit)]


def _cap_width(
    piece: tuple[int, int], gaps: list[tuple[int, int]], limit: int
) -> list[tuple[int, int]]:
    """Cut a piece longer than limit in the middle of its widest gap in reach (else hard)."""
    start, end = piece
    out = []
    while end - start > limit:
        inside = [(b - a, (a + b) // 2) for a, b in gaps if start < a and b < start + limit]
        cut = max(inside)[1] if inside else start + limit
        out.append((start, cut))
        start = cut
    out.append((start, end))
    return out


def pad_box(shape: tuple[int, ...], box: tuple[int, int, int, int]) -> tuple[int, int, int, int]:
    """The margin the model was trained with: about 0.15 x height above/below, 0.2 x aside."""
    x0, y0, x1, y1 = box
    height = y1 - y0
    dy, dx = round(0.15 * height) + 1, round(0.2 * height) + 1
    return max(0, x0 - dx), max(0, y0 - dy), min(shape[1], x1 + dx), min(shape[0], y1 + dy)
