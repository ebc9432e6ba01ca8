"""Regenerate samples/: example pages in held-out fonts, each with a .txt of its lines.

python functions/ocr/training/make_samples.py
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

OCR_DIR = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(OCR_DIR / "training"))

import synth  # noqa: E402

CLEAN = synth.Style(background=255, ink=0, noise=0.0, blur=0.0)
SAMPLES: list[tuple[str, str, int, synth.Style, list[str]]] = [
    ("invoice_title", "truetype/crosextra/Carlito-Bold.ttf", 36, CLEAN, ["INVOICE 2041"]),
    (
        "invoice_total",
        "truetype/crosextra/Carlito-Regular.ttf",
        30,
        CLEAN,
        ["INVOICE 2041", "Total: $318.40"],
    ),
    (
        "receipt",
        "truetype/open-sans/OpenSans-Regular.ttf",
        24,
        synth.Style(background=242, ink=30, noise=3.0, blur=0.0),
        [
            "ACME Office Supplies",
            "123 Main Street, Springfield",
            "Date: 2024-03-15 10:42",
            "Paper A4 x 2 = $12.50",
            "Toner (black) $64.99",
            "Total: $77.49",
        ],
    ),
    (
        "inverted",
        "truetype/crosextra/Caladea-Bold.ttf",
        32,
        synth.Style(background=20, ink=235, noise=2.0, blur=0.0),
        ["Order #58213 shipped", "Thank you!"],
    ),
    (
        "letter",
        "truetype/crosextra/Caladea-Regular.ttf",
        26,
        synth.Style(background=225, ink=45, noise=4.0, blur=0.5),
        [
            "Dear Ms. Garcia,",
            "your payment of $1,250.00 was received",
            "on March 3, 2025. Reference: PAY-77/B",
            "Kind regards, Accounts Team",
        ],
    ),
    ("phone", "fonts-go/Go-Mono.ttf", 22, CLEAN, ["Tel: +1 (555) 019-2834"]),
]


def main() -> None:
    out = OCR_DIR / "samples"
    out.mkdir(exist_ok=True)
    for i, (stem, font, size, style, lines) in enumerate(SAMPLES):
        assert font in synth.HELD_OUT_FONTS, f"{font} is a training font"
        rng = random.Random(100 + i)
        page = synth.render_page(rng, synth.font_paths([font]), lines, size=size, style=style)
        page.image.save(out / f"{stem}.png", optimize=True)
        (out / f"{stem}.txt").write_text("\n".join(lines) + "\n")
        print(f"{stem}.png {page.image.size}")


if __name__ == "__main__":
    main()
