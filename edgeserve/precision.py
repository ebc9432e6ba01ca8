"""What a precision other than fp32 costs in accuracy, measured at build time.

`[backend] precision = "auto"` lets OpenVINO compute in bf16 where the CPU has it (AMX,
AVX512-BF16): several times faster, with outputs that drift from fp32. `build` runs the
function's samples (v2 requests; /invoke payloads where there is no handler to read them; images
through the handler) or, where none fits, seeded random inputs through OpenVINO at fp32
and at the manifest's precision, reports the largest absolute output difference, and refuses
the bundle when it exceeds `[backend] max_abs_diff`.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgeserve.backends.agreement import QUANTIZING_OPS
from edgeserve.datatypes import as_numbers
from edgeserve.errors import ConfigError, EdgeserveError, ModelRefused
from edgeserve.handler import import_handler, one_row
from edgeserve.manifest import Manifest
from edgeserve.modelfile import op_types
from edgeserve.samples import (
    IMAGE_TYPES,
    example_inputs,
    fits_signature,
    json_sample,
    sample_files,
)
from edgeserve.types import Context, Signature, TensorDict

RANDOM_ROWS = 4


@dataclass(frozen=True)
class PrecisionCheck:
    precision: str
    max_abs_diff: float
    inputs: str  # "3 samples", "1 sample" or "random inputs"
    tolerance: float | None
    quantized: bool = True  # the model carries quantization (what "int8" computes in int8)

    def describe(self) -> str:
        bound = f"limit {self.tolerance:g}" if self.tolerance else "no [backend] max_abs_diff"
        said = (
            f"precision {self.precision} (openvino): outputs differ from fp32 by at most "
            f"{self.max_abs_diff:.3g} on {self.inputs} ({bound})"
        )
        if self.precision != "int8" or self.quantized:
            return said
        return (
            f"warning: {said}, but not in int8: the model carries no quantization (no "
            'QuantizeLinear or QLinear node), so OpenVINO chose its precision as for "auto". '
            "Hint: quantize the model first (NNCF, or onnxruntime.quantization's "
            "quantize_static) to compute in int8"
        )


@dataclass(frozen=True)
class SkippedPrecision:
    """The precision check could not run: the model failed on the inputs it was given (random
    ones, where no sample holds the model's inputs, may be values it refuses: a TopK's k past
    its axis). Said, so that a build does not pass it in silence, nor refuse a model that
    serves its real requests."""

    reason: str

    def describe(self) -> str:
        return (
            f"warning: the precision check did not run: {self.reason}; the drift from fp32 is "
            "unmeasured. Hint: add a sample of a real request to samples/, or set [backend] "
            'precision = "fp32"'
        )


def check_precision(
    source: Path, manifest: Manifest, signature: Signature
) -> PrecisionCheck | SkippedPrecision | None:
    """Measure the drift and refuse it over the tolerance; None when there is nothing to compare
    (precision fp32, OpenVINO not preferred or not installed)."""
    backend = manifest.backend
    if backend.precision == "fp32" or "openvino" not in backend.prefer:
        return None
    if importlib.util.find_spec("openvino") is None:
        return None
    batches, described = _inputs(source, manifest, signature)
    model = source / manifest.model.path
    try:
        reference, candidate = (
            _run(model, signature, batches, p) for p in ("fp32", backend.precision)
        )
    except ModelRefused as exc:
        return SkippedPrecision(f"on {described}, {exc.message}")
    diff = _max_diff(reference, candidate)
    quantized = bool(op_types(model) & QUANTIZING_OPS)
    check = PrecisionCheck(backend.precision, diff, described, backend.max_abs_diff, quantized)
    if check.tolerance is not None and diff > check.tolerance:
        raise ConfigError(
            f"{source}: [backend] precision = {backend.precision!r} moves outputs by {diff:.3g} "
            f"from fp32 on {described}, over max_abs_diff = {check.tolerance:g}. "
            'Hint: set precision = "fp32", or raise max_abs_diff if that drift is acceptable.'
        )
    return check


def _max_diff(reference: list[TensorDict], candidate: list[TensorDict]) -> float:
    """Largest |fp32 - candidate| over every floating-point output of every batch."""
    diffs = [
        float(np.abs(a[name].astype(np.float64) - b[name]).max())
        for a, b in zip(reference, candidate, strict=True)
        for name in a
        if a[name].dtype.kind == "f" and a[name].size
    ]
    return max(diffs, default=0.0)


def _run(
    model: Path, signature: Signature, batches: list[TensorDict], precision: str
) -> list[TensorDict]:
    from edgeserve.backends import load_backend

    engine = load_backend(
        "openvino",
        model,
        signature=signature,
        precision=precision,  # type: ignore[arg-type]
    )
    try:
        # BF16 outputs compared as the values their bits hold
        return [as_numbers(engine.infer(batch), signature) for batch in batches]
    finally:
        engine.close()


def _inputs(source: Path, manifest: Manifest, signature: Signature) -> tuple[list[TensorDict], str]:
    samples = source / "samples"
    files = sample_files(samples) if samples.is_dir() else []
    batches = _sample_batches(files, manifest, signature, source)
    if batches:
        return batches, f"{len(batches)} sample{'s' if len(batches) > 1 else ''}"
    random = example_inputs(signature, RANDOM_ROWS, np.random.default_rng(0))
    why = "no file in samples/ holds the model's inputs" if files else "no samples/"
    return [random], f"random inputs ({why})"


def _sample_batches(
    files: list[Path], manifest: Manifest, signature: Signature, source: Path
) -> list[TensorDict]:
    """JSON samples' tensors as they are; images through the handler's preprocess; each batch
    once (init's request.json and v2.json hold the same tensors: one sample, run once)."""
    batches: list[TensorDict] = []
    for path in files:
        if path.suffix == ".json":
            batch = json_sample(path, signature, handler=manifest.handler.module is not None)
        elif path.suffix.lower() in IMAGE_TYPES and manifest.handler.module:
            batch = _preprocessed(path, manifest, signature, source)
        else:
            continue
        if batch and fits_signature(batch, signature) and not any(map(_same(batch), batches)):
            batches.append(batch)
    return batches


def _same(batch: TensorDict) -> Callable[[TensorDict], bool]:
    """Whether another batch holds the same tensors as `batch`."""
    return lambda other: (
        batch.keys() == other.keys()
        and all(np.array_equal(batch[name], other[name]) for name in batch)
    )


def _preprocessed(
    path: Path, manifest: Manifest, signature: Signature, source: Path
) -> TensorDict | None:
    """One image through handler.preprocess; items of one shape stacked into one batch."""
    handler = import_handler(source / f"{manifest.handler.module}.py")
    ctx = Context(IMAGE_TYPES[path.suffix.lower()], manifest.handler.options, source)
    try:
        items: list[dict[str, Any]] = handler.preprocess(path.read_bytes(), ctx)
    except Exception as exc:
        raise EdgeserveError(
            f"{path}: handler.preprocess failed: {type(exc).__name__}: {exc}"
        ) from exc
    if not items:
        return None
    first = {name: np.asarray(value) for name, value in items[0].items()}
    return one_row(first, signature) if signature.batched else first
