"""The image as sent: raw bytes, base64 (a data URL too) or a pixel array, decoded into an
upright PIL image; refused (400, 413) when it is no image, too small, or too large, before its
pixels are decoded.

Everything the client controls is checked here: the steps after it work on a page known to be
a sane image.
"""

from __future__ import annotations

import base64
import binascii
import io
import itertools
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np
from PIL import Image, ImageOps

from edgeserve.errors import InvalidInput, PayloadTooLarge, echo_json, echo_repr

DEFAULT_MAX_PIXELS = 25_000_000
SHOWN_KEYS = 4


FORMATS = ["PNG", "JPEG", "BMP", "TIFF", "WEBP", "GIF"]


def load_image(payload: Any, max_pixels: int) -> Image.Image:
    """Raw bytes, {"image": base64 | bytes | pixel array} -> a decoded, upright PIL image."""
    if isinstance(payload, bytes | bytearray | memoryview):
        return _decode(bytes(payload), max_pixels)
    if not isinstance(payload, Mapping) or "image" not in payload:
        found = _keys(payload) if isinstance(payload, Mapping) else echo_json(payload)
        raise InvalidInput(
            "expected an image body (image/png, image/jpeg) or an object with an 'image' "
            f"field, got {found}"
        )
    value = payload["image"]
    if isinstance(value, str):
        return _decode(_b64decode(value), max_pixels)
    if isinstance(value, bytes | bytearray | memoryview):
        return _decode(bytes(value), max_pixels)
    return _from_pixels(value, max_pixels)


def _keys(payload: Mapping[Any, Any]) -> str:
    """An object without 'image' by its keys (a few, each cut: the client's strings), and the
    one key this function reads."""
    shown = [echo_repr(key) for key in itertools.islice(payload, SHOWN_KEYS)]
    more = f" and {len(payload) - SHOWN_KEYS} more" if len(payload) > SHOWN_KEYS else ""
    found = f"the keys {', '.join(shown)}{more}" if payload else "no keys"
    return f"an object with {found}; 'image' is the only key this function reads"


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
            f"expected a PNG, JPEG, BMP, TIFF, WEBP or GIF file{_base64_hint(data)}"
        ) from err
    _check_size(image.width, image.height, max_pixels)
    try:
        image.load()
    except (OSError, SyntaxError, ValueError) as err:
        raise InvalidInput(f"the image data is truncated or corrupt: {err}") from err
    return ImageOps.exif_transpose(image)


SIGNATURES = {
    b"\x89PNG": "PNG",
    b"\xff\xd8\xff": "JPEG",
    b"GIF8": "GIF",
    b"BM": "BMP",
    b"RIFF": "WEBP",
    b"II*\x00": "TIFF",
    b"MM\x00*": "TIFF",
}
"""How each format's file begins."""


def _base64_hint(data: bytes) -> str:
    """A hint where the bytes are an image file's base64 text (a data URL's too), sent as
    the file: they read only "not an image", starting b'iVBORw0K' (a PNG's base64)."""
    text = data[:64].partition(b"base64,")[2] or data[:64]
    try:
        head = base64.b64decode(text[: len(text) // 4 * 4], validate=True)
    except (binascii.Error, ValueError):
        return ""
    kind = next((name for sign, name in SIGNATURES.items() if head.startswith(sign)), None)
    if kind is None:
        return ""
    return (
        f". Hint: they are the base64 text of a {kind} file: send the file's own bytes "
        '(curl --data-binary @page.png), or the text in JSON as {"image": "..."}'
    )


def _from_pixels(value: Any, max_pixels: int) -> Image.Image:
    """An HxW or HxWxC (C = 1, 3 or 4) array of 0..255 pixel values (a NaN is none: it
    compares false with both bounds)."""
    if not isinstance(value, list | np.ndarray):
        raise InvalidInput(
            "'image' must be an image file (base64 text in JSON, bytes in msgpack) or an HxW "
            f"or HxWxC array of pixel values, got {echo_json(value)}"
        )
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
    if pixels.dtype.kind not in "uif" or not (pixels.min() >= 0 and pixels.max() <= 255):
        raise InvalidInput("'image' pixel values must be numbers from 0 to 255 (uint8)")
    return Image.fromarray(pixels.astype(np.uint8))


def _check_size(width: int, height: int, max_pixels: int) -> None:
    if width * height > max_pixels:
        raise PayloadTooLarge(
            f"image is {width}x{height} = {width * height} pixels; the limit is {max_pixels}"
        )
    if width < 8 or height < 8:
        raise InvalidInput(f"image is {width}x{height} pixels: too small to hold text (min 8x8)")
