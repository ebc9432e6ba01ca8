"""Noise measured and taken out: salt and pepper by a 3 x 3 median of the specks alone, sensor
noise by a Gaussian whose radius follows it, faint text under light noise smoothed.

The measure (`measure_noise`) is the ink mask's too: a blank page and faint text differ by how
their two tones compare with the noise.
"""

from __future__ import annotations

import math

import numpy as np
from PIL import Image, ImageFilter
from tones import otsu

SPIKES = 0.002  # share of isolated dark or light pixels above which a page is salt and pepper
NOISE = 6.0  # grey levels of noise (a standard deviation) above which a page is smoothed


def denoise(gray: np.ndarray, faint: bool = True) -> np.ndarray:
    """The page with salt and pepper taken out (a 3 x 3 median) or heavy sensor noise smoothed
    (a Gaussian of radius noise / 40, from 0.5 to 1.2 px), or faint text under light noise
    smoothed (radius 1: grey text 14-22 levels from its paper under noise of 3 was a blank
    page, the noise as wide as the ink's difference; stress.py: CER 56 %, 1.7 % now; only if
    FAINT, not on a page whose light was evened out: the noise of its dark end, amplified,
    smoothed into blobs read as junk), else the page itself.

    Specks of salt and pepper survived in the line strips and were read as dots, commas and
    lines of junk (stress.py: CER 36 %, 0.17 % now); noise of 20-35 levels, past the 14 the
    model was trained on, garbled letters (5.3 %, 0.12 % now). A radius of 1 for any noise
    also blurred away the strokes of 14-17 px text (0.5 % -> 8.5 %; 0.5 % with the radius
    following the noise). The held-out test set, whose noise stays under 5 levels, is left as
    it was; the check costs about 0.1 ms a page."""
    spikes, sigma = measure_noise(gray)
    if sigma > NOISE or (faint and sigma > 1 and _faint(gray, sigma)):
        radius = 1.0 if sigma <= NOISE else min(1.2, max(0.5, sigma / 40))
        return np.asarray(Image.fromarray(gray).filter(ImageFilter.GaussianBlur(radius)))
    if spikes > SPIKES:
        return _despike(gray)
    return gray


def _faint(gray: np.ndarray, noise: float) -> bool:
    """Whether the ink is within 8 x the noise of the paper: grey text on grey paper."""
    _, low, high = otsu(gray)
    return high - low < 8 * noise


def measure_noise(gray: np.ndarray, lag: int = 1) -> tuple[float, float]:
    """On every eighth row (64 rows at most): the share of pixels 64 levels darker or lighter
    than all eight neighbours, and the noise's standard deviation from the median absolute
    difference of pixels LAG apart in a row (robust to the text's edges, a minority; a LAG of
    3 measures the noise left after a blur, which neighbours share).

    Eight, not four: the one-pixel strokes of 10-13 px text stand out from their four sides
    (0.1-0.3 % of a clean page's pixels), never from their diagonals, where the stroke goes
    on; taken for salt and pepper, they were half erased ('water' read 'wa!rr'; clean 11 px
    pages as Pillow draws them: CER 20 %, 1.9 % now). Salt and pepper's specks stand alone
    (1.3-1.9 % of stress.py's pages)."""
    rows = np.arange(1, gray.shape[0] - 1, max(8, gray.shape[0] // 64))
    centre = gray[rows, 1:-1].astype(np.int16)
    around = [gray[rows + dy, dx : gray.shape[1] - 2 + dx] for dy in (-1, 0, 1) for dx in (0, 1, 2)]
    del around[4]  # the pixel itself
    dark = np.logical_and.reduce([centre + 64 < side for side in around])
    light = np.logical_and.reduce([centre - 64 > side for side in around])
    spikes = np.count_nonzero(dark | light) / max(1, centre.size)
    steps = np.abs(gray[rows, lag:].astype(np.int16) - gray[rows, :-lag]).astype(np.uint8)
    below = np.bincount(steps.ravel(), minlength=256).cumsum()
    mad = int(np.searchsorted(below, below[-1] / 2))
    return spikes, 1.4826 * mad / math.sqrt(2)


def _despike(gray: np.ndarray) -> np.ndarray:
    """Pixels 64 levels darker (or lighter) than three of their four neighbours replaced by
    their 3 x 3 median; the others kept: a median over the whole page ate the hyphens and
    thin strokes of 24 px serif text ('2024-03-15' read '202/ 03 15'). In blocks of 128 rows
    that stay in cache (5-10x faster than whole-page arrays)."""
    padded = np.pad(gray, 1, mode="edge")
    out = np.empty_like(gray)
    for y in range(0, gray.shape[0], 128):
        out[y : y + 128] = _despike_block(padded[y : y + 130])
    return out


def _despike_block(padded: np.ndarray) -> np.ndarray:
    """_despike of the rows inside PADDED (one row and column of context all around)."""
    wide = padded.astype(np.int16)
    centre = wide[1:-1, 1:-1]
    dark = np.zeros(centre.shape, dtype=np.uint8)
    light = np.zeros(centre.shape, dtype=np.uint8)
    for side in (wide[1:-1, :-2], wide[1:-1, 2:], wide[:-2, 1:-1], wide[2:, 1:-1]):
        step = side - centre
        dark += step > 64
        light += step < -64
    spikes = (dark >= 3) | (light >= 3)
    return np.where(spikes, _median3(padded), padded[1:-1, 1:-1])


def _median3(padded: np.ndarray) -> np.ndarray:
    """3 x 3 median of the inside of PADDED by min/max: sort each column's three pixels, then
    the median of the highest of the lows, of the middles and of the lowest of the highs."""
    a, b, c = padded[:-2], padded[1:-1], padded[2:]
    low, high = np.minimum(a, b), np.maximum(a, b)
    middle, high = np.minimum(high, c), np.maximum(high, c)
    low, middle = np.minimum(low, middle), np.maximum(low, middle)
    lows = np.maximum(np.maximum(low[:, :-2], low[:, 1:-1]), low[:, 2:])
    highs = np.minimum(np.minimum(high[:, :-2], high[:, 1:-1]), high[:, 2:])
    return _median_of_3(lows, _median_of_3(middle[:, :-2], middle[:, 1:-1], middle[:, 2:]), highs)


def _median_of_3(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    return np.maximum(np.minimum(a, b), np.minimum(np.maximum(a, b), c))
