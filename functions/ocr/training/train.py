"""Train the OCR line recogniser (small CRNN + CTC) on synthetic lines and export ONNX.

Input `image` float32 [N, 1, 32, W] (ink 1.0, paper 0.0; see strips.normalize_line), output
`logits` float32 [N, W // 4, len(CHARSET) + 1] log-probabilities, class 0 = CTC blank.
Lines are rendered on the fly in DataLoader workers from TRAIN_FONTS only. The learning rate
follows a cosine over whichever budget runs out first, --steps or --minutes, so a run on
busy shared cores still ends annealed and on time. See README.md for the exact commands.

    python functions/ocr/training/train.py --minutes 26
    python functions/ocr/training/train.py --device cuda --workers 15 --batch 64 \
        --steps 1000000 --minutes 8
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from PIL import features
from torch import nn
from torch.utils.data import DataLoader, IterableDataset

OCR_DIR = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(OCR_DIR / "training"), str(OCR_DIR), str(OCR_DIR.parents[1])]

import synth  # noqa: E402
from decoding import CHARSET, ctc_greedy  # noqa: E402  (the handler's own modules)
from evaluate import edit_distance  # noqa: E402
from strips import DOWNSAMPLE, LINE_HEIGHT, normalize_line  # noqa: E402

SEED = 1234
NUM_CLASSES = len(CHARSET) + 1
CHAR_INDEX = {c: i + 1 for i, c in enumerate(CHARSET)}
assert CHARSET == synth.CHARSET, "the handler (decoding.py) and synth disagree on the charset"


class SynthLines(IterableDataset):
    """Endless stream of (strip [1, 32, W], label indices) rendered from the training fonts."""

    def __init__(self, seed: int, more_fonts: bool = False, old_style: float = 0.0) -> None:
        self.seed = seed
        self.fonts = synth.train_fonts(more_fonts)
        self.old_style = old_style
        self.resampled = synth.RESAMPLED if more_fonts else 0.0
        self.narrow = synth.NARROW_SPACES if more_fonts else 0.0

    def __iter__(self) -> Iterator[tuple[np.ndarray, list[int]]]:
        info = torch.utils.data.get_worker_info()
        rng = random.Random(self.seed * 1000 + (info.id if info else 0))
        while True:
            gray, text = synth.render_line(
                rng, self.fonts, None, self.old_style, self.resampled, self.narrow
            )
            strip = normalize_line(gray)
            if strip.shape[2] // DOWNSAMPLE >= 2 * len(text) + 1:
                yield strip, [CHAR_INDEX[c] for c in text]


class WidthBuckets(IterableDataset):
    """Batches of lines of similar width: padding a batch to its widest line wastes compute."""

    def __init__(
        self, seed: int, batch: int, more_fonts: bool, old_style: float, pool: int = 16
    ) -> None:
        self.lines = SynthLines(seed, more_fonts, old_style)
        self.batch, self.pool = batch, pool

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        lines = iter(self.lines)
        while True:
            pool = sorted((next(lines) for _ in range(self.batch * self.pool)), key=_width)
            chunks = [pool[i : i + self.batch] for i in range(0, len(pool), self.batch)]
            random.shuffle(chunks)
            yield from map(collate, chunks)


def _width(item: tuple[np.ndarray, list[int]]) -> int:
    return item[0].shape[2]


def collate(batch: list[tuple[np.ndarray, list[int]]]) -> dict[str, torch.Tensor]:
    """Pad widths with 0.0 (like the server) plus a random extra so padding is no surprise."""
    widths = [strip.shape[2] for strip, _ in batch]
    width = max(widths) + random.randint(0, 16) * DOWNSAMPLE
    images = np.zeros((len(batch), 1, LINE_HEIGHT, width), dtype=np.float32)
    for i, (strip, _) in enumerate(batch):
        images[i, :, :, : strip.shape[2]] = strip
    return {
        "images": torch.from_numpy(images),
        "targets": torch.tensor([c for _, label in batch for c in label], dtype=torch.long),
        "input_lengths": torch.tensor([w // DOWNSAMPLE for w in widths]),
        "target_lengths": torch.tensor([len(label) for _, label in batch]),
    }


def conv_block(c_in: int, c_out: int) -> list[nn.Module]:
    return [nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU()]


class CRNN(nn.Module):
    """Conv stack (height 32 -> 2, width / 4) then one BiLSTM and a per-frame classifier."""

    def __init__(self, num_classes: int = NUM_CLASSES, hidden: int = 128) -> None:
        super().__init__()
        self.features = nn.Sequential(
            *conv_block(1, 16), nn.MaxPool2d(2),
            *conv_block(16, 32), nn.MaxPool2d(2),
            *conv_block(32, 64), *conv_block(64, 64), nn.MaxPool2d((2, 1)),
            *conv_block(64, 96), *conv_block(96, 96), nn.MaxPool2d((2, 1)),
        )  # fmt: skip
        self.rnn = nn.LSTM(2 * 96, hidden, batch_first=True, bidirectional=True)
        self.classifier = nn.Linear(2 * hidden, num_classes)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        f = self.features(image)  # [N, 96, 2, W/4]
        f = f.flatten(1, 2).transpose(1, 2)  # [N, W/4, 192]
        f, _ = self.rnn(f)
        return self.classifier(f).log_softmax(-1)


def validate(model: CRNN, batches: list[dict[str, torch.Tensor]]) -> float:
    """Character error rate on a fixed set of synthetic training-font lines."""
    model.eval()
    errors = chars = 0
    with torch.no_grad():
        for batch in batches:
            logits = model(batch["images"]).cpu()
            labels = batch["targets"].cpu().split(batch["target_lengths"].tolist())
            for out, length, label in zip(logits, batch["input_lengths"], labels, strict=True):
                truth = "".join(CHARSET[c - 1] for c in label.tolist())
                text, _ = ctc_greedy(out[: int(length)].numpy())
                errors += edit_distance(text, truth)
                chars += len(truth)
    model.train()
    return errors / max(1, chars)


def export_onnx(model: CRNN, path: Path) -> None:
    """Export with dynamic batch and width, then check onnxruntime agrees with torch."""
    import onnxruntime as ort

    model.eval()
    example = torch.rand(2, 1, LINE_HEIGHT, 200)
    torch.onnx.export(
        model, (example,), str(path), input_names=["image"], output_names=["logits"],
        opset_version=17, dynamo=False,
        dynamic_axes={"image": {0: "batch", 3: "width"}, "logits": {0: "batch", 1: "frames"}},
    )  # fmt: skip
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for shape in [(1, 1, 32, 64), (3, 1, 32, 412), (2, 1, 32, 2048)]:
        image = torch.rand(shape)
        with torch.no_grad():
            expected = model(image).numpy()
        got = session.run(["logits"], {"image": image.numpy()})[0]
        assert got.shape == (shape[0], shape[3] // DOWNSAMPLE, NUM_CLASSES), got.shape
        np.testing.assert_allclose(got, expected, atol=1e-3, rtol=1e-3)
    print(f"exported {path} ({path.stat().st_size / 1e6:.2f} MB), onnxruntime matches torch")


def learning_rate(peak: float, progress: float) -> float:
    """Short warm-up then cosine decay over progress in [0, 1]."""
    return peak * min(1.0, progress / 0.03) * 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))


def train(args: argparse.Namespace) -> CRNN:
    """Cosine schedule over whichever runs out first, steps or minutes: shared cores vary."""
    torch.manual_seed(SEED)
    random.seed(SEED)
    model = CRNN()
    if args.init:
        model.load_state_dict(torch.load(args.init, map_location="cpu"))
    model = model.to(args.device)
    loader = DataLoader(
        WidthBuckets(SEED, args.batch, args.more_fonts, args.old_style), batch_size=None,
        num_workers=args.workers, worker_init_fn=_worker_init,
        prefetch_factor=8 if args.workers else None,
    )  # fmt: skip
    val = [_to(collate(b), args.device) for b in _val_batches()]
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=1e-4)
    ctc = nn.CTCLoss(blank=0, zero_infinity=True)
    start = time.monotonic()
    for step, cpu_batch in enumerate(loader, 1):
        batch = _to(cpu_batch, args.device)
        progress = max(step / args.steps, (time.monotonic() - start) / (60 * args.minutes))
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(args.lr, progress)
        loss = ctc(
            model(batch["images"]).transpose(0, 1), batch["targets"],
            batch["input_lengths"], batch["target_lengths"],
        )  # fmt: skip
        optimizer.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 5.0)
        optimizer.step()
        done = progress >= 1.0
        if step % args.log_every == 0 or done:
            elapsed = time.monotonic() - start
            print(f"step {step} loss {loss.item():.3f} lr {optimizer.param_groups[0]['lr']:.2e} "
                  f"{elapsed:.0f}s", flush=True)  # fmt: skip
        if step % args.eval_every == 0 or done:
            print(f"step {step} val CER {validate(model, val):.4f}", flush=True)
            torch.save(model.state_dict(), args.checkpoint)
        if done:
            return model
    raise AssertionError("the data stream is endless")


def _worker_init(_: int) -> None:
    torch.set_num_threads(1)


def _to(batch: dict[str, torch.Tensor], device: str) -> dict[str, torch.Tensor]:
    return {key: value.to(device) for key, value in batch.items()}


def _val_batches() -> list[list[tuple[np.ndarray, list[int]]]]:
    lines = SynthLines(SEED + 1).__iter__()
    return [[next(lines) for _ in range(32)] for _ in range(4)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--minutes", type=float, default=30.0, help="stop early after this")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--workers", type=int, default=1, help="line-rendering processes")
    parser.add_argument("--device", default="cpu", help="cpu, or cuda where there is one")
    parser.add_argument("--log-every", type=int, default=25)
    parser.add_argument("--eval-every", type=int, default=250)
    parser.add_argument("--checkpoint", type=Path, default=Path("/tmp/ocr_ckpt.pt"))
    parser.add_argument("--output", type=Path, default=OCR_DIR / "model.onnx")
    parser.add_argument("--export-only", action="store_true", help="export the checkpoint")
    parser.add_argument(
        "--init", type=Path, help="start from this checkpoint's weights (a second, shorter run)"
    )
    parser.add_argument(
        "--more-fonts",
        action="store_true",
        help="also synth.MORE_TRAIN_FONTS (those installed), old-style figures and lines "
        "resampled as turned or scaled pages' (README.md)",
    )
    parser.add_argument(
        "--old-style",
        type=float,
        help="the share of lines drawn with old-style figures (default: synth.OLD_STYLE with "
        "--more-fonts, else none)",
    )
    args = parser.parse_args()
    if args.old_style is None:
        args.old_style = synth.OLD_STYLE if args.more_fonts else 0.0
    if args.old_style and not features.check("raqm"):
        # each worker failed at its first old-style line, deep in Pillow ("not supported
        # without libraqm"), after the run had started
        parser.error(
            "old-style figures need Pillow with libraqm (PIL.features.check('raqm') is False "
            "here): install libraqm0 (Debian) first, or pass --old-style 0"
        )
    torch.set_num_threads(2)
    if args.export_only:
        model = CRNN()
        model.load_state_dict(torch.load(args.checkpoint, map_location="cpu"))
    else:
        model = train(args)
    export_onnx(model.cpu(), args.output)


if __name__ == "__main__":
    main()
