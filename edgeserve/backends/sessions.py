"""How an ONNX Runtime session is opened: its providers (the CUDA EP's settings, graph
capture), its options (threads, no spinning) and the named dims fixed to a bucket's sizes; and
how one runs where BF16 tensors cross (`run_bf16`)."""

from __future__ import annotations

import ctypes
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from edgeserve.backends.options import LoadOptions
from edgeserve.errors import BackendError
from edgeserve.shapes import Shape
from edgeserve.types import TensorDict


def new_session(
    model_path: Path, options: LoadOptions, requested: list[Any], fixed: Mapping[str, int]
) -> Any:
    return open_session(model_path, session_options(options, fixed), requested)


def open_session(model_path: Path, options: Any, requested: list[Any]) -> Any:
    """An InferenceSession, or a BackendError saying why ONNX Runtime cannot load the model."""
    import onnxruntime as ort

    try:
        return ort.InferenceSession(str(model_path), options, providers=requested)
    except Exception as exc:  # onnxruntime raises its own Fail / InvalidGraph / RuntimeError
        raise BackendError(f"onnxruntime: cannot load {model_path}: {exc}") from None


def check_loads(model_path: Path) -> None:
    """Open the model on the CPU without optimizing it, and let it go: a BackendError for a
    model ONNX Runtime cannot load (an op of a domain it has no kernel for, an opset past its
    own), which build then refuses, where `serve` failed to start on it."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = ORT_FATAL_ONLY
    try:
        open_session(model_path, options, ["CPUExecutionProvider"])
    except BackendError as exc:
        raise BackendError(exc.message + _custom_ops_hint(model_path)) from None


ORT_FATAL_ONLY = 4
"""ONNX Runtime's own log, fatal lines only: every failure it reports comes back as an exception
that edgeserve says in its own words (a BackendError, a 422), and its red copy of it on stderr
made a handled one (init's batch-axis check on a model that fails on random rows) look like a
crash. Its warnings (nodes not placed on CUDA) go too: which providers a session got is read and
logged by edgeserve."""

ORT_DOMAINS = ("ai.onnx.ml.", "com.microsoft.")
"""The domains besides ONNX's whose ops ONNX Runtime has kernels for."""


def _custom_ops_hint(model_path: Path) -> str:
    """What to do where the model holds ops of a domain ONNX Runtime has no kernels for."""
    from edgeserve.modelfile import foreign_ops

    custom = [op for op in foreign_ops(model_path) if not op.startswith(ORT_DOMAINS)]
    if not custom:
        return ""
    return (
        f". Hint: ops of a custom domain ({', '.join(custom)}) need their custom-op library, "
        "which edgeserve does not load: export the model with ONNX ops"
    )


def providers(cuda_device: int | None, tf32: bool = False) -> list[Any]:
    """The CUDA EP on the given device, then the CPU; or the CPU alone.

    TF32 (on by default in the CUDA EP) stays off unless the precision is not "fp32". cuDNN's
    algorithm search stays EXHAUSTIVE: HEURISTIC left every Conv of a ResNet-18-shaped model in
    cuDNN's fallback mode on an H200 (38 ms a batch against 0.7 ms).
    """
    if cuda_device is None:
        return ["CPUExecutionProvider"]
    cuda = ("CUDAExecutionProvider", {"device_id": str(cuda_device), "use_tf32": str(int(tf32))})
    return [cuda, "CPUExecutionProvider"]


def with_graphs(requested: list[Any]) -> list[Any]:
    """The same providers with the CUDA EP's graph capture on (runs given a graph id)."""
    return [
        (entry[0], {**entry[1], "enable_cuda_graph": "1"}) if isinstance(entry, tuple) else entry
        for entry in requested
    ]


def dim_names(model_path: Path, outputs: bool = False) -> dict[str, dict[int, str]]:
    """The named dynamic dims of each model input, and of each output with `outputs`
    ({tensor: {axis: name}})."""
    import onnx

    graph = onnx.load(str(model_path), load_external_data=False).graph
    return {
        value.name: {
            axis: dim.dim_param
            for axis, dim in enumerate(value.type.tensor_type.shape.dim)
            if dim.dim_param
        }
        for value in (*graph.input, *(graph.output if outputs else ()))
    }


def fixed_dims(
    names: Mapping[str, Mapping[int, str]], shapes: Mapping[str, Shape]
) -> dict[str, int]:
    """Named dims at a bucket's sizes, for ONNX Runtime to fold the model's shape arithmetic;
    a name two inputs give different sizes stays free."""
    sizes: dict[str, set[int]] = {}
    for name, shape in shapes.items():
        for axis, dim in names.get(name, {}).items():
            sizes.setdefault(dim, set()).add(shape[axis])
    return {dim: next(iter(found)) for dim, found in sizes.items() if len(found) == 1}


def session_options(options: LoadOptions, fixed: Mapping[str, int] | None = None) -> Any:
    import onnxruntime as ort

    so = ort.SessionOptions()
    for dim, size in (fixed or {}).items():
        so.add_free_dimension_override_by_name(dim, size)
    so.intra_op_num_threads = options.threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.log_severity_level = ORT_FATAL_ONLY
    # No spinning between runs: on a few cores the spinning pool starves the event loop.
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return so


def run_bf16(
    session: Any, names: list[str], feeds: TensorDict, bf16: frozenset[str]
) -> list[np.ndarray]:
    """A run where BF16 tensors (`bf16`) cross as OrtValues holding their raw bits: ONNX
    Runtime's numpy API has no bfloat16 (a BF16 output failed every run: "No corresponding
    Numpy type for Tensor Type. bfloat16"; a uint16 input is refused)."""
    from onnxruntime import OrtValue

    values = {
        name: OrtValue.ortvalue_from_numpy_with_onnx_type(array, BF16_ONNX)
        if name in bf16
        else OrtValue.ortvalue_from_numpy(array)
        for name, array in feeds.items()
    }
    outputs = session.run_with_ort_values(names, values)
    return [
        _bits(value) if name in bf16 else value.numpy()
        for name, value in zip(names, outputs, strict=True)
    ]


BF16_ONNX = 16  # onnx.TensorProto.BFLOAT16, as in datatypes.DATATYPES


def _bits(value: Any) -> np.ndarray:
    """A copy of a BF16 OrtValue's raw bits, as uint16 (datatypes.py)."""
    shape = tuple(value.shape())
    count = math.prod(shape)
    if not count:
        return np.zeros(shape, np.uint16)
    memory = (ctypes.c_uint16 * count).from_address(value.data_ptr())
    return np.ctypeslib.as_array(memory).reshape(shape).copy()
