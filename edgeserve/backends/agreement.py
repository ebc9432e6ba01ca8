"""Whether a backend answers as ONNX Runtime does, checked at build on random inputs.

OpenVINO converts each ONNX op to its own, and some conversions compute otherwise, with no
error (measured with OpenVINO 2026.4): opset 11's Softmax on a non-last axis (softmax over that
axis alone, where ONNX flattens from it: probabilities off by 0.5), integer MatMul and ReduceSum
(accumulated in floats: 16777217 read 16777216), 8-bit arithmetic that saturates where ONNX
wraps around (5 - 10 in uint8 answered 0, not 251). A model it answers otherwise is served by
the next backend instead: `builder._prepare` plans past it, as past one it cannot convert.

Two batches: `samples.example_inputs`' random values (fractions in [0, 1), small integers), and
a wide one (negative and larger fractions, integers over their type's range, within 32 bits,
where the door lets 64-bit ones through to OpenVINO; ids and masks as before). A batch either
backend fails on proves nothing and is passed over, as is a model ONNX Runtime answers
differently from one run to the next (a random op), or cannot load.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from edgeserve.backends.onnxruntime import OnnxRuntime
from edgeserve.backends.options import LoadOptions
from edgeserve.datatypes import DATATYPES, as_numbers
from edgeserve.errors import EdgeserveError
from edgeserve.modelfile import op_types
from edgeserve.samples import MASK_WORD, example_inputs
from edgeserve.types import Backend, Signature, TensorDict, TensorSpec

ROWS = 3
TOLERANCE = {"FP16": 1e-2, "BF16": 1e-2}
"""Relative to the largest value of the output; 1e-4 for the other floats, integers exact."""
QUANTIZED_TOLERANCE = 1e-2
"""The same for the float outputs of a model that quantizes its activations to 8 bits: its
values lie on steps, and OpenVINO (a float op between dequantizing and quantizing again, where
ONNX Runtime computes in integers) lands one step away now and then. ONNX Runtime's
quantize_static made 3- and 6-layer conv nets whose per-pixel outputs OpenVINO 2026.4 answered
one step off (0.0036, 0.4% of the largest value) on a few pixels, and build planned past it."""
QUANTIZING_OPS = frozenset(
    {"QuantizeLinear", "DynamicQuantizeLinear", "QLinearConv", "QLinearMatMul", "MatMulInteger",
     "ConvInteger"}
)  # fmt: skip


def disagreement(
    name: str, load: Callable[[Path, LoadOptions], Backend], model: Path, signature: Signature
) -> str | None:
    """Why the backend `load` makes (fp32) cannot stand in for ONNX Runtime on `model`, or
    None where it answers alike (or nothing could be compared)."""
    options = LoadOptions(signature, precision="fp32")
    try:
        reference = OnnxRuntime(model, options)
    except EdgeserveError:  # nothing to compare with: build says so of ONNX Runtime itself
        return None
    other = load(model, options)
    floor = QUANTIZED_TOLERANCE if op_types(model) & QUANTIZING_OPS else 0.0
    try:
        for wide in (False, True):
            batch = _random(signature, wide)
            want, again, got = (_answer(e, batch, signature) for e in (reference, reference, other))
            if want is None or again is None or got is None or not _same(want, again):
                continue
            if found := _first_difference(want, got, signature, floor):
                return f"{name} answers {found} than ONNX Runtime on random inputs"
    finally:
        reference.close()
        other.close()
    return None


def _answer(engine: Backend, batch: TensorDict, signature: Signature) -> TensorDict | None:
    try:
        return as_numbers(engine.infer(batch), signature)
    except EdgeserveError:
        return None


def _same(one: TensorDict, two: TensorDict) -> bool:
    return all(np.array_equal(one[n], two[n], equal_nan=one[n].dtype.kind == "f") for n in one)


def _first_difference(
    want: TensorDict, got: TensorDict, signature: Signature, floor: float = 0.0
) -> str | None:
    """`output y`'s difference, as "0.557 further from", or None where every output agrees
    (floats within their datatype's tolerance, or `floor` where that is wider)."""
    for spec in signature.outputs:
        a, b = want[spec.name], got[spec.name]
        if a.shape != b.shape:
            return f"output `{spec.name}` in shape {list(b.shape)}, not {list(a.shape)}, other"
        if a.dtype.kind != "f":
            if not np.array_equal(a, b):
                return f"output `{spec.name}` with other values ({_count(a != b)})"
            continue
        scale = float(np.nanmax(np.abs(a[np.isfinite(a)]), initial=1.0))
        allowed = max(TOLERANCE.get(spec.datatype, 1e-4), floor) * max(scale, 1.0)
        if not np.allclose(a, b, rtol=0, atol=allowed, equal_nan=True):
            diff = float(np.nanmax(np.abs(a.astype(np.float64) - b)))
            return f"output `{spec.name}` up to {diff:.3g} other"
    return None


def _count(mismatched: np.ndarray) -> str:
    return f"{int(mismatched.sum())} of {mismatched.size} values"


def _random(signature: Signature, wide: bool) -> TensorDict:
    rng = np.random.default_rng(0)
    batch = example_inputs(signature, ROWS, rng)
    if not wide:
        return batch
    specs = {spec.name: spec for spec in signature.required}
    return {name: _widened(rng, specs[name], array) for name, array in batch.items()}


def _widened(rng: np.random.Generator, spec: TensorSpec, array: np.ndarray) -> np.ndarray:
    """Values over more of the datatype's range than `random_input`'s, where any will do."""
    kind = array.dtype.kind
    if kind == "f" and spec.datatype != "BF16":
        return (rng.standard_normal(array.shape) * 8).astype(array.dtype)
    if kind not in "iu" or spec.index_range is not None or MASK_WORD in spec.name.lower():
        return array
    info = np.iinfo(DATATYPES[spec.datatype].numpy)
    low, high = max(int(info.min), -(2**31)), min(int(info.max), 2**31 - 1)
    return rng.integers(low, high, array.shape, endpoint=True).astype(array.dtype)
