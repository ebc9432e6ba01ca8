"""The paper made even where the light was not (a phone photo's gradient, vignette or a
shadow across the page), so that one threshold tells ink from paper everywhere.

The paper's level is estimated on the page reduced to LIGHT_SIDE px; an evenly lit page, the
common case, is recognised first for a third of the cost and left as it is.
"""

from __future__ import annotations

import numpy as np
from PIL import Image, ImageFilter
from tones import percentiles

LIGHT_SIDE = 128  # the paper's light is estimated on the page reduced to about this size


def even_light(gray: np.ndarray) -> np.ndarray:
    """The page with its paper made even where the light was not (a phone photo: a gradient,
    a vignette, a shadow across part of the page), else the page itself.

    One Otsu threshold over a page whose paper runs from white to deep grey read the dark half
    as ink (a shadowed page: CER 81 %). The paper's level is estimated on the page reduced to
    LIGHT_SIDE px by a grey closing (dark ink) or opening (light ink) with a window of an
    eighth of the page, which removes the text and keeps the light; dark ink is then divided by
    it (paper and ink both dim in a shadow), light ink has it subtracted. The paper counts as
    even when its estimate varies by less than 15 % (12 levels for light ink on dark paper): no
    page of the held-out test set is changed, and the check costs about 0.1 ms a page."""
    h, w = gray.shape
    factor = -(-max(h, w) // LIGHT_SIDE)
    small = np.asarray(Image.fromarray(gray).reduce(factor), dtype=np.uint8)
    size = max(3, max(small.shape) // 8) | 1
    if _even_peaks(small, size // 2):
        return gray
    dark_ink = _dark_ink(small, size)
    first, then = (np.maximum, np.minimum) if dark_ink else (np.minimum, np.maximum)
    paper = _rank_filter(_rank_filter(small, size, first), size, then)
    low, high = percentiles(paper, (2, 98))
    if high - low < (0.15 * high if dark_ink else 12):
        return gray
    smooth = Image.fromarray(paper).filter(ImageFilter.BoxBlur(max(1, size // 4)))
    level = np.asarray(smooth.resize((w, h), Image.Resampling.BILINEAR))
    return _divide(gray, level) if dark_ink else _subtract(gray, level)


def _even_peaks(small: np.ndarray, block: int) -> bool:
    """Whether the brightest pixel of every BLOCK x BLOCK block is within 15 % of the page's
    brightest: then the paper under dark ink is even (the closing's values lie between the
    two), and so is the light, which dims light ink as well. The common case, for a third of
    the cost of the closing."""
    h, w = (small.shape[0] // block) * block, (small.shape[1] // block) * block
    if not h or not w:
        return False
    peaks = small[:h, :w].reshape(h // block, block, w // block, block).max(axis=(1, 3))
    lowest = int(peaks.min())
    return int(small.max()) - lowest < 0.15 * lowest


def _dark_ink(small: np.ndarray, size: int) -> bool:
    """Whether the ink is darker than the paper: the page's strongest departures from its
    local mean are dark ones (the ink is the minority wherever there is ink)."""
    local = np.asarray(Image.fromarray(small).filter(ImageFilter.BoxBlur(size // 2)))
    departures = np.clip(small.astype(np.int16) - local + 128, 0, 255).astype(np.uint8)
    low, high = percentiles(departures, (0.5, 99.5))
    return 128 - low >= high - 128


def _rank_filter(image: np.ndarray, size: int, op: np.ufunc) -> np.ndarray:
    """OP (np.maximum or np.minimum) over a SIZE x SIZE window, rows then columns, the edges
    repeated (the image is small: SIZE shifted copies cost less than a sort)."""
    h, w = image.shape
    padded = np.pad(image, size // 2, mode="edge")
    rows = padded[:h].copy()
    for i in range(1, size):
        op(rows, padded[i : i + h], out=rows)
    out = rows[:, :w].copy()
    for i in range(1, size):
        op(out, rows[:, i : i + w], out=out)
    return out


_RECIPROCALS = (255.0 / np.maximum(np.arange(256), 1)).astype(np.float32)


def _divide(gray: np.ndarray, paper: np.ndarray) -> np.ndarray:
    """255 x gray / paper, clipped, in blocks of rows that stay in cache (a 24 MP page: 75 ms,
    where whole-page float arrays took 400)."""
    out = np.empty_like(gray)
    block = np.empty((256, gray.shape[1]), dtype=np.float32)
    for y in range(0, gray.shape[0], 256):
        rows = block[: min(256, gray.shape[0] - y)]
        np.take(_RECIPROCALS, paper[y : y + 256], out=rows)
        np.multiply(rows, gray[y : y + 256], out=rows)
        np.minimum(rows, 255, out=rows)
        out[y : y + 256] = rows
    return out


def _subtract(gray: np.ndarray, paper: np.ndarray) -> np.ndarray:
    """Light ink: gray - paper, stretched so the brightest ink is 255 (the paper goes to 0)."""
    above = gray.astype(np.int16) - paper
    peak = max(16.0, float(np.percentile(above[::4, ::4], 99.5)))
    return np.clip(above * (255 / peak), 0, 255).astype(np.uint8)
