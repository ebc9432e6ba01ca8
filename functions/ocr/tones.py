"""Grey levels of a page or a line, read off histograms: percentiles, Otsu's threshold and
the paper's grey.

Every step of a page's cleaning asks these (the light, the noise, the ink mask, the rules, the
skew, the strips), and each is cheaper from a histogram than from a sort: one module keeps
them exact and fast for all.
"""

from __future__ import annotations

import numpy as np
from PIL import Image


def percentiles(levels: np.ndarray, qs: tuple[float, ...]) -> list[float]:
    """np.percentile's (linear) of uint8 levels, read off their histogram: no sort, and
    4x faster on a line strip (np.percentile was a fifth of a page's preprocessing)."""
    below = np.bincount(levels.ravel(), minlength=256).cumsum()  # levels <= v, per v
    last = int(below[-1]) - 1
    values = []
    for q in qs:
        position = q / 100 * last
        low = int(position)
        a, b = np.searchsorted(below, (low, min(low + 1, last)), side="right").tolist()
        values.append(a + (b - a) * (position - low))
    return values


def otsu(gray: np.ndarray) -> tuple[int, float, float]:
    """Otsu's threshold and the mean grey level on either side of it."""
    hist = np.asarray(Image.fromarray(gray).histogram(), dtype=np.float64)  # C, no int64 copy
    weight = np.cumsum(hist)[:-1]
    mass = np.cumsum(hist * np.arange(256))[:-1]
    total, total_mass = hist.sum(), float(np.dot(hist, np.arange(256)))
    with np.errstate(divide="ignore", invalid="ignore"):
        mean_low = mass / weight
        mean_high = (total_mass - mass) / (total - weight)
        between = np.nan_to_num(weight * (total - weight) * (mean_high - mean_low) ** 2)
    t = int(np.argmax(between))
    if between[t] <= 0:
        return t, 0.0, 0.0
    return t, float(mean_low[t]), float(mean_high[t])


def paper_grey(gray: np.ndarray) -> int:
    """The paper's grey: the median of a sample of the page."""
    return int(np.median(gray[:: max(1, gray.shape[0] // 200), :: max(1, gray.shape[1] // 200)]))
