"""The OCR function on documents in fonts the model never saw: a lone bold word with its dots,
an invoice's table, a till receipt in monospaced fonts (served over HTTP, as users call it)."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import httpx
import pytest
from PIL import Image, ImageDraw

from tests.server import served

OCR = Path(__file__).resolve().parents[1] / "functions" / "ocr"
sys.path.insert(0, str(OCR / "training"))

import synth  # noqa: E402

# Installed by scripts/system-deps.sh (fonts-dejavu-core, fonts-b612, the held-out fonts).
FONTS = {
    "Carlito-Bold": "truetype/crosextra/Carlito-Bold.ttf",
    "DejaVuSerif-Bold": "truetype/dejavu/DejaVuSerif-Bold.ttf",
    "Caladea": "truetype/crosextra/Caladea-Regular.ttf",
    "DejaVuSansMono": "truetype/dejavu/DejaVuSansMono.ttf",
    "GoMono": "fonts-go/Go-Mono.ttf",
    "B612Mono": "opentype/b612/B612Mono-Regular.otf",
}


@pytest.fixture(scope="module")
def ocr_url():
    with served(OCR) as url:
        yield url


def read(url: str, rows: list[list[tuple[str, int]]], font: str, px: int) -> str:
    """The text the function reads from ROWS of (text, x) cells drawn in FONT at PX."""
    face = synth.load_font(synth.font_paths([FONTS[font]])[0], px)
    width = max(x + int(face.getlength(t)) for row in rows for t, x in row) + 2 * px
    page = Image.new("L", (width, (len(rows) + 2) * 2 * px), 255)
    draw = ImageDraw.Draw(page)
    for i, row in enumerate(rows):
        for text, x in row:
            draw.text((x, px * (2 + 2 * i)), text, font=face, fill=0)
    buffer = io.BytesIO()
    page.save(buffer, format="PNG")
    reply = httpx.post(
        f"{url}/invoke",
        content=buffer.getvalue(),
        headers={"Content-Type": "image/png"},
        timeout=60,
    )
    return str(reply.json()["text"])


@pytest.mark.parametrize(
    ("font", "word", "px"),
    [("Carlito-Bold", "in", 48), ("Carlito-Bold", "mix", 48), ("DejaVuSerif-Bold", "in", 64)],
)
def test_a_lone_bold_word_is_read_with_its_dots(
    ocr_url: str, font: str, word: str, px: int
) -> None:
    """The dot of a lone word's i, at 48 px in a bold face, was a line of its own, read 'o' over
    'ln' (the typical line height was the mean of the dot and the word)."""
    assert read(ocr_url, [[(word, 2 * px)]], font, px) == word


INVOICE = [
    [("Invoice #20417", 0), ("Date: 2024-03-15", 420)],
    [("Description", 0), ("Qty", 300), ("Amount", 420)],
    [("Paper A4, 500 sheets", 0), ("2", 300), ("12.50", 420)],
    [("Toner cartridge", 0), ("1", 300), ("64.99", 420)],
    [("Stapler", 0), ("3", 300), ("27.00", 420)],
    [("Total due", 190), ("104.49", 420)],
]


def test_an_invoice_table_is_read_row_by_row(ocr_url: str) -> None:
    """Its description, quantity and amount cells share gaps like two columns of text do, and
    were read a column at a time (descriptions, then quantities and amounts)."""
    expected = "\n".join(" ".join(text for text, _ in row) for row in INVOICE)
    assert read(ocr_url, INVOICE, "Caladea", 22) == expected


RECEIPT = [
    [("JOHNSON MARKET", 60)],
    [("TEL (206) 278-9415", 0)],
    [("BOX OF 10 TOOLS", 0), ("20.05", 300)],
    [("COFFEE TO GO", 0), ("3.50", 300)],
    [("SUBTOTAL", 0), ("174.40", 300)],
    [("TOTAL:", 0), ("$162.29", 300)],
]


@pytest.mark.parametrize(("font", "px"), [("DejaVuSansMono", 16), ("GoMono", 14), ("B612Mono", 18)])
def test_a_receipt_in_a_monospaced_font_reads_as_drawn(ocr_url: str, font: str, px: int) -> None:
    """Monospaced O's, as narrow as the zero, were read as zeros ('J0HNSON', 'T0TAL:', 'G0'),
    and B612 Mono's full stop and brackets with a space ('$162. 29', '( 206)')."""
    expected = "\n".join(" ".join(text for text, _ in row) for row in RECEIPT)
    assert read(ocr_url, RECEIPT, font, px) == expected
