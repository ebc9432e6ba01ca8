"""Small ONNX models made from code, so `init` ships a model that really runs and nothing binary."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 8  # what every onnxruntime and OpenVINO release of the last years reads


def mlp_model(
    path: Path, *, inputs: int = 16, hidden: int = 32, outputs: int = 4, seed: int = 0
) -> Path:
    """Write a 2-layer MLP `x` FP32 [-1, inputs] -> `y` FP32 [-1, outputs] with fixed weights."""
    rng = np.random.default_rng(seed)
    weights = {
        "w1": rng.standard_normal((inputs, hidden)) / np.sqrt(inputs),
        "b1": rng.standard_normal(hidden) * 0.1,
        "w2": rng.standard_normal((hidden, outputs)) / np.sqrt(hidden),
        "b2": rng.standard_normal(outputs) * 0.1,
    }
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h1"], name="fc1"),
        helper.make_node("Add", ["h1", "b1"], ["h2"], name="fc1_bias"),
        helper.make_node("Relu", ["h2"], ["h3"], name="relu"),
        helper.make_node("MatMul", ["h3", "w2"], ["h4"], name="fc2"),
        helper.make_node("Add", ["h4", "b2"], ["y"], name="fc2_bias"),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", inputs])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", outputs])],
        [
            numpy_helper.from_array(value.astype(np.float32), name)
            for name, value in weights.items()
        ],
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        ir_version=IR_VERSION,
        producer_name="edgeserve",
    )
    onnx.checker.check_model(model, full_check=True)  # also checks types
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path
