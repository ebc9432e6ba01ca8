"""OCR handler: finds text lines on a page and turns the model's CTC logits into text.

preprocess: decode the image (upload.py), turn it grey (grey.py: luminance, or the colour axis
where ink and paper differ only in hue), even out the paper where the light was uneven
(light.py), take out salt and pepper or heavy noise (noise.py), binarise it (ink.py: Otsu),
level a page skewed by up to 3 degrees (skew.py), take table rules and underlines out
(rules.py), find columns (gutters several lines share: columns.py) and in each the lines with a
horizontal projection profile (lines.py), cut each line with a margin and normalise it to a
float32 [1, 32, W] strip where background is 0.0 and ink is 1.0 (whatever the page's polarity:
strips.py). One item per line, in reading order; a line with wide gaps (tab stops) or wider than
MAX_WIDTH after resizing is cut into several items, whose texts are joined with a space. Boxes
are given in the coordinates of the image as sent.
postprocess: greedy CTC decoding of each item's logits [T, C] (blank = class 0: decoding.py).
Lines of different widths share padded batches; the server cuts each line's logits back to its
own T = W // 4 (function.toml: [model.outputs.logits] follows the image width, ratio 0.25).

The modules beside this file are the handler's own, one step each: `edgeserve build` ships
those it imports with it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from columns import read_order
from decoding import corrected, ctc_greedy
from grey import to_gray
from light import even_light
from noise import denoise
from rules import remove_rules
from skew import deskew, unrotate_box
from strips import normalize_line, pad_box, split_line
from upload import DEFAULT_MAX_PIXELS, load_image

MIN_CONFIDENCE = 0.7  # lines read with less are dropped (postprocess)


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
            x0, y0, x1, y1 = pad_box(gray.shape, (x0, box[1], x1, box[3]))
            strip = normalize_line(gray[y0:y1, x0:x1])
            items.append({"image": strip})
            owners.append(len(boxes))
        boxes.append(unrotate_box(box, angle, page.shape, gray.shape))
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
        text = corrected(" ".join(t for t, _ in parts if t))
        probs = [p for _, ps in parts for p in ps]
        confidence = round(float(np.mean(probs)), 4) if probs else 0.0
        if text and confidence >= floor:
            lines.append({"text": text, "confidence": confidence, "box": box})
    return {"text": "\n".join(line["text"] for line in lines), "lines": lines}
