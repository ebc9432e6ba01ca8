"""Which pixels are ink: Otsu's binarisation, the minority class, specks dropped; or None for
a blank page.

The blank page is decided here, from the two tones Otsu finds: too close, or split near half
and half as noise and a paper's texture split, they are no text.
"""

from __future__ import annotations

import numpy as np
from noise import measure_noise
from tones import otsu

MIN_CONTRAST = 5  # grey levels between its two tones under which a page is blank (ink_mask)


def ink_mask(gray: np.ndarray) -> np.ndarray | None:
    """Otsu binarisation, ink = the minority class; None for a blank page: one tone (its two
    classes closer than MIN_CONTRAST or than 4 x the noise, or split near half and half, as
    noise or a paper's texture splits: text covers far less), or nothing left once specks are
    dropped (scattered dots, a lone pixel). Photos of blank paper, noisy, blotched, fibrous,
    striped or JPEG-compressed, are blank pages."""
    threshold, mean_low, mean_high = otsu(gray)
    contrast = mean_high - mean_low
    dark = gray <= threshold
    share = float(dark.mean())
    if contrast < 40 and (
        contrast < MIN_CONTRAST
        or contrast < 4 * measure_noise(gray, lag=3)[1]
        or 0.35 < share < 0.65
    ):
        return None
    mask = _despeckle(dark if share < 0.5 else ~dark)
    return mask if mask.any() else None


def _despeckle(mask: np.ndarray) -> np.ndarray:
    """Drop ink pixels with fewer than two ink neighbours: sensor noise, not strokes. The 3x3
    counts are two passes of three-wide sums (rows, then columns): half the additions."""
    padded = np.pad(mask, 1).astype(np.uint8)
    rows = padded[:-2] + padded[1:-1] + padded[2:]
    around = rows[:, :-2] + rows[:, 1:-1] + rows[:, 2:]  # the pixel itself counted too
    return mask & (around >= 3)
