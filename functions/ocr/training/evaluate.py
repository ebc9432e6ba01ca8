"""Evaluate the OCR function on held-out fonts: single lines and multi-line pages.

Single lines are rendered at a text height (font px size) of 20-40 with random margins;
pages hold 2-10 lines with uneven margins and indents. Lines are realistic text (words,
numbers, prices, dates, invoice fields), never fonts used in training.

    python functions/ocr/training/evaluate.py --inprocess
    python functions/ocr/training/evaluate.py --url http://127.0.0.1:8080
    python functions/ocr/training/evaluate.py --inprocess --fonts /usr/share/fonts/a/B.ttf ...
    python functions/ocr/training/evaluate.py --inprocess --each --sizes 14 48 \
        --lines 100 --pages 10 --fonts /usr/share/fonts/opentype/inter/Inter-Regular.otf ...
"""

from __future__ import annotations

import argparse
import io
import json
import random
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

OCR_DIR = Path(__file__).resolve().parents[1]
# Not OCR_DIR: the handler is imported as edgeserve imports it (ocr_handler), so its modules (lines,
# noise, ...) do not become everyone's in the process that imports this one (the tests).
sys.path[:0] = [str(OCR_DIR / "training"), str(OCR_DIR.parents[1])]

import synth  # noqa: E402

Recognize = Callable[[bytes], dict[str, Any]]


def edit_distance(a: str, b: str) -> int:
    """Levenshtein distance, one row at a time."""
    row = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, cb in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (ca != cb))
    return row[-1]


def png_bytes(page: synth.Page) -> bytes:
    buffer = io.BytesIO()
    page.image.save(buffer, format="PNG")
    return buffer.getvalue()


def _texts(rng: random.Random, n: int) -> list[str]:
    return [synth.random_text(rng, max_chars=rng.randint(6, 40), realistic=True) for _ in range(n)]


def score_lines(
    recognize: Recognize,
    rng: random.Random,
    fonts: list[Path],
    n_lines: int,
    sizes: tuple[int, int] = (20, 40),
) -> dict[str, float]:
    """Each image holds one line; the whole response text is compared with the truth."""
    cer_sum = exact = 0.0
    for _ in range(n_lines):
        page = synth.render_page(rng, fonts, _texts(rng, 1), sizes=sizes)
        got, truth = synth.clean_text(recognize(png_bytes(page))["text"]), page.texts[0]
        cer_sum += edit_distance(got, truth) / len(truth)
        exact += got == truth
    return {"line_cer": cer_sum / n_lines, "line_exact": exact / n_lines}


def match_page(response: dict[str, Any], page: synth.Page) -> list[str | None]:
    """Per true line, the text of the found line whose box centre lies in its ink rows."""
    found: list[str | None] = [None] * len(page.texts)
    for line in response["lines"]:
        centre = (line["box"][1] + line["box"][3]) / 2
        for i, (_, y0, _, y1) in enumerate(page.boxes):
            if found[i] is None and y0 <= centre <= y1:
                found[i] = line["text"]
                break
    return found


def score_pages(
    recognize: Recognize,
    rng: random.Random,
    fonts: list[Path],
    n_pages: int,
    sizes: tuple[int, int] = (20, 40),
) -> dict[str, float]:
    """Share of true lines found (one predicted line each), and the CER over found lines."""
    total = found = extra = 0
    errors = chars = 0
    for _ in range(n_pages):
        page = synth.render_page(rng, fonts, _texts(rng, rng.randint(2, 10)), sizes=sizes)
        response = recognize(png_bytes(page))
        matches = match_page(response, page)
        total += len(matches)
        extra += max(0, len(response["lines"]) - len(matches))
        for got, truth in zip(matches, page.texts, strict=True):
            if got is not None:
                found += 1
                errors += edit_distance(synth.clean_text(got), truth)
                chars += len(truth)
    return {
        "page_lines": total,
        "page_found": found / total,
        "page_extra_lines": extra,
        "page_cer": errors / max(1, chars),
    }


def evaluate(
    recognize: Recognize,
    n_lines: int = 300,
    n_pages: int = 40,
    seed: int = 7,
    fonts: list[Path] | None = None,
    sizes: tuple[int, int] = (20, 40),
) -> dict[str, float]:
    """All figures for one deterministic test set from the held-out fonts (or FONTS: any
    font files, e.g. families neither split has, to see how the model does off both), text
    heights (font px sizes) drawn from SIZES."""
    fonts = fonts or synth.font_paths(synth.HELD_OUT_FONTS)
    start = time.monotonic()
    figures: dict[str, float] = {"lines": n_lines, "pages": n_pages}
    figures |= score_lines(recognize, random.Random(seed), fonts, n_lines, sizes)
    figures |= score_pages(recognize, random.Random(seed + 1), fonts, n_pages, sizes)
    figures["seconds"] = round(time.monotonic() - start, 1)
    return figures


def inprocess_recognizer(model: Path = OCR_DIR / "model.onnx") -> Recognize:
    """handler.preprocess -> onnxruntime (widths padded with 0.0 like the server) -> postprocess."""
    import onnxruntime as ort

    handler = ocr_handler()
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])

    def recognize(data: bytes) -> dict[str, Any]:
        ctx = SimpleNamespace(content_type="image/png", options={}, root=OCR_DIR, state={})
        items = handler.preprocess(data, ctx)
        outputs = []
        for start in range(0, len(items), 32):
            chunk = [item["image"] for item in items[start : start + 32]]
            batch = np.zeros((len(chunk), 1, 32, max(s.shape[2] for s in chunk)), np.float32)
            for i, strip in enumerate(chunk):
                batch[i, :, :, : strip.shape[2]] = strip
            outputs += list(session.run(["logits"], {"image": batch})[0])
        return handler.postprocess([{"logits": out} for out in outputs], ctx)

    return recognize


def ocr_handler() -> Any:
    """functions/ocr/handler.py with its modules, imported the way `edgeserve serve` does."""
    from edgeserve.handler import import_handler

    return import_handler(OCR_DIR / "handler.py")


def url_recognizer(url: str) -> Recognize:
    """POST the PNG to URL/invoke and read the JSON answer."""

    def recognize(data: bytes) -> dict[str, Any]:
        request = urllib.request.Request(
            url.rstrip("/") + "/invoke", data=data, headers={"Content-Type": "image/png"}
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            return json.loads(response.read())

    return recognize


def font_files(paths: list[Path]) -> list[Path]:
    """PATHS, each a font file or a folder of them (every .ttf and .otf under it, sorted)."""
    files: list[Path] = []
    for path in paths:
        if path.is_dir():
            files += sorted(p for p in path.rglob("*") if p.suffix.lower() in {".ttf", ".otf"})
        elif path.exists():
            files.append(path)
        else:
            raise SystemExit(f"--fonts: {path} is neither a font file nor a folder")
    return files


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--inprocess", action="store_true", help="handler + onnxruntime here")
    mode.add_argument("--url", help="a running function, e.g. http://127.0.0.1:8080")
    parser.add_argument("--model", type=Path, default=OCR_DIR / "model.onnx")
    parser.add_argument("--lines", type=int, default=300)
    parser.add_argument("--pages", type=int, default=40)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--fonts",
        type=Path,
        nargs="+",
        help="font files or folders of them to test on instead of the held-out fonts",
    )
    parser.add_argument("--each", action="store_true", help="one row per font file")
    parser.add_argument(
        "--sizes", type=int, nargs=2, default=(20, 40), help="text heights (px), low and high"
    )
    args = parser.parse_args()
    recognize = url_recognizer(args.url) if args.url else inprocess_recognizer(args.model)
    fonts = font_files(args.fonts) if args.fonts else synth.font_paths(synth.HELD_OUT_FONTS)
    sizes = (args.sizes[0], args.sizes[1])
    if args.each:
        print("font | line CER | line exact | page lines found | page CER")
        for font in fonts:
            f = evaluate(recognize, args.lines, args.pages, args.seed, [font], sizes)
            print(
                f"{font.stem} | {100 * f['line_cer']:.2f} % | {100 * f['line_exact']:.1f} % | "
                f"{100 * f['page_found']:.1f} % | {100 * f['page_cer']:.2f} %",
                flush=True,
            )
        return
    figures = evaluate(recognize, args.lines, args.pages, args.seed, fonts, sizes)
    for key, value in figures.items():
        print(f"{key:>18}: {value:.4f}" if isinstance(value, float) else f"{key:>18}: {value}")


if __name__ == "__main__":
    main()
