"""OCR handler: finds text lines on a page and turns the model's CTC logits into text.

preprocess: decode the image, turn it grey (luminance, or the colour axis where ink and
paper differ only in hue), even out the paper where the light was uneven, take out salt and
pepper or heavy noise, binarise it (Otsu), level a page skewed by up to 3 degrees, find
columns (gutters several lines share) and in each the lines with a horizontal projection
profile, cut each line with a margin and normalise it to a float32 [1, 32, W] strip where
background is 0.0 and ink is 1.0 (whatever the page's polarity). One item per line, in
reading order; a line with wide gaps (tab stops) or wider than MAX_WIDTH after resizing is
cut into several items, whose texts are joined with a space. Boxes are given in the
coordinates of the image as sent.
postprocess: greedy CTC decoding of each item's logits [T, C] (blank = class 0). Lines of
different widths share padded batches; the server cuts each line's logits back to its own
T = W // 4 (function.toml: [model.outputs.logits] follows the image width, ratio 0.25).
"""

from __future__ import annotations

import base64
import binascii
import io
import itertools
import math
import re
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np
from PIL import Image, ImageFilter, ImageOps

from edgeserve.errors import InvalidInput, PayloadTooLarge

CHARSET = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 .,:;-/()'\"!?&%#@+=$"
LINE_HEIGHT = 32
DOWNSAMPLE = 4  # model output frames per input column: T = W // 4
MIN_WIDTH = 16
MAX_WIDTH = 2048
DEFAULT_MAX_PIXELS = 25_000_000
MIN_CONFIDENCE = 0.7  # lines read with less are dropped (postprocess)


def normalize_line(gray: np.ndarray) -> np.ndarray:
    """Grey crop of one line (uint8, any polarity) -> float32 [1, 32, W], ink 1, paper 0.

    Shared with training (synth crops go through it) so both sides see the same strips.
    Polarity is per line: the median pixel of a line crop is paper.
    """
    h, w = gray.shape
    width = max(1, round(w * LINE_HEIGHT / h))
    resized = Image.fromarray(gray).resize((width, LINE_HEIGHT), Image.Resampling.BILINEAR)
    levels = np.asarray(resized, dtype=np.uint8)
    dark, paper, light = _percentiles(levels, (1, 50, 99))
    ink = dark if paper - dark >= light - paper else light
    contrast = paper - ink
    if abs(contrast) < 24:
        contrast = 24.0 if contrast >= 0 else -24.0
    strip = np.clip((paper - levels.astype(np.float32)) / np.float32(contrast), 0.0, 1.0)
    if width < MIN_WIDTH:
        left = (MIN_WIDTH - width) // 2
        strip = np.pad(strip, ((0, 0), (left, MIN_WIDTH - width - left)))
    return strip[np.newaxis].astype(np.float32)


def _percentiles(levels: np.ndarray, qs: tuple[float, ...]) -> list[float]:
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


def preprocess(payload: Any, ctx: Any) -> list[dict[str, np.ndarray]]:
    """Image -> one normalised strip per text line (or per piece of a very long line)."""
    max_pixels = int(ctx.options.get("max_pixels", DEFAULT_MAX_PIXELS))
    gray = to_gray(load_image(payload, max_pixels))
    evened = even_light(gray)
    page = denoise(evened, faint=evened is gray)
    gray, mask, angle = deskew(page)
    if mask is not None:
        gray, mask = remove_rules(gray, mask)
    items: list[dict[str, np.ndarray]] = []
    if mask is None:  # a blank page: no lines
        ctx.state["owners"], ctx.state["boxes"] = [], []
        return items
    owners: list[int] = []  # the line index of each item
    boxes: list[list[int]] = []
    for box in read_order(mask):
        for x0, x1 in split_line(mask, box):
            x0, y0, x1, y1 = _pad_box(gray.shape, (x0, box[1], x1, box[3]))
            strip = normalize_line(gray[y0:y1, x0:x1])
            items.append({"image": strip})
            owners.append(len(boxes))
        boxes.append(_unrotate_box(box, angle, page.shape, gray.shape))
    ctx.state["owners"], ctx.state["boxes"] = owners, boxes
    return items


def postprocess(items: list[dict[str, np.ndarray]], ctx: Any) -> dict[str, Any]:
    """Greedy CTC per item, pieces joined per line; confidence = mean max-probability per char.

    A line read with a confidence under `min_confidence` ([handler.options], MIN_CONFIDENCE by
    default) is dropped: specks of noise in a photo's darkest corner, read as 'x' or
    'L: s: 5gsL:z' (0.26-0.69), where every line of text in 2,000 of stress.py and of unseen
    fonts was read with 0.75 or more, even when misread."""
    floor = float(ctx.options.get("min_confidence", MIN_CONFIDENCE))
    owners: list[int] = ctx.state.get("owners", [])
    boxes: list[list[int]] = ctx.state.get("boxes", [])
    pieces: list[list[tuple[str, list[float]]]] = [[] for _ in boxes]
    for item, line in zip(items, owners, strict=True):
        logits = np.asarray(item["logits"], dtype=np.float32)
        pieces[line].append(ctc_greedy(logits.reshape(-1, logits.shape[-1])))
    lines = []
    for box, parts in zip(boxes, pieces, strict=True):
        text = digits_in_numbers(" ".join(t for t, _ in parts if t))
        probs = [p for _, ps in parts for p in ps]
        confidence = round(float(np.mean(probs)), 4) if probs else 0.0
        if text and confidence >= floor:
            lines.append({"text": text, "confidence": confidence, "box": box})
    return {"text": "\n".join(line["text"] for line in lines), "lines": lines}


LOOKALIKES = str.maketrans("oOIlgz", "001192")
NUMBER = re.compile(r"[0-9oOIlgz.,:/\-%$#()+=]*[0-9][0-9oOIlgz.,:/\-%$#()+=]*")
UNIT = re.compile(r"[0-9.,]+(oz|[glz])\W*")  # 500g, 1l, 16oz: the letters are letters


def digits_in_numbers(text: str) -> str:
    """Letters read for digits inside numbers turned back into digits: 'o' and 'O' for 0, 'I'
    and 'l' for 1, 'g' for 9, 'z' for 2, in a word of digits, those letters and the signs of
    numbers where digits are at least as many as the letters, and not a unit (500g, 16oz).

    Old-style figures (the 0 as high as an o, the 1 as an I, the 9 below the line as a g)
    were read as those letters: '1997-o6-16 2O19', 'Qty 88 x 8g8.24' (stress.py: CER 2.0 %,
    0.3 % now; evaluate.py --fonts on the 7 unseen families of stress.py: line CER 1.85 %
    -> 1.38 %)."""
    words = text.split(" ")
    for i, word in enumerate(words):
        if NUMBER.fullmatch(word) and not UNIT.fullmatch(word):
            digits = sum(c.isdigit() for c in word)
            if digits >= sum(c in "oOIlgz" for c in word):
                words[i] = word.translate(LOOKALIKES)
    return " ".join(words)


def ctc_greedy(logits: np.ndarray) -> tuple[str, list[float]]:
    """Best class per frame, repeats merged, blanks dropped; each char's peak probability."""
    shifted = logits - logits.max(axis=1, keepdims=True)
    probs = np.exp(shifted) / np.exp(shifted).sum(axis=1, keepdims=True)
    best = probs.argmax(axis=1)
    chars: list[str] = []
    peaks: list[float] = []
    for t, cls in enumerate(best.tolist()):
        p = float(probs[t, cls])
        if cls != 0 and t > 0 and cls == best[t - 1]:
            peaks[-1] = max(peaks[-1], p)
        elif cls != 0:
            chars.append(CHARSET[cls - 1])
            peaks.append(p)
    return "".join(chars).strip(), peaks


FORMATS = ["PNG", "JPEG", "BMP", "TIFF", "WEBP", "GIF"]


def load_image(payload: Any, max_pixels: int) -> Image.Image:
    """Raw bytes, {"image": base64 | bytes | pixel array} -> a decoded, upright PIL image."""
    if isinstance(payload, bytes | bytearray | memoryview):
        return _decode(bytes(payload), max_pixels)
    if not isinstance(payload, Mapping) or "image" not in payload:
        raise InvalidInput(
            "expected an image body (image/png, image/jpeg) or an object with an 'image' "
            f"field, got {type(payload).__name__}"
        )
    value = payload["image"]
    if isinstance(value, str):
        return _decode(_b64decode(value), max_pixels)
    if isinstance(value, bytes | bytearray | memoryview):
        return _decode(bytes(value), max_pixels)
    return _from_pixels(value, max_pixels)


def _b64decode(text: str) -> bytes:
    """Plain base64, or a data URL such as 'data:image/png;base64,...'."""
    try:
        return base64.b64decode(text.partition("base64,")[2] or text, validate=True)
    except (binascii.Error, ValueError) as err:
        raise InvalidInput(f"'image' is not valid base64 of a PNG or JPEG file: {err}") from err


def _decode(data: bytes, max_pixels: int) -> Image.Image:
    """Read the header first and refuse oversized images before any pixel is decoded."""
    if not data:
        raise InvalidInput("the image is empty: expected the bytes of a PNG or JPEG file")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data), formats=FORMATS)
    except Image.DecompressionBombError as err:
        declared = f"more than {2 * Image.MAX_IMAGE_PIXELS} " if Image.MAX_IMAGE_PIXELS else ""
        raise PayloadTooLarge(
            f"image too large: its header declares {declared}pixels; the limit is {max_pixels}"
        ) from err
    except (OSError, SyntaxError, ValueError) as err:
        raise InvalidInput(
            f"the {len(data)} bytes starting {data[:8]!r} are not an image: "
            f"expected a PNG, JPEG, BMP, TIFF, WEBP or GIF file"
        ) from err
    _check_size(image.width, image.height, max_pixels)
    try:
        image.load()
    except (OSError, SyntaxError, ValueError) as err:
        raise InvalidInput(f"the image data is truncated or corrupt: {err}") from err
    return ImageOps.exif_transpose(image)


def _from_pixels(value: Any, max_pixels: int) -> Image.Image:
    """An HxW or HxWxC (C = 1, 3 or 4) array of 0..255 pixel values."""
    if isinstance(value, list) and value and isinstance(value[0], list):
        _check_size(len(value[0]), len(value), max_pixels)  # before building a huge array
    try:
        pixels = np.asarray(value)
    except ValueError as err:
        raise InvalidInput(f"'image' is not a rectangular pixel array: {err}") from err
    if pixels.ndim == 3 and pixels.shape[2] == 1:
        pixels = pixels[:, :, 0]
    if not (pixels.ndim == 2 or (pixels.ndim == 3 and pixels.shape[2] in (3, 4))):
        raise InvalidInput(f"'image' has shape {pixels.shape}: expected HxW or HxWxC, C in 1, 3, 4")
    _check_size(pixels.shape[1], pixels.shape[0], max_pixels)
    if pixels.dtype.kind not in "uif" or pixels.min() < 0 or pixels.max() > 255:
        raise InvalidInput("'image' pixel values must be numbers from 0 to 255 (uint8)")
    return Image.fromarray(pixels.astype(np.uint8))


def _check_size(width: int, height: int, max_pixels: int) -> None:
    if width * height > max_pixels:
        raise PayloadTooLarge(
            f"image is {width}x{height} = {width * height} pixels; the limit is {max_pixels}"
        )
    if width < 8 or height < 8:
        raise InvalidInput(f"image is {width}x{height} pixels: too small to hold text (min 8x8)")


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
    low, high = _percentiles(paper, (2, 98))
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
    low, high = _percentiles(departures, (0.5, 99.5))
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
    spikes, sigma = _noise(gray)
    if sigma > NOISE or (faint and sigma > 1 and _faint(gray, sigma)):
        radius = 1.0 if sigma <= NOISE else min(1.2, max(0.5, sigma / 40))
        return np.asarray(Image.fromarray(gray).filter(ImageFilter.GaussianBlur(radius)))
    if spikes > SPIKES:
        return _despike(gray)
    return gray


def _faint(gray: np.ndarray, noise: float) -> bool:
    """Whether the ink is within 8 x the noise of the paper: grey text on grey paper."""
    _, low, high = _otsu(gray)
    return high - low < 8 * noise


def _noise(gray: np.ndarray, lag: int = 1) -> tuple[float, float]:
    """On every eighth row (64 rows at most): the share of pixels 64 levels darker or lighter
    than their four neighbours, and the noise's standard deviation from the median absolute
    difference of pixels LAG apart in a row (robust to the text's edges, a minority; a LAG of
    3 measures the noise left after a blur, which neighbours share)."""
    rows = np.arange(1, gray.shape[0] - 1, max(8, gray.shape[0] // 64))
    centre = gray[rows, 1:-1].astype(np.int16)
    around = [gray[rows, :-2], gray[rows, 2:], gray[rows - 1, 1:-1], gray[rows + 1, 1:-1]]
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


MIN_CONTRAST = 5  # grey levels between its two tones under which a page is blank (ink_mask)


def ink_mask(gray: np.ndarray) -> np.ndarray | None:
    """Otsu binarisation, ink = the minority class; None for a blank page: one tone (its two
    classes closer than MIN_CONTRAST or than 4 x the noise, or split near half and half, as
    noise or a paper's texture splits: text covers far less), or nothing left once specks are
    dropped (scattered dots, a lone pixel). Photos of blank paper, noisy, blotched, fibrous,
    striped or JPEG-compressed, are blank pages."""
    threshold, mean_low, mean_high = _otsu(gray)
    contrast = mean_high - mean_low
    dark = gray <= threshold
    share = float(dark.mean())
    if contrast < 40 and (
        contrast < MIN_CONTRAST or contrast < 4 * _noise(gray, lag=3)[1] or 0.35 < share < 0.65
    ):
        return None
    mask = _despeckle(dark if share < 0.5 else ~dark)
    return mask if mask.any() else None


def _otsu(gray: np.ndarray) -> tuple[int, float, float]:
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


def _despeckle(mask: np.ndarray) -> np.ndarray:
    """Drop ink pixels with fewer than two ink neighbours: sensor noise, not strokes. The 3x3
    counts are two passes of three-wide sums (rows, then columns): half the additions."""
    padded = np.pad(mask, 1).astype(np.uint8)
    rows = padded[:-2] + padded[1:-1] + padded[2:]
    around = rows[:, :-2] + rows[:, 1:-1] + rows[:, 2:]  # the pixel itself counted too
    return mask & (around >= 3)


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
    gray[grown] = _paper(gray)
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


def _paper(gray: np.ndarray) -> int:
    """The paper's grey: the median of a sample of the page."""
    return int(np.median(gray[:: max(1, gray.shape[0] // 200), :: max(1, gray.shape[1] // 200)]))


Box = tuple[int, int, int, int]  # x0, y0, x1, y1
GUTTER = 0.8  # x the line height: the narrowest gap between columns (word gaps: about 0.3)
COLUMN = 10.0  # x the line height: the narrowest column (a price or a date is narrower)
FILL = 0.75  # the median line of a column fills this much of it (wrapped text: 0.8-1.0)


def read_order(mask: np.ndarray, depth: int = 0) -> list[Box]:
    """Line boxes in reading order: top to bottom, and where the page runs in columns, each
    column top to bottom before the next.

    Lines of two columns side by side were one line, read across the gutter ('Total: $13.60
    VAT 21% = 15%'; stress.py: CER 78 %). A gutter is a gap of at least GUTTER x the line
    height that three or more lines in a row share, with at least COLUMN x the line height of
    text on either side and no wider than the narrower side (a receipt's prices, a form's
    short labels and values stay rows); the lines of each column are then found in it alone
    (columns whose lines do not line up came out as one band), a column in two at most."""
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
    return [(x0 + a, x0 + b) for a, b in _runs(~ink) if b - a >= least]


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


def find_lines(mask: np.ndarray) -> list[Box]:
    """Line boxes (x0, y0, x1, y1), top to bottom, from the horizontal ink profile."""
    profile = mask.sum(axis=1)
    bands = _runs(profile >= 2)
    if not bands:
        return []
    typical = float(np.median([b - a for a, b in bands]))
    bands = _attach_small(bands, typical)
    typical = float(np.median([b - a for a, b in bands]))
    boxes = []
    for y0, y1 in (piece for band in bands for piece in _split_tall(band, profile, typical)):
        columns = np.flatnonzero(mask[y0:y1].any(axis=0))
        if y1 - y0 >= 0.3 * typical and columns.size:
            boxes.append((int(columns[0]), y0, int(columns[-1]) + 1, y1))
    return boxes


def _runs(flags: np.ndarray) -> list[tuple[int, int]]:
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


def split_line(mask: np.ndarray, box: tuple[int, int, int, int]) -> list[tuple[int, int]]:
    """Column ranges of a line: cut at wide gaps (tab stops) and wherever the strip would
    exceed MAX_WIDTH, choosing the widest gap that keeps each piece short enough. The gaps
    are read off the page's ink mask, the one that found the line."""
    x0, y0, x1, y1 = box
    ink = mask[y0:y1, x0:x1].any(axis=0)
    height = y1 - y0
    limit = int(MAX_WIDTH * height / LINE_HEIGHT * 0.8)
    pieces, start = [], 0
    gaps = [(a, b) for a, b in _runs(~ink) if a > 0 and b < ink.size]
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


def _pad_box(shape: tuple[int, ...], box: tuple[int, int, int, int]) -> tuple[int, int, int, int]:
    """The margin the model was trained with: about 0.15 x height above/below, 0.2 x aside."""
    x0, y0, x1, y1 = box
    height = y1 - y0
    dy, dx = round(0.15 * height) + 1, round(0.2 * height) + 1
    return max(0, x0 - dx), max(0, y0 - dy), min(shape[1], x1 + dx), min(shape[0], y1 + dy)


MAX_SKEW = 3.0  # degrees searched; line strips themselves were trained on +-2 degrees


def deskew(page: np.ndarray) -> tuple[np.ndarray, np.ndarray | None, float]:
    """The page levelled if it is skewed, its ink mask (None if blank) and the angle used."""
    mask = ink_mask(page)
    angle = skew_angle(mask) if mask is not None else 0.0
    if not angle:
        return page, mask, 0.0
    gray = _rotate(page, angle)
    return gray, ink_mask(gray), angle


def skew_angle(mask: np.ndarray) -> float:
    """Page rotation (degrees, Pillow's counter-clockwise sense) that makes lines level:
    the angle whose row profile is sharpest (largest sum of squares), if clearly better.

    Each angle's profile counts the ink pixels by the row they land on once rotated about the
    centre (no rotated image is drawn: 9x faster than Pillow's rotate of the mask, which was
    two thirds of a front's time on a GPU host; the same angle on 172 of 174 pages of samples/
    rotated by -3.5 to 3.5 degrees, and the two others levelled more exactly). Whole degrees
    are tried first, then the quarters around the best: 13 profiles instead of 25, the same
    angle as all 25 on 300 of 300 rendered pages (half of them rotated), 2.5x faster with the
    1-D nonzero (a 2-D one took longer than all the profiles)."""
    step = max(1, max(mask.shape) // 800)
    small = mask[::step, ::step]
    ys, xs = np.divmod(np.flatnonzero(small), small.shape[1])
    if not ys.size:  # the ink fell between the rows and columns sampled: nothing to level
        return 0.0
    ys = (ys - small.shape[0] // 2).astype(np.float32)  # whole rows: angle 0 is the profile
    xs = (xs - small.shape[1] // 2).astype(np.float32)

    def sharpness(angle: float) -> float:
        theta = np.deg2rad(angle)  # counter-clockwise on screen, y pointing down
        cos, sin = np.float32(np.cos(theta)), np.float32(np.sin(theta))
        rows = np.rint(ys * cos - xs * sin).astype(np.int32)
        profile = np.bincount(rows - rows.min()).astype(np.float64)
        return float(np.dot(profile, profile))

    angles = np.arange(-MAX_SKEW, MAX_SKEW + 1e-6, 0.25)
    scores = {k: sharpness(angles[k]) for k in range(0, len(angles), 4)}  # whole degrees
    peak = max(scores, key=scores.__getitem__)
    for k in range(max(0, peak - 3), min(len(angles), peak + 4)):
        if k not in scores:
            scores[k] = sharpness(angles[k])
    best = max(scores, key=scores.__getitem__)
    level = scores[len(angles) // 2]
    if abs(angles[best]) < 0.5 or scores[best] < 1.1 * level:
        return 0.0
    return float(angles[best])


def _rotate(gray: np.ndarray, angle: float) -> np.ndarray:
    """Rotate about the centre, growing the canvas and filling with the paper's grey."""
    image = Image.fromarray(gray).rotate(
        angle, Image.Resampling.BICUBIC, expand=True, fillcolor=_paper(gray)
    )
    return np.asarray(image, dtype=np.uint8)


def _unrotate_box(
    box: tuple[int, int, int, int], angle: float, shape: tuple[int, ...], rotated: tuple[int, ...]
) -> list[int]:
    """A box found on the deskewed page, as the enclosing box on the page as sent."""
    x0, y0, x1, y1 = box
    if not angle:
        return [x0, y0, x1, y1]
    theta = np.deg2rad(angle)
    xs = np.array([x0, x1, x1, x0], dtype=np.float64) - rotated[1] / 2
    ys = np.array([y0, y0, y1, y1], dtype=np.float64) - rotated[0] / 2
    px = np.cos(theta) * xs - np.sin(theta) * ys + shape[1] / 2
    py = np.sin(theta) * xs + np.cos(theta) * ys + shape[0] / 2
    return [
        max(0, int(px.min())),
        max(0, int(py.min())),
        min(shape[1], int(np.ceil(px.max()))),
        min(shape[0], int(np.ceil(py.max()))),
    ]
