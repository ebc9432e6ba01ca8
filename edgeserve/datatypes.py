"""KServe v2 datatypes: the one table mapping them to numpy and to ONNX element types.

ONNX element types are the numbers of onnx.proto's TensorProto.DataType (fixed by the ONNX
spec), written out so that serving needs no `onnx` package (23 MB of a Lambda zip)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edgeserve.types import Signature, TensorDict


@dataclass(frozen=True)
class Datatype:
    name: str
    numpy: np.dtype
    onnx: int | None
    size: int  # bytes per element in the binary format; 0 for BYTES (length-prefixed)


def _bf16() -> np.dtype:
    """numpy has no bfloat16: its raw bits travel as uint16 and are widened on request."""
    return np.dtype(np.uint16)


DATATYPES: dict[str, Datatype] = {
    d.name: d
    for d in (
        Datatype("BOOL", np.dtype(np.bool_), 9, 1),
        Datatype("UINT8", np.dtype(np.uint8), 2, 1),
        Datatype("UINT16", np.dtype(np.uint16), 4, 2),
        Datatype("UINT32", np.dtype(np.uint32), 12, 4),
        Datatype("UINT64", np.dtype(np.uint64), 13, 8),
        Datatype("INT8", np.dtype(np.int8), 3, 1),
        Datatype("INT16", np.dtype(np.int16), 5, 2),
        Datatype("INT32", np.dtype(np.int32), 6, 4),
        Datatype("INT64", np.dtype(np.int64), 7, 8),
        Datatype("FP16", np.dtype(np.float16), 10, 2),
        Datatype("FP32", np.dtype(np.float32), 1, 4),
        Datatype("FP64", np.dtype(np.float64), 11, 8),
        Datatype("BYTES", np.dtype(np.object_), 8, 0),
        Datatype("BF16", _bf16(), 16, 2),
    )
}

_BY_ONNX = {d.onnx: d for d in DATATYPES.values() if d.onnx is not None}
_BY_NUMPY = {d.numpy: d for d in DATATYPES.values() if d.name != "BF16"}


def bf16_bits(array: np.ndarray) -> np.ndarray:
    """A BF16 tensor as its raw bits (uint16): OpenVINO hands them back in a float16 array,
    whose values are not the tensor's; the bits are reinterpreted, never converted."""
    if array.dtype == np.uint16:
        return array
    if array.dtype.itemsize != 2:
        raise ValueError(f"a BF16 tensor in a {array.dtype} array: expected 2-byte elements")
    return np.asarray(array, order="C").view(np.uint16)  # ascontiguousarray: rank 0 -> 1


def bf16_values(bits: np.ndarray) -> np.ndarray:
    """The numbers BF16 raw bits hold, as float32 (exact: bf16 is float32's top half)."""
    return (bf16_bits(bits).astype(np.uint32) << 16).view(np.float32)


def bf16_from_values(values: np.ndarray) -> np.ndarray:
    """Numbers as the raw bits of the nearest bf16 (ties to even, as every converter rounds);
    NaN stays NaN."""
    bits = np.asarray(values, np.float32, order="C").view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(values), np.uint16(0x7FC0), rounded)


def as_numbers(tensors: TensorDict, signature: Signature) -> TensorDict:
    """Outputs with their BF16 tensors widened to the float32 values they hold (for JSON, a
    handler, a comparison), the others as they are."""
    bf16 = [spec.name for spec in signature.outputs if spec.datatype == "BF16"]
    if not bf16:  # the common case, on every /invoke item: no copy
        return tensors
    return {**tensors, **{name: bf16_values(tensors[name]) for name in bf16 if name in tensors}}


def from_onnx(elem_type: int) -> Datatype:
    try:
        return _BY_ONNX[elem_type]
    except KeyError:
        raise ValueError(f"ONNX element type {elem_type} has no KServe v2 datatype") from None


def from_numpy(dtype: np.dtype) -> Datatype:
    """The v2 datatype of a numpy array (str/bytes/object arrays are BYTES)."""
    if dtype.kind in "OSU":
        return DATATYPES["BYTES"]
    try:
        return _BY_NUMPY[np.dtype(dtype)]
    except KeyError:
        raise ValueError(f"numpy dtype {dtype} has no KServe v2 datatype") from None
