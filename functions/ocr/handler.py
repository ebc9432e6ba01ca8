"""OCR handler: finds text lines on a page and turns the model's CTC logits into text.

preprocess: decode the image, binarise it (Otsu), find lines with a horizontal projection
profile, cut each line with a margin and normalise it to a float32 [1, 32, W] strip where
background is 0.0 and ink is 1.0 (whatever the page's polarity). One item per line; a line
wider than MAX_WIDTH after resizing is cut at word gaps into several items.
postprocess: greedy CTC decoding of each item's logits [T, C] (blank = class 0), trimmed to
the item's own T = W // 4 because the server pads widths across a batch.
"""

from __future__ import annotations

import base64
import binascii
import io
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np
from PIL import Image, ImageOps

from edgeserve.errors import InvalidInput, PayloadTooLarge

CHARSET = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 .,:;-/()'\"!?&%#@+=$"
LINE_HEIGHT = 32
DOWNSAMPLE = 4  # model output frames per input column: T = W // 4
MIN_WIDTH = 16
MAX_WIDTH = 2048
DEFAULT_MAX_PIXELS = 25_000_000


def normalize_line(gray: np.ndarray) -> np.ndarray:
    """Grey crop of one line (uint8, any polarity) -> float32 [1, 32, W], ink 1, paper 0.

    Shared with training (synth crops go through it) so both sides see the same strips.
    Polarity is per line: the median pixel of a line crop is paper.
    """
    h, w = gray.shape
    width = max(1, round(w * LINE_HEIGHT / h))
    resized = Image.fromarray(gray).resize((width, LINE_HEIGHT), Image.Resampling.BILINEAR)
    pixels = np.asarray(resized, dtype=np.float32)
    dark, paper, light = np.percentile(pixels, (1, 50, 99))
    ink = dark if paper - dark >= light - paper else light
    contrast = paper - ink
    if abs(contrast) < 24:
        contrast = 24.0 if contrast >= 0 else -24.0
    strip = np.clip((paper - pixels) / contrast, 0.0, 1.0)
    if width < MIN_WIDTH:
        left = (MIN_WIDTH - width) // 2
        strip = np.pad(strip, ((0, 0), (left, MIN_WIDTH - width - left)))
    return strip[np.newaxis].astype(np.float32)
