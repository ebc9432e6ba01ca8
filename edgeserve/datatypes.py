"""KServe v2 datatypes: the one table mapping them to numpy and to ONNX element types."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from onnx import TensorProto


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
        Datatype("BOOL", np.dtype(np.bool_), TensorProto.BOOL, 1),
        Datatype("UINT8", np.dtype(np.uint8), TensorProto.UINT8, 1),
        Datatype("UINT16", np.dtype(np.uint16), TensorProto.UINT16, 2),
        Datatype("UINT32", np.dtype(np.uint32), TensorProto.UINT32, 4),
        Datatype("UINT64", np.dtype(np.uint64), TensorProto.UINT64, 8),
        Datatype("INT8", np.dtype(np.int8), TensorProto.INT8, 1),
        Datatype("INT16", np.dtype(np.int16), TensorProto.INT16, 2),
        Datatype("INT32", np.dtype(np.int32), TensorProto.INT32, 4),
        Datatype("INT64", np.dtype(np.int64), TensorProto.INT64, 8),
        Datatype("FP16", np.dtype(np.float16), TensorProto.FLOAT16, 2),
        Datatype("FP32", np.dtype(np.float32), TensorProto.FLOAT, 4),
        Datatype("FP64", np.dtype(np.float64), TensorProto.DOUBLE, 8),
        Datatype("BYTES", np.dtype(np.object_), TensorProto.STRING, 0),
        Datatype("BF16", _bf16(), TensorProto.BFLOAT16, 2),
    )
}

_BY_ONNX = {d.onnx: d for d in DATATYPES.values() if d.onnx is not None}
_BY_NUMPY = {d.numpy: d for d in DATATYPES.values() if d.name != "BF16"}


def from_onnx(elem_type: int) -> Datatype:
    try:
        return _BY_ONNX[elem_type]
    except KeyError:
        name = TensorProto.DataType.Name(elem_type)
        raise ValueError(f"ONNX element type {name} has no KServe v2 datatype") from None


def from_numpy(dtype: np.dtype) -> Datatype:
    """The v2 datatype of a numpy array (str/bytes/object arrays are BYTES)."""
    if dtype.kind in "OSU":
        return DATATYPES["BYTES"]
    try:
        return _BY_NUMPY[np.dtype(dtype)]
    except KeyError:
        raise ValueError(f"numpy dtype {dtype} has no KServe v2 datatype") from None
