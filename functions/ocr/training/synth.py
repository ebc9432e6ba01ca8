"""Synthetic text-line and page renderer for training and evaluating the OCR model.

Lines are rendered with Pillow from system TTF/OTF fonts, degraded (noise, blur, contrast,
rotation, crops, inverted backgrounds) and then cut the way `handler.py` cuts lines from a
page, so the model sees at training time what the handler gives it at serving time.
Fonts are split once and for all: TRAIN_FONTS for training, HELD_OUT_FONTS only for
evaluation and samples (their families have no metric clone among the training fonts).
"""

from __future__ import annotations

import os
import random
import string
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFilter, ImageFont

CHARSET = string.ascii_letters + string.digits + " .,:;-/()'\"!?&%#@+=$"
FONT_ROOT = Path(os.environ.get("OCR_FONT_ROOT", "/usr/share/fonts"))

TRAIN_FONTS = [
    "truetype/dejavu/DejaVuSans.ttf",
    "truetype/dejavu/DejaVuSans-Bold.ttf",
    "truetype/dejavu/DejaVuSans-Oblique.ttf",
    "truetype/dejavu/DejaVuSansCondensed.ttf",
    "truetype/dejavu/DejaVuSansMono.ttf",
    "truetype/dejavu/DejaVuSerif.ttf",
    "truetype/dejavu/DejaVuSerif-Bold.ttf",
    "truetype/dejavu/DejaVuSerifCondensed-Italic.ttf",
    "truetype/liberation2/LiberationSans-Regular.ttf",
    "truetype/liberation2/LiberationSans-Bold.ttf",
    "truetype/liberation2/LiberationSans-Italic.ttf",
    "truetype/liberation2/LiberationSerif-Regular.ttf",
    "truetype/liberation2/LiberationSerif-Bold.ttf",
    "truetype/liberation2/LiberationSerif-Italic.ttf",
    "truetype/liberation2/LiberationMono-Regular.ttf",
    "truetype/liberation2/LiberationMono-Bold.ttf",
    "truetype/freefont/FreeSans.ttf",
    "truetype/freefont/FreeSansBold.ttf",
    "truetype/freefont/FreeSerif.ttf",
    "truetype/freefont/FreeSerifItalic.ttf",
    "truetype/freefont/FreeMono.ttf",
    "truetype/freefont/FreeMonoBold.ttf",
    "opentype/urw-base35/NimbusSans-Regular.otf",
    "opentype/urw-base35/NimbusSans-Bold.otf",
    "opentype/urw-base35/NimbusSansNarrow-Regular.otf",
    "opentype/urw-base35/NimbusRoman-Regular.otf",
    "opentype/urw-base35/NimbusRoman-Italic.otf",
    "opentype/urw-base35/NimbusMonoPS-Regular.otf",
    "opentype/urw-base35/C059-Roman.otf",
    "opentype/urw-base35/P052-Roman.otf",
    "opentype/urw-base35/P052-Bold.otf",
    "opentype/urw-base35/URWBookman-Light.otf",
    "opentype/urw-base35/URWGothic-Book.otf",
    "opentype/urw-base35/URWGothic-Demi.otf",
    "truetype/croscore/Arimo-Regular.ttf",
    "truetype/croscore/Arimo-Bold.ttf",
    "truetype/croscore/Tinos-Regular.ttf",
    "truetype/croscore/Cousine-Regular.ttf",
    "truetype/roboto/unhinted/RobotoTTF/Roboto-Regular.ttf",
    "truetype/roboto/unhinted/RobotoTTF/Roboto-Bold.ttf",
    "truetype/roboto/unhinted/RobotoTTF/Roboto-Italic.ttf",
    "truetype/roboto/unhinted/RobotoTTF/Roboto-Light.ttf",
    "truetype/roboto/unhinted/RobotoCondensed-Regular.ttf",
    "truetype/lato/Lato-Regular.ttf",
    "truetype/lato/Lato-Bold.ttf",
    "truetype/lato/Lato-Italic.ttf",
    "truetype/lato/Lato-Light.ttf",
    "opentype/cantarell/Cantarell-Regular.otf",
    "opentype/cantarell/Cantarell-Bold.otf",
    "truetype/hack/Hack-Regular.ttf",
    "truetype/inconsolata/Inconsolata.otf",
    "truetype/noto/NotoSansMono-Regular.ttf",
]

# Never used for training: Calibri-, Cambria- and Segoe-like families plus the Go fonts.
HELD_OUT_FONTS = [
    "truetype/crosextra/Carlito-Regular.ttf",
    "truetype/crosextra/Carlito-Bold.ttf",
    "truetype/crosextra/Carlito-Italic.ttf",
    "truetype/crosextra/Caladea-Regular.ttf",
    "truetype/crosextra/Caladea-Bold.ttf",
    "truetype/open-sans/OpenSans-Regular.ttf",
    "truetype/open-sans/OpenSans-Bold.ttf",
    "truetype/open-sans/OpenSans-Italic.ttf",
    "fonts-go/Go-Regular.ttf",
    "fonts-go/Go-Mono.ttf",
]

# One flag away (train.py --more-fonts), not in the shipped model: designs the shipped model
# misreads (training/README.md, "Unseen families"): flat-topped 3s, monospaced capitals and
# full stops, rounded and handwriting-like faces, figures drawn old-style. None of these
# families is held out or among those README.md measures with; those not installed are left out.
MORE_TRAIN_FONTS = [
    "truetype/mononoki/mononoki-Regular.ttf",
    "truetype/anonymous-pro/Anonymous Pro.ttf",
    "truetype/fantasque-sans/Normal/TTF/FantasqueSansMono-Regular.ttf",
    "opentype/league-mono/LeagueMono-Regular.otf",
    "truetype/paratype/PTS55F.ttf",
    "truetype/paratype/PTF55F.ttf",
    "truetype/paratype/PTM55F.ttf",
    "truetype/adf/BaskervaldADFStd.otf",
    "truetype/adf/BerenisADFPro-Regular.otf",
    "truetype/adf/UniversalisADFStd-Regular.otf",
    "opentype/mplus/Mplus1-Regular.otf",
    "opentype/mplus/Mplus1Code-Regular.otf",
]
OLD_STYLE = 0.1  # with --more-fonts: the share of lines drawn with the font's old-style figures
RESAMPLED = 0.3  # with --more-fonts: the share of lines resampled as a turned or scaled page's
NARROW_SPACES = 0.25  # with --more-fonts: the share of proportional lines with narrower spaces
SMALLEST_SCALED = 18  # px: text scaled down no smaller (under 16 px spaces blur into letters)

WORD_TEXT = """
the of and to in is for on with as by at from this that be are was it an or not you your we
our all new more one can will about has have if any out up use time price order date total
item items amount due paid tax net gross subtotal balance invoice receipt number account
customer payment bank transfer card cash change discount shipping delivery address street
road avenue city state zip phone email fax page description quantity qty unit rate hours
service product support report summary notes reference terms conditions thank business
company limited office floor suite room north south east west main park lake river hill
monday tuesday wednesday thursday friday saturday sunday january february march april may
june july august september october november december morning evening week month year today
please contact us sale free special open closed hello world text line document scan image
quick brown fox jumps over lazy dog coffee tea water bread milk apple orange lunch dinner
hotel taxi train ticket flight seat gate boarding passenger name first last middle title
manager director engineer sales marketing finance team project plan draft final version
approved signed copy original check valid until issued expires code model serial level
"""
WORDS = WORD_TEXT.split()
NAME_TEXT = "John Mary James Linda Robert Susan Michael Anna David Laura Peter Emma Carlos"
FIRST = NAME_TEXT.split()
SURNAME_TEXT = "Smith Johnson Brown Miller Davis Garcia Wilson Moore Taylor Clark Lewis Young"
LAST = SURNAME_TEXT.split()
MONTHS = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]


def font_paths(names: list[str]) -> list[Path]:
    """Resolve font names under FONT_ROOT, failing loudly so a missing apt package shows."""
    paths = [FONT_ROOT / name for name in names]
    missing = [str(p) for p in paths if not p.exists()]
    if missing:
        raise FileNotFoundError(f"fonts missing (see training/FONTS.md): {missing}")
    return paths


def train_fonts(more: bool = False) -> list[Path]:
    """TRAIN_FONTS, and with MORE the MORE_TRAIN_FONTS that are installed."""
    extra = [FONT_ROOT / name for name in MORE_TRAIN_FONTS if (FONT_ROOT / name).exists()]
    return font_paths(TRAIN_FONTS) + (extra if more else [])


def _word(rng: random.Random) -> str:
    word = rng.choice(WORDS)
    style = rng.random()
    if style < 0.2:
        return word.upper()
    return word.capitalize() if style < 0.5 else word


def number(rng: random.Random) -> str:
    """A number as documents print it: a price, an amount, a date, a time, a share, a phone."""
    kind = rng.randrange(9)
    if kind == 0:
        return f"${rng.randint(0, 9999)}.{rng.randint(0, 99):02d}"
    if kind == 1:
        return f"{rng.randint(1000, 999999):,}.{rng.randint(0, 99):02d}"
    if kind == 2:
        return f"{rng.randint(1, 28):02d}/{rng.randint(1, 12):02d}/{rng.randint(1990, 2035)}"
    if kind == 3:
        return f"{rng.randint(1990, 2035)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
    if kind == 4:
        return f"{rng.choice(MONTHS)} {rng.randint(1, 31)}, {rng.randint(1990, 2035)}"
    if kind == 5:
        return f"{rng.randint(0, 100)}%"
    if kind == 6:
        return f"({rng.randint(200, 999)}) {rng.randint(200, 999)}-{rng.randint(0, 9999):04d}"
    if kind == 7:
        return f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}"
    return str(rng.randint(0, 10 ** rng.randint(1, 7)))


def _invoice_line(rng: random.Random) -> str:
    name = f"{rng.choice(FIRST)} {rng.choice(LAST)}"
    templates = [
        lambda: f"INVOICE {rng.randint(1, 99999)}",
        lambda: f"Invoice #{rng.randint(100, 99999)}",
        lambda: f"Total: ${rng.randint(1, 9999)}.{rng.randint(0, 99):02d}",
        lambda: f"{_word(rng)}: {number(rng)}",
        lambda: f"Qty {rng.randint(1, 99)} x {rng.randint(1, 999)}.{rng.randint(0, 99):02d}",
        lambda: f"{name}, {name.split()[0].lower()}@example.com",
        lambda: f"{rng.randint(1, 9999)} {rng.choice(WORDS).capitalize()} St.",
        lambda: f"Tel: +1 {number(rng)}",
        lambda: f'"{_word(rng)} {_word(rng)}!" - {name}',
        lambda: f"VAT {rng.randint(5, 25)}% = {number(rng)}",
        lambda: f"Date: {number(rng)}",
    ]
    return rng.choice(templates)()


def random_text(rng: random.Random, max_chars: int = 40, realistic: bool = False) -> str:
    """A line of text: random characters (unless realistic), words, numbers or invoice fields."""
    kind = rng.uniform(0.25 if realistic else 0.0, 1.0)
    if kind < 0.25:
        n = rng.randint(1, max(1, max_chars // 2))
        text = "".join(rng.choice(CHARSET) for _ in range(n))
    elif kind < 0.55:
        parts = [_word(rng) if rng.random() < 0.8 else number(rng) for _ in range(8)]
        text = " ".join(parts[: rng.randint(1, 8)])
        text += rng.choice(["", "", "", ".", ",", ":", "!", "?", ";"])
    elif kind < 0.7:
        text = " ".join(number(rng) for _ in range(rng.randint(1, 4)))
    else:
        text = _invoice_line(rng)
    text = clean_text(text[:max_chars])
    # Lines of bare punctuation have no stable height to normalise on; real ones are rare.
    return text if any(c.isalnum() for c in text) else f"{_word(rng)} {text}".strip()


def clean_text(text: str) -> str:
    """Spaces are invisible at the ends and merge when repeated, so labels must not have them."""
    return " ".join(text.split())


@dataclass
class Style:
    """Photometric style of one rendering: levels in 0..255, noise and blur strengths."""

    background: int
    ink: int
    noise: float
    blur: float

    @classmethod
    def sample(cls, rng: random.Random) -> Style:
        background = rng.randint(215, 255) if rng.random() < 0.75 else rng.randint(120, 255)
        ink = rng.randint(0, max(0, background - 90))
        if rng.random() < 0.15:
            background, ink = 255 - background, 255 - ink
        noise = rng.choice([0.0, 0.0, rng.uniform(0, 6), rng.uniform(0, 14)])
        blur = rng.choice([0.0, 0.0, rng.uniform(0.3, 1.1)])
        return cls(background, ink, noise, blur)

    @classmethod
    def sample_document(cls, rng: random.Random) -> Style:
        """Milder: a scanned or exported document rather than a training torture test."""
        background = rng.randint(215, 255) if rng.random() < 0.85 else rng.randint(150, 215)
        ink = rng.randint(0, 70)
        if rng.random() < 0.1:
            background, ink = 255 - background, 255 - ink
        noise = rng.choice([0.0, rng.uniform(0, 5)])
        return cls(background, ink, noise, rng.choice([0.0, 0.0, 0.0, 0.5]))


def draw_mask(
    text: str,
    font: ImageFont.FreeTypeFont,
    stroke: int = 0,
    features: list[str] | None = None,
    space: float = 1.0,
) -> tuple[Image.Image, tuple[int, int, int, int]]:
    """Ink coverage (L, 255 = ink) of one line on a padded canvas, plus its ink bounding box;
    FEATURES are OpenType features to draw with (['onum']: old-style figures), SPACE scales the
    width of the gaps between words (a narrower space than the font's: `narrow_space`)."""
    x0, y0, x1, y1 = font.getbbox(text, stroke_width=stroke, features=features)
    words, starts = [text], [0.0]
    if space != 1.0:  # word by word, each gap narrowed (the default line is drawn whole)
        words, gap = text.split(" "), font.getlength(" ") * space
        for word in words[:-1]:
            starts.append(starts[-1] + font.getlength(word, features=features) + gap)
        x1 = max(x1, int(starts[-1]) + font.getbbox(words[-1] or " ", stroke_width=stroke)[2])
    pad = font.size // 2 + stroke
    mask = Image.new("L", (x1 - x0 + 2 * pad, y1 - y0 + 2 * pad), 0)
    draw = ImageDraw.Draw(mask)
    for start, word in zip(starts, words, strict=True):
        draw.text(
            (pad - x0 + start, pad - y0), word, font=font, fill=255, stroke_width=stroke,
            stroke_fill=255, features=features,
        )  # fmt: skip
    return mask, mask.getbbox() or (0, 0, mask.width, mask.height)


def narrow_space(font: ImageFont.FreeTypeFont, rng: random.Random, share: float) -> float:
    """A share of a proportional font's lines gets word gaps of 0.6-1x its own space: fonts
    differ (Caladea's is 0.22 em, DejaVu's 0.32), and the monospaced fonts' wide gaps between
    letters taught a model to drop the narrow ones (`x 2= $12.50`)."""
    monospaced = font.getlength("i") == font.getlength("m")
    return 1.0 if monospaced or rng.random() >= share else rng.uniform(0.6, 1.0)


def apply_style(mask: Image.Image, style: Style, rng: np.random.Generator) -> np.ndarray:
    """Turn an ink mask into a grey photo-like image: levels, blur, then sensor noise."""
    if style.blur > 0:
        mask = mask.filter(ImageFilter.GaussianBlur(style.blur))
    cover = np.asarray(mask, dtype=np.float32) / 255.0
    gray = style.background + (style.ink - style.background) * cover
    if style.noise > 0:
        gray = gray + rng.normal(0.0, style.noise, gray.shape)
    return np.clip(gray, 0, 255).astype(np.uint8)


@lru_cache(maxsize=4096)
def load_font(path: Path, size: int) -> ImageFont.FreeTypeFont:
    """Font loading costs more than drawing a short line, so fonts are cached per size."""
    return ImageFont.truetype(str(path), size)


def _with_neighbours(
    mask: Image.Image,
    bbox: tuple[int, int, int, int],
    font: ImageFont.FreeTypeFont,
    rng: random.Random,
) -> tuple[Image.Image, tuple[int, int, int, int]]:
    """Add lines above and below so crops also learn to ignore bits of adjacent lines."""
    spacing = int(font.size * rng.uniform(1.1, 1.7))
    canvas = Image.new("L", (mask.width, mask.height + 2 * spacing), 0)
    canvas.paste(mask, (0, spacing))
    draw = ImageDraw.Draw(canvas)
    for y in (bbox[1], bbox[1] + 2 * spacing):
        draw.text((rng.randint(-font.size, font.size), y), random_text(rng), font=font, fill=255)
    x0, y0, x1, y1 = bbox
    return canvas, (x0, y0 + spacing, x1, y1 + spacing)


def _rotate(
    mask: Image.Image, bbox: tuple[int, int, int, int], angle: float
) -> tuple[Image.Image, tuple[int, int, int, int]]:
    """Rotate about the canvas centre and return the rotated ink box of the main line."""
    main = Image.new("L", mask.size, 0)
    main.paste(mask.crop(bbox), bbox[:2])
    main = main.rotate(angle, Image.Resampling.BICUBIC, expand=True)
    rotated = mask.rotate(angle, Image.Resampling.BICUBIC, expand=True)
    return rotated, main.getbbox() or (0, 0, rotated.width, rotated.height)


def _crop_box(bbox: tuple[int, int, int, int], rng: random.Random) -> tuple[int, int, int, int]:
    """Margins around the ink box: mostly like the handler's, sometimes tight or loose."""
    x0, y0, x1, y1 = bbox
    h = y1 - y0
    roll = rng.random()
    lo, hi = (0.0, 0.05) if roll < 0.1 else (0.3, 0.7) if roll < 0.2 else (0.05, 0.3)
    top, bottom = (int(h * rng.uniform(lo, hi)) for _ in range(2))
    left, right = (int(h * rng.uniform(lo, hi * 1.5)) for _ in range(2))
    return x0 - left, y0 - top, x1 + right, y1 + bottom


def render_line(
    rng: random.Random,
    fonts: list[Path],
    text: str | None = None,
    old_style: float = 0.0,
    resampled: float = 0.0,
    narrow: float = 0.0,
) -> tuple[np.ndarray, str]:
    """One augmented training line: a grey uint8 crop (any polarity) and its label; a share
    `old_style` of lines is drawn with old-style figures where the font has them, a share
    `resampled` as the handler cuts it from a turned or scaled page (`_resampled`), a share
    `narrow` of a proportional font's with narrower spaces than its own (`narrow_space`)."""
    text = text or random_text(rng)
    font = load_font(rng.choice(fonts), rng.randint(16, 52))
    stroke = 1 if font.size >= 28 and rng.random() < 0.1 else 0
    features = ["onum"] if old_style and rng.random() < old_style else None
    space = narrow_space(font, rng, narrow) if narrow else 1.0
    mask, bbox = draw_mask(text, font, stroke, features, space)
    if rng.random() < 0.3:
        mask, bbox = _with_neighbours(mask, bbox, font, rng)
    if rng.random() < 0.5:
        mask, bbox = _rotate(mask, bbox, rng.uniform(-2.0, 2.0))
    crop = mask.crop(_crop_box(bbox, rng))
    style = Style.sample(rng)
    gray = apply_style(crop, style, np.random.default_rng(rng.getrandbits(32)))
    if resampled and rng.random() < resampled:
        gray = _resampled(gray, style.background, font.size, rng)
    return gray, text


def _resampled(gray: np.ndarray, paper: int, size: int, rng: random.Random) -> np.ndarray:
    """The crop as it reaches the model from a page resampled before the handler cut it: turned
    (a photo or scan at an angle) and levelled back by the handler's deskew, two bicubic
    rotations that soften every stroke and narrow the gaps between words; or scaled down (a
    page sent smaller than it was drawn), no smaller than SMALLEST_SCALED px. A model that
    only saw crisp lines dropped spaces on such pages (`2025.Reference`)."""
    image = Image.fromarray(gray)
    if size * 0.9 <= SMALLEST_SCALED or rng.random() < 0.5:
        angle = rng.uniform(0.5, 3.0) * rng.choice((-1, 1))
        turned = image.rotate(angle, Image.Resampling.BICUBIC, expand=True, fillcolor=paper)
        level = turned.rotate(-angle, Image.Resampling.BICUBIC, expand=True, fillcolor=paper)
        left, top = (level.width - image.width) // 2, (level.height - image.height) // 2
        image = level.crop((left, top, left + image.width, top + image.height))
    else:
        scale = rng.uniform(SMALLEST_SCALED / size, 0.9)
        shape = (max(1, round(image.width * scale)), max(1, round(image.height * scale)))
        kind = rng.choice([Image.Resampling.BILINEAR, Image.Resampling.BICUBIC,
                           Image.Resampling.LANCZOS, Image.Resampling.BOX])  # fmt: skip
        image = image.resize(shape, kind)
    return np.asarray(image, dtype=np.uint8)


@dataclass
class Page:
    """A rendered page and, per line, its text and ink box (x0, y0, x1, y1)."""

    image: Image.Image
    texts: list[str]
    boxes: list[tuple[int, int, int, int]]


def render_page(
    rng: random.Random,
    fonts: list[Path],
    texts: list[str],
    size: int | None = None,
    style: Style | None = None,
    sizes: tuple[int, int] = (20, 40),
) -> Page:
    """Lines in one font at a text height (font px size) of SIZES (20-40), with uneven
    margins and indents and line spacing of 1.3-2.0 x the text height."""
    font = load_font(rng.choice(fonts), size or rng.randint(*sizes))
    spacing = int(font.size * rng.uniform(1.3, 2.0))
    left, top = rng.randint(4, 6 * font.size), rng.randint(4, 4 * font.size)
    indents = [rng.randint(0, 4 * font.size) if rng.random() < 0.4 else 0 for _ in texts]
    widths = [int(font.getlength(t)) for t in texts]
    width = left + max(i + w for i, w in zip(indents, widths, strict=True))
    width += rng.randint(4, 6 * font.size)
    height = top + spacing * len(texts) + rng.randint(4, 4 * font.size)
    mask = Image.new("L", (width, height), 0)
    draw = ImageDraw.Draw(mask)
    boxes = []
    for i, (text, indent) in enumerate(zip(texts, indents, strict=True)):
        origin = (left + indent, top + i * spacing)
        draw.text(origin, text, font=font, fill=255)
        boxes.append(draw.textbbox(origin, text, font=font))
    style = style or Style.sample_document(rng)
    gray = apply_style(mask, style, np.random.default_rng(rng.getrandbits(32)))
    return Page(Image.fromarray(gray), texts, [tuple(map(int, b)) for b in boxes])
