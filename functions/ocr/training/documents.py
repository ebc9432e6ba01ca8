"""Read documents a user would send, in families neither font split has: a till receipt in a
monospaced font, an invoice in a serif, a scan at 150-300 dpi, a phone photo (perspective,
uneven light, JPEG quality 40-85), white on dark, coloured paper and two columns. Prints the
CER per condition (stress.page_cer: the lines read, in order, against the lines drawn).

Text heights are those of the document, not of a training set: 14-22 px on a receipt, 16-26
on an invoice, 10-12 pt at 150-300 dpi (21-50 px) on a scan. Each page draws its font from
the condition's families (`FAMILIES`, those installed: training/README.md lists the apt
packages); one seed for all.

    python functions/ocr/training/documents.py                # handler + onnxruntime here
    python functions/ocr/training/documents.py --pages 8 --only receipt invoice
"""

from __future__ import annotations

import random
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

OCR_DIR = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(OCR_DIR / "training"), str(OCR_DIR.parents[1])]

import evaluate  # noqa: E402
import stress  # noqa: E402
import synth  # noqa: E402

# Families in no split (nor a clone of one), by design; files under synth.FONT_ROOT.
FAMILIES = {
    "serif": [
        "truetype/gentiumplus/GentiumPlus-Regular.ttf",
        "truetype/charis/CharisSIL-Regular.ttf",
        "opentype/linux-libertine/LinLibertine_R.otf",
        "truetype/noto/NotoSerif-Regular.ttf",
        "opentype/roboto/slab/RobotoSlab-Regular.otf",
    ],
    "sans": [
        "opentype/inter/Inter-Regular.otf",
        "truetype/noto/NotoSans-Regular.ttf",
        "truetype/oxygen/Oxygen-Sans.ttf",
        "opentype/cabin/Cabin-Regular.otf",
        "truetype/andika/Andika-Regular.ttf",
        "opentype/league-spartan/LeagueSpartan-Regular.otf",
        "truetype/comfortaa/Comfortaa-Regular.ttf",
        "opentype/comic-neue/ComicNeue-Regular.otf",
    ],
    "mono": [
        "truetype/jetbrains-mono/JetBrainsMono-Regular.ttf",
        "truetype/firacode/FiraCode-Regular.ttf",
        "opentype/courier-prime/Courier Prime.otf",
        "truetype/oxygen/OxygenMono-Regular.ttf",
        "opentype/b612/B612Mono-Regular.otf",
    ],
}
Rows = list[list[tuple[str, float]]]  # per row, its cells: (text, x as a share of the measure)


def receipt(rng: random.Random) -> Rows:
    """A till receipt: shop, date, items with their prices at the right edge, totals."""
    items = [[(f"{rng.randint(1, 3)} {stress.line(rng, 16)[:16]}", 0.0), (price(rng), 0.8)]]
    for _ in range(rng.randint(3, 8)):
        items.append([(stress.line(rng, 18)[:18].upper(), 0.0), (price(rng), 0.8)])
    head = [[(f"{rng.choice(synth.LAST).upper()} MARKET", 0.25)], [(synth.number(rng), 0.0)]]
    tail = [[("SUBTOTAL", 0.0), (price(rng), 0.8)], [("TOTAL", 0.0), (price(rng), 0.8)]]
    return [*head, *items, *tail, [(f"CARD {rng.randint(1000, 9999)}", 0.0)]]


def invoice(rng: random.Random) -> Rows:
    """An invoice: sender and number, a table of description, quantity and amount, totals."""
    rows: Rows = [[(f"Invoice #{rng.randint(100, 99999)}", 0.0), (synth.number(rng), 0.6)]]
    rows += [[(stress.line(rng, 30), 0.0)] for _ in range(rng.randint(1, 3))]
    rows.append([("Description", 0.0), ("Qty", 0.5), ("Amount", 0.7)])
    for _ in range(rng.randint(2, 6)):
        rows.append([(stress.line(rng, 22)[:22], 0.0), (str(rng.randint(1, 20)), 0.5)])
        rows[-1].append((price(rng), 0.7))
    return [*rows, [("Total due", 0.45), (price(rng), 0.7)]]


def price(rng: random.Random) -> str:
    return f"{rng.choice(['', '', '$'])}{rng.randint(0, 999)}.{rng.randint(0, 99):02d}"


def running_text(rng: random.Random) -> Rows:
    return [[(stress.line(rng, 40), 0.0)] for _ in range(rng.randint(4, 10))]


def draw_rows(rows: Rows, font: Path, size: int, rng: random.Random) -> stress.Layout:
    """ROWS drawn as ink coverage, cells at their share of a measure of 26-34 text heights;
    a row's truth is its cells joined by a space, as the handler joins a line's pieces."""
    face = synth.load_font(font, size)
    rows = [[(synth.clean_text(t), x) for t, x in row if synth.clean_text(t)] for row in rows]
    measure = size * rng.uniform(26, 34)
    spacing = int(size * rng.uniform(1.3, 1.7))
    left, top = rng.randint(size, 3 * size), rng.randint(size, 3 * size)
    right = max(left + x * measure + face.getlength(t) for row in rows for t, x in row)
    width, height = int(right) + rng.randint(size, 3 * size), top + spacing * len(rows) + size
    mask = Image.new("L", (width, height), 0)
    draw = ImageDraw.Draw(mask)
    for i, row in enumerate(rows):
        for text, x in row:
            draw.text((left + x * measure, top + i * spacing), text, font=face, fill=255)
    return stress.Layout(mask, [" ".join(t for t, _ in row) for row in rows])


def on_paper(cover: np.ndarray, paper: np.ndarray, ink: np.ndarray) -> Image.Image:
    """RGB page: PAPER where COVER is 0, INK where it is 1."""
    rgb = paper + (ink - paper) * cover[..., np.newaxis]
    return Image.fromarray(np.clip(rgb, 0, 255).astype(np.uint8))


def scanned(image: Image.Image, rng: random.Random) -> Image.Image:
    """A flatbed scan: tilted up to 1 degree, soft, with sensor noise."""
    tilted = image.rotate(rng.uniform(-1, 1), Image.Resampling.BICUBIC, expand=True, fillcolor=255)
    soft = np.asarray(tilted.filter(ImageFilter.GaussianBlur(rng.uniform(0.4, 0.9))), np.float32)
    noise = np.random.default_rng(rng.getrandbits(32)).normal(0, rng.uniform(2, 6), soft.shape)
    return Image.fromarray(np.clip(soft + noise, 0, 255).astype(np.uint8))


def photographed(image: Image.Image, rng: random.Random) -> Image.Image:
    """A phone photo of the page filling the frame: its corners pulled in by up to 6 % (the
    phone not quite parallel), vignette and shadow, sensor noise (JPEG comes after)."""
    w, h = image.size
    corners = [(0, 0), (0, h), (w, h), (w, 0)]
    moved = [
        (x + rng.uniform(-0.06, 0.06) * w, y + rng.uniform(-0.06, 0.06) * h) for x, y in corners
    ]
    quad = [c for point in moved for c in point]
    paper = int(np.percentile(np.asarray(image), 90))
    image = image.transform(
        image.size, Image.Transform.QUAD, quad, Image.Resampling.BICUBIC, fillcolor=paper
    )
    light = stress.vignette((h, w), rng) * stress.shadow((h, w), rng)
    gray = np.asarray(image, np.float32) * light
    gray += np.random.default_rng(rng.getrandbits(32)).normal(0, 4, gray.shape)
    return Image.fromarray(np.clip(gray, 0, 255).astype(np.uint8))


PASTELS = [(255, 246, 200), (214, 234, 255), (255, 220, 228), (220, 245, 220), (236, 226, 255)]
INKS = [(0, 0, 0), (20, 30, 110), (120, 10, 10), (0, 70, 30), (60, 60, 60)]


def page(condition: str, rng: random.Random) -> tuple[bytes, list[str]]:
    """One page of CONDITION: its image file and its lines in reading order."""
    kinds: dict[str, tuple[str, Callable[[random.Random], Rows], tuple[int, int]]] = {
        "receipt, mono": ("mono", receipt, (14, 22)),
        "invoice, serif": ("serif", invoice, (16, 26)),
        "scan, 150-300 dpi": ("all", running_text, (21, 50)),
        "phone photo": ("all", running_text, (20, 36)),
        "white on dark": ("all", running_text, (16, 36)),
        "coloured paper": ("all", invoice, (16, 30)),
    }
    family, rows, sizes = kinds.get(condition, ("all", running_text, (18, 32)))
    fonts = fonts_of(family)
    font, size = rng.choice(fonts), rng.randint(*sizes)
    if condition == "two columns":
        layout = stress.lay_out(rng, font, size, columns=2)
    else:
        layout = draw_rows(rows(rng), font, size, rng)
    cover = np.asarray(layout.mask.filter(ImageFilter.GaussianBlur(0.4)), np.float32) / 255
    grey = np.full(3, rng.randint(225, 255), np.float32)
    if condition == "white on dark":
        image = on_paper(cover, np.array(rng.choice(INKS), np.float32), grey).convert("L")
    elif condition == "coloured paper":
        paper, ink = (np.array(rng.choice(c), np.float32) for c in (PASTELS, INKS))
        return stress.encode(on_paper(cover, paper, ink)), layout.texts
    else:
        image = on_paper(cover, grey, np.full(3, rng.randint(0, 60), np.float32)).convert("L")
    if condition == "scan, 150-300 dpi":
        image = scanned(image, rng)
    if condition == "phone photo":
        return stress.encode(photographed(image, rng), rng.randint(40, 85)), layout.texts
    return stress.encode(image), layout.texts


def fonts_of(family: str) -> list[Path]:
    names = [n for f in FAMILIES.values() for n in f] if family == "all" else FAMILIES[family]
    return stress.installed(names) or synth.font_paths(synth.HELD_OUT_FONTS)


CONDITIONS = [
    "receipt, mono",
    "invoice, serif",
    "scan, 150-300 dpi",
    "phone photo",
    "white on dark",
    "coloured paper",
    "two columns",
]


def documents(
    recognize: evaluate.Recognize, n_pages: int = 12, seed: int = 11, only: list[str] | None = None
) -> dict[str, float]:
    """CER per condition over N_PAGES pages each."""
    figures = {}
    for condition in only or CONDITIONS:
        rng = random.Random(seed)
        drawn = [page(condition, random.Random(rng.getrandbits(32))) for _ in range(n_pages)]
        figures[condition] = stress.cer(recognize, drawn)
    return figures


def main() -> None:
    args = stress.page_parser(__doc__, 12, 11, CONDITIONS).parse_args()
    figures = documents(stress.recognizer(args), args.pages, args.seed, args.only)
    for condition, figure in figures.items():
        print(f"{condition:>20}: CER {100 * figure:6.2f} %", flush=True)


if __name__ == "__main__":
    main()
