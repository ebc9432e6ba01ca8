"""KServe v2 datatypes: the one table mapping them to numpy and to ONNX element types.

ONNX element types are the numbers of onnx.proto's TensorProto.DataType (fixed by the ONNX
spec), written out so that serving needs no `onnx` package (23 MB of a Lambda zip)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


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
