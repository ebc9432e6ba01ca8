"""The page in grey: luminance, or where the ink differs from its paper by its colour more
than by its brightness, the colour axis along which they differ most; transparency flattened
onto the background that keeps the text visible.

Every later step works on one grey channel, and which channel is a question of its own: red
text on green paper of the same brightness was a blank page in luminance.
"""

from __future__ import annotations

import numpy as np
from PIL import Image

from edgeserve.errors import InvalidInput


def to_gray(image: Image.Image) -> np.ndarray:
    """uint8 grey: luminance, or where the ink differs from the paper by its colour more than
    by its brightness, the colour axis along which they differ most (_colour_contrast)."""
    if image.mode in ("I", "I;16", "I;16B", "I;16L", "F"):
        values = np.asarray(image, dtype=np.float32)
        low, high = float(values.min()), float(values.max())
        return ((values - low) * (255.0 / max(high - low, 1e-6))).astype(np.uint8)
    try:
        if image.mode in ("RGBA", "LA", "PA") or "transparency" in image.info:
            image = _flatten(image)
        gray = np.asarray(image.convert("L"), dtype=np.uint8)
        return gray if image.mode in ("1", "L") else _colour_contrast(image, gray)
    except (ValueError, OSError) as err:  # Pillow: "conversion from LAB to RGB not supported"
        raise InvalidInput(
            f"the image's mode {image.mode} cannot be converted to grey ({err}); "
            "send an RGB, RGBA, greyscale or palette image"
        ) from None


def _flatten(image: Image.Image) -> Image.Image:
    """Transparency flattened onto white (dark text on clear PNGs), or onto black where white
    leaves no contrast (white text on a clear PNG was a blank page)."""
    rgba = image.convert("RGBA")
    flat = Image.alpha_composite(Image.new("RGBA", rgba.size, "white"), rgba)
    low, high = flat.convert("L").getextrema()
    if high - low < 40:  # light text on a clear background: onto black, as it is shown
        flat = Image.alpha_composite(Image.new("RGBA", rgba.size, "black"), rgba)
    return flat.convert("RGB") if image.mode != "LA" else flat.convert("L")


LUMA = np.array([0.299, 0.587, 0.114])  # ITU-R 601, as Pillow's convert("L")


def _colour_contrast(image: Image.Image, luminance: np.ndarray) -> np.ndarray:
    """LUMINANCE, unless the colours vary four times more along another axis of RGB than
    along it: then the page projected on that axis (the first principal component of its
    pixels, on the page reduced to 128 px), stretched to 0-255.

    Red text on green paper of the same brightness had no contrast in luminance: a blank
    page (stress.py: CER 100 %). Black on white, or on pale colours, varies most along grey:
    luminance as before, for a cost of about 0.2 ms a colour page."""
    rgb = image if image.mode == "RGB" else image.convert("RGB")
    small = np.asarray(rgb.reduce(-(-max(rgb.size) // 128)), dtype=np.float32)
    channels = small.reshape(-1, 3).T.copy()  # one row per channel: 6x faster sums
    centred = channels - channels.mean(axis=1, keepdims=True)
    spread = (centred @ centred.T / centred.shape[1]).astype(np.float64)
    axis = np.linalg.eigh(spread)[1][:, -1]
    axis /= np.abs(axis).sum()  # a grey step of 1 moves it by at most 1, as in luminance
    if LUMA @ spread @ LUMA >= 0.25 * (axis @ spread @ axis):
        return luminance
    along = axis @ channels
    low, high = float(along.min()), float(along.max())
    scale = 255.0 / max(high - low, 1e-6)
    matrix = (*(float(w) * scale for w in axis), -low * scale)
    return np.asarray(rgb.convert("L", matrix), dtype=np.uint8)
