"""The training lines of `train.py --more-fonts`: narrower word spaces for proportional fonts
only, and lines resampled as the handler cuts them from a turned or scaled page."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import numpy as np

OCR = Path(__file__).resolve().parents[1] / "functions" / "ocr"
sys.path.insert(0, str(OCR / "training"))

import synth  # noqa: E402

SANS = synth.FONT_ROOT / "truetype/dejavu/DejaVuSans.ttf"
MONO = synth.FONT_ROOT / "truetype/dejavu/DejaVuSansMono.ttf"


def ink_columns(mask: np.ndarray) -> int:
    return int((np.asarray(mask) > 127).any(axis=0).sum())


def test_narrow_spaces_shorten_only_the_gaps_between_words() -> None:
    font = synth.load_font(SANS, 40)
    wide, (left, _, right, _) = synth.draw_mask("Paper A4 x 2 = $12.50", font)
    narrow, (start, _, end, _) = synth.draw_mask("Paper A4 x 2 = $12.50", font, space=0.6)
    gaps = 6 * font.getlength(" ") * 0.4  # six spaces, each 0.4 of its width shorter
    assert abs((right - left) - (end - start) - gaps) <= 6  # each word placed at a whole pixel
    assert ink_columns(wide) == ink_columns(narrow)  # the words themselves are drawn alike


def test_monospaced_fonts_keep_their_spaces() -> None:
    rng = random.Random(1)
    mono = synth.load_font(MONO, 30)
    sans = synth.load_font(SANS, 30)
    assert {synth.narrow_space(mono, rng, 1.0) for _ in range(50)} == {1.0}
    spaces = [synth.narrow_space(sans, rng, 1.0) for _ in range(50)]
    assert all(0.6 <= space <= 1.0 for space in spaces) and len(set(spaces)) > 1


def test_resampled_lines_keep_their_size_or_shrink_no_smaller_than_the_floor() -> None:
    rng = random.Random(2)
    for size in (16, 20, 30, 52):
        font = synth.load_font(SANS, size)
        mask, box = synth.draw_mask("Dated 2025. Reference", font)
        gray = synth.apply_style(
            mask.crop(box), synth.Style(255, 0, 0.0, 0.0), np.random.default_rng(0)
        )
        for _ in range(20):
            line = synth._resampled(gray, 255, size, rng)
            assert line.dtype == np.uint8
            scale = line.shape[0] / gray.shape[0]
            if scale < 1:  # scaled down: never to text under the floor
                assert size * scale >= synth.SMALLEST_SCALED - 1
            else:  # turned and levelled back: the same crop, softened
                assert line.shape == gray.shape
