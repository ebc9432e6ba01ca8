"""Stress the OCR function with pages the held-out test set does not have: uneven lighting,
low contrast, heavy noise, JPEG artefacts, two columns, colour of the paper's brightness,
old-style figures, small text. Prints the character error rate per condition.

Pages hold 4-10 lines of realistic text in one font at a text height (font px size) of 20-36
(14-17 for noise on small text, 10-13 for small text: screenshots and scans at 96-150 dpi),
from the held-out fonts and the families on this machine
neither split uses (FONTS.md); every condition renders the same texts, fonts and sizes (one
seed), so the rows compare. A page's CER is the edit distance between the lines read, in
order, and the lines drawn, in reading order (a two-column page: the left column, then the
right one), over the characters drawn.

    python functions/ocr/training/stress.py                  # handler + onnxruntime here
    python functions/ocr/training/stress.py --url http://127.0.0.1:8080
    python functions/ocr/training/stress.py --time           # + ms of preprocess per page
    python functions/ocr/training/stress.py --sizes 10 12 14 16  # clean pages per text size
"""

from __future__ import annotations

import argparse
import colorsys
import io
import math
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

OCR_DIR = Path(__file__).resolve().parents[1]
# Not OCR_DIR: the handler is imported as edgeserve imports it (evaluate.ocr_handler), so its
# modules (lines, noise, ...) are not offered to the rest of a process importing this one.
sys.path[:0] = [str(OCR_DIR / "training"), str(OCR_DIR.parents[1])]

import evaluate  # noqa: E402
import synth  # noqa: E402

# Families neither TRAIN_FONTS nor HELD_OUT_FONTS has; those not installed are left out.
UNSEEN_FONTS = [
    "truetype/noto/NotoSans-Regular.ttf",
    "truetype/noto/NotoSerif-Regular.ttf",
    "opentype/linux-libertine/LinLibertine_R.otf",
    "opentype/linux-libertine/LinBiolinum_R.otf",
    "opentype/comic-neue/ComicNeue-Regular.otf",
    "opentype/ebgaramond/EBGaramond12-Regular.otf",
    "truetype/firacode/FiraCode-Regular.ttf",
]
# Fonts whose OpenType 'onum' feature draws old-style figures (EB Garamond's by default).
OLD_STYLE_FONTS = [
    "truetype/crosextra/Carlito-Regular.ttf",
    "truetype/open-sans/OpenSans-Regular.ttf",
    "truetype/noto/NotoSerif-Regular.ttf",
    "opentype/linux-libertine/LinLibertine_R.otf",
    "opentype/linux-libertine/LinBiolinum_R.otf",
    "opentype/ebgaramond/EBGaramond12-Regular.otf",
]


def installed(names: list[str]) -> list[Path]:
    return [synth.FONT_ROOT / name for name in names if (synth.FONT_ROOT / name).exists()]


@dataclass
class Layout:
    """Text drawn as ink coverage (L, 255 = ink) and its lines in reading order."""

    mask: Image.Image
    texts: list[str]


def lay_out(
    rng: random.Random, font: Path, size: int, columns: int = 1, features: list[str] | None = None
) -> Layout:
    """4-10 lines in one font, or 6-12 lines of running text per column wrapped at 13-20 x
    the text height (26-40 characters), the last column up to 3 lines shorter; columns sit
    side by side with a gutter of 1.5-3 text heights, their lines at the same heights (the
    hardest case for row profiles)."""
    face = synth.load_font(font, size)
    if columns == 1:
        texts = [[line(rng, 40) for _ in range(rng.randint(4, 10))]]
    else:
        rows, measure = rng.randint(6, 12), size * rng.uniform(13, 20)
        texts = [wrapped(rng, face, measure, rows, features) for _ in range(columns)]
        texts[-1] = texts[-1][: rows - rng.randint(0, 3)]
    spacing = int(size * rng.uniform(1.3, 1.8))
    gutter = int(size * rng.uniform(1.5, 3.0))
    widths = [max(int(face.getlength(t, features=features)) for t in col) for col in texts]
    left, top = rng.randint(size, 4 * size), rng.randint(size, 3 * size)
    width = left + sum(widths) + gutter * (columns - 1) + rng.randint(size, 4 * size)
    rows = max(len(col) for col in texts)
    mask = Image.new("L", (width, top + spacing * rows + rng.randint(size, 3 * size)), 0)
    draw = ImageDraw.Draw(mask)
    x = left
    for col, col_width in zip(texts, widths, strict=True):
        for i, text in enumerate(col):
            draw.text((x, top + i * spacing), text, font=face, fill=255, features=features)
        x += col_width + gutter
    return Layout(mask, [t for col in texts for t in col])


def line(rng: random.Random, chars: int) -> str:
    """Realistic text of CHARS / 2 to CHARS characters (synth.random_text)."""
    return synth.random_text(rng, rng.randint(chars // 2, chars), realistic=True)


def wrapped(
    rng: random.Random, face: Any, measure: float, rows: int, features: list[str] | None
) -> list[str]:
    """ROWS lines of running text (realistic words and numbers), wrapped at MEASURE px."""
    lines: list[str] = []
    words: list[str] = []
    while len(lines) < rows:
        for word in line(rng, 40).split():
            if words and face.getlength(" ".join([*words, word]), features=features) > measure:
                lines.append(" ".join(words))
                words = []
            words.append(word)
    return lines[:rows]


Photo = Callable[[np.ndarray, random.Random], np.ndarray]  # coverage 0..1 -> grey 0..255


def document(cover: np.ndarray, rng: random.Random) -> np.ndarray:
    paper, ink = rng.randint(225, 255), rng.randint(0, 60)
    return paper + (ink - paper) * cover


def lit(light: np.ndarray) -> Photo:
    """The document under LIGHT (a factor per pixel): paper and ink darken alike."""
    return lambda cover, rng: document(cover, rng) * light


def gradient(shape: tuple[int, int], rng: random.Random) -> np.ndarray:
    """Light falling from 1.0 to 0.25-0.45 across the page, in a random direction."""
    h, w = shape
    angle = rng.uniform(0, 2 * math.pi)
    ys, xs = np.mgrid[0:h, 0:w].astype(np.float32)
    along = xs * math.cos(angle) + ys * math.sin(angle)
    along = (along - along.min()) / max(1.0, float(along.max() - along.min()))
    return 1.0 - (1.0 - rng.uniform(0.25, 0.45)) * along


def vignette(shape: tuple[int, int], rng: random.Random) -> np.ndarray:
    """A phone's vignette: 1.0 near a point close to the centre, 0.35-0.5 in the far corner."""
    h, w = shape
    cy, cx = h * rng.uniform(0.35, 0.65), w * rng.uniform(0.35, 0.65)
    ys, xs = np.mgrid[0:h, 0:w].astype(np.float32)
    r2 = ((ys - cy) ** 2 + (xs - cx) ** 2) / max(cy, h - cy, cx, w - cx) ** 2 / 2
    return 1.0 - rng.uniform(0.5, 0.65) * r2 / max(1e-6, float(r2.max()))


def shadow(shape: tuple[int, int], rng: random.Random) -> np.ndarray:
    """A soft-edged shadow (a hand, a phone) over a part of the page: light 0.3-0.5 there."""
    h, w = shape
    angle = rng.uniform(0, 2 * math.pi)
    ys, xs = np.mgrid[0:h, 0:w].astype(np.float32)
    along = (xs - w * rng.uniform(0.3, 0.7)) * math.cos(angle)
    along += (ys - h * rng.uniform(0.3, 0.7)) * math.sin(angle)
    edge = max(2.0, 0.03 * max(h, w))
    inside = 1.0 / (1.0 + np.exp(np.clip(along / edge, -30, 30)))
    return 1.0 - (1.0 - rng.uniform(0.3, 0.5)) * inside


def low_contrast(
    cover: np.ndarray, rng: random.Random, levels: tuple[int, int] = (22, 40), noise: float = 1.5
) -> np.ndarray:
    """Grey text on light grey: LEVELS (22-40) apart, with NOISE."""
    paper = rng.randint(190, 235)
    return (
        paper
        - rng.randint(*levels) * cover
        + np.random.default_rng(rng.getrandbits(32)).normal(0, noise, cover.shape)
    )


def salt_and_pepper(cover: np.ndarray, rng: random.Random) -> np.ndarray:
    gray = document(cover, rng)
    noise = np.random.default_rng(rng.getrandbits(32)).random(cover.shape)
    density = rng.uniform(0.03, 0.06)
    gray[noise < density / 2] = 0
    gray[noise > 1 - density / 2] = 255
    return gray


def gaussian(
    cover: np.ndarray, rng: random.Random, low: float = 20, high: float = 35
) -> np.ndarray:
    sigma = rng.uniform(low, high)
    return document(cover, rng) + np.random.default_rng(rng.getrandbits(32)).normal(
        0, sigma, cover.shape
    )


def equal_brightness(rng: random.Random) -> tuple[np.ndarray, np.ndarray]:
    """Paper and ink colours of about the same luminance (within 3 levels), hues >= 90 deg
    apart: red on green, blue on orange, ..."""
    weights = np.array([0.299, 0.587, 0.114])
    while True:
        hue = rng.random()
        paper = np.array(colorsys.hsv_to_rgb(hue, rng.uniform(0.4, 0.8), rng.uniform(0.6, 0.9)))
        ink = np.array(
            colorsys.hsv_to_rgb((hue + rng.uniform(0.25, 0.75)) % 1, rng.uniform(0.6, 1.0), 1.0)
        )
        ink *= float(paper @ weights) / float(ink @ weights)
        if ink.max() <= 1.0:
            return paper * 255, ink * 255


def render(rng: random.Random, condition: str, font: Path, size: int) -> tuple[bytes, list[str]]:
    """One page of CONDITION: its image file and its lines in reading order."""
    features = ["onum"] if condition == "old-style figures" else ["lnum"]
    layout = lay_out(rng, font, size, 2 if condition == "two columns" else 1, features)
    mask = layout.mask.filter(ImageFilter.GaussianBlur(0.4))
    cover = np.asarray(mask, dtype=np.float32) / 255
    shape = (cover.shape[0], cover.shape[1])
    if condition == "colour, equal brightness":
        paper, ink = equal_brightness(rng)
        rgb = paper + (ink - paper) * cover[..., np.newaxis]
        return encode(Image.fromarray(np.clip(rgb, 0, 255).astype(np.uint8))), layout.texts
    photos: dict[str, Callable[[], Photo]] = {
        "gradient": lambda: lit(gradient(shape, rng)),
        "vignette": lambda: lit(vignette(shape, rng)),
        "shadow": lambda: lit(shadow(shape, rng)),
        "low contrast": lambda: low_contrast,
        "low contrast, noise": lambda: lambda cover, rng: low_contrast(cover, rng, (14, 22), 3),
        "salt and pepper": lambda: salt_and_pepper,
        "gaussian noise": lambda: gaussian,
        "noise, small text": lambda: lambda cover, rng: gaussian(cover, rng, 12, 25),
        "phone photo": lambda: lit(vignette(shape, rng) * shadow(shape, rng)),
    }
    photo = photos.get(condition, lambda: document)()
    gray = np.clip(photo(cover, rng), 0, 255).astype(np.uint8)
    image = Image.fromarray(gray)
    if condition == "jpeg":
        return encode(image, quality=rng.randint(8, 15)), layout.texts
    if condition == "phone photo":
        noisy = gray + np.random.default_rng(rng.getrandbits(32)).normal(0, 6, gray.shape)
        image = Image.fromarray(np.clip(noisy, 0, 255).astype(np.uint8))
        return encode(image, quality=50), layout.texts
    return encode(image), layout.texts


def encode(image: Image.Image, quality: int | None = None) -> bytes:
    buffer = io.BytesIO()
    if quality is None:
        image.save(buffer, format="PNG")
    else:
        image.save(buffer, format="JPEG", quality=quality)
    return buffer.getvalue()


CONDITIONS = [
    "clean",
    "gradient",
    "vignette",
    "shadow",
    "phone photo",
    "low contrast",
    "low contrast, noise",
    "salt and pepper",
    "gaussian noise",
    "noise, small text",
    "jpeg",
    "two columns",
    "colour, equal brightness",
    "old-style figures",
    "small text",
]
# Conditions drawn small: their text sizes are the 4 from this one.
SMALL_SIZES = {"noise, small text": 14, "small text": 10}


def pages(
    condition: str, n_pages: int, seed: int, size: int | None = None
) -> list[tuple[bytes, list[str]]]:
    """N_PAGES pages of CONDITION (at text SIZE if given); the fonts, sizes and texts depend
    on SEED only."""
    fonts = installed(OLD_STYLE_FONTS if condition == "old-style figures" else [])
    fonts = fonts or [*synth.font_paths(synth.HELD_OUT_FONTS), *installed(UNSEEN_FONTS)]
    rng = random.Random(seed)
    out = []
    for _ in range(n_pages):
        font, drawn = rng.choice(fonts), rng.randint(20, 36)
        if condition in SMALL_SIZES:
            drawn = SMALL_SIZES[condition] + drawn % 4
        out.append(render(random.Random(rng.getrandbits(32)), condition, font, size or drawn))
    return out


def page_cer(recognize: evaluate.Recognize, page: tuple[bytes, list[str]]) -> tuple[int, int]:
    """Edit distance of the lines read (in order) to the lines drawn, and the characters drawn."""
    data, texts = page
    read = [synth.clean_text(line) for line in recognize(data)["text"].split("\n")]
    truth = "\n".join(texts)
    return evaluate.edit_distance("\n".join(t for t in read if t), truth), len(truth)


def stress(
    recognize: evaluate.Recognize, n_pages: int = 16, seed: int = 5, only: list[str] | None = None
) -> dict[str, float]:
    """CER per condition over N_PAGES pages each."""
    return {c: cer(recognize, pages(c, n_pages, seed)) for c in only or CONDITIONS}


def sweep(
    recognize: evaluate.Recognize, sizes: list[int], n_pages: int = 16, seed: int = 5
) -> dict[int, float]:
    """CER of clean pages per text size (px), over N_PAGES pages each."""
    return {size: cer(recognize, pages("clean", n_pages, seed, size)) for size in sizes}


def cer(recognize: evaluate.Recognize, drawn: list[tuple[bytes, list[str]]]) -> float:
    """Edit distance over characters drawn, summed over the pages DRAWN."""
    errors = chars = 0
    for page in drawn:
        e, c = page_cer(recognize, page)
        errors, chars = errors + e, chars + c
    return errors / max(1, chars)


def preprocess_ms(datas: list[bytes], repeat: int = 3) -> float:
    """Median over REPEAT rounds of the mean wall time of handler.preprocess per page."""
    handler = evaluate.ocr_handler()
    rounds = []
    for _ in range(repeat):
        start = time.perf_counter()
        for data in datas:
            ctx = SimpleNamespace(content_type="image/png", options={}, root=OCR_DIR, state={})
            handler.preprocess(data, ctx)
        rounds.append((time.perf_counter() - start) / len(datas) * 1000)
    return sorted(rounds)[len(rounds) // 2]


def page_parser(doc: str, pages: int, seed: int, conditions: list[str]) -> argparse.ArgumentParser:
    """The options this tool and documents.py share: what reads, how many pages, which."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--url", help="a running function, e.g. http://127.0.0.1:8080")
    parser.add_argument("--model", type=Path, default=OCR_DIR / "model.onnx")
    parser.add_argument("--pages", type=int, default=pages, help="pages per condition")
    parser.add_argument("--seed", type=int, default=seed)
    parser.add_argument("--only", nargs="+", choices=conditions, help="these conditions only")
    return parser


def recognizer(args: argparse.Namespace) -> evaluate.Recognize:
    """The running function at --url, else the handler and --model here."""
    if args.url:
        return evaluate.url_recognizer(args.url)
    return evaluate.inprocess_recognizer(args.model)


def main() -> None:
    parser = page_parser(__doc__, 16, 5, CONDITIONS)
    parser.add_argument("--time", action="store_true", help="also ms of preprocess per page")
    parser.add_argument("--sizes", type=int, nargs="+", help="only clean pages at these px")
    args = parser.parse_args()
    recognize = recognizer(args)
    if args.sizes:
        for size, figure in sweep(recognize, args.sizes, args.pages, args.seed).items():
            print(f"{f'clean, {size} px':>26}: CER {100 * figure:6.2f} %", flush=True)
        return
    for condition, figure in stress(recognize, args.pages, args.seed, args.only).items():
        print(f"{condition:>26}: CER {100 * figure:6.2f} %", flush=True)
    if args.time:
        samples = [p.read_bytes() for p in sorted((OCR_DIR / "samples").glob("*.png"))]
        print(f"preprocess, samples/*.png: {preprocess_ms(samples, 9):.2f} ms per page")
        for condition in args.only or CONDITIONS:
            datas = [data for data, _ in pages(condition, args.pages, args.seed)]
            print(f"preprocess, {condition}: {preprocess_ms(datas):.2f} ms per page")


if __name__ == "__main__":
    main()
