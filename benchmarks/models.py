"""The benchmark models, made from code with random weights (no downloads, fixed seeds).

    resnet  image [N, 3, 224, 224] -> logits [N, 1000]   ResNet-18's layers (BatchNorm folded)
    mlp     x [N, 256] -> y [N, 16]                       two Gemms: server overhead dominates
    crnn    image [N, 1, 32, W] -> logits [N, W/4, 83]    the OCR recognizer: conv + BiLSTM

`write_function(name, folder)` writes a function source folder (function.toml + model.onnx) that
edgeserve serves as is; `BENCH_SHAPES` gives the shape each request carries in the benchmark;
`with_processes` copies a function folder with its inference processes per device set.
"""

from __future__ import annotations

import argparse
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import tomlkit
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 8
CRNN_CLASSES = 83
CRNN_HIDDEN = 128
Dims = tuple[str, list[int | str]]
BENCH_SHAPES: dict[str, tuple[int, ...]] = {
    "resnet": (3, 224, 224),
    "mlp": (256,),
    "crnn": (1, 32, 128),
}


class Graph:
    """Nodes and weights accumulated while a model is described layer by layer."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.weights: list[onnx.TensorProto] = []
        self._count = 0

    def name(self, kind: str) -> str:
        self._count += 1
        return f"{kind}{self._count}"

    def weight(self, shape: tuple[int, ...], fan_in: int) -> str:
        """He-initialized weights keep activations in range through deep stacks."""
        values = self.rng.normal(0.0, np.sqrt(2.0 / fan_in), shape).astype(np.float32)
        return self.const(values)

    def const(self, values: np.ndarray) -> str:
        name = self.name("w")
        self.weights.append(numpy_helper.from_array(values, name))
        return name

    def op(self, kind: str, inputs: list[str], **attrs: object) -> str:
        out = self.name(kind.lower())
        self.nodes.append(helper.make_node(kind, inputs, [out], **attrs))
        return out

    def conv(self, x: str, c_in: int, c_out: int, k: int, stride: int = 1) -> str:
        w = self.weight((c_out, c_in, k, k), c_in * k * k)
        b = self.const(np.zeros(c_out, np.float32))
        pads = [k // 2] * 4
        return self.op("Conv", [x, w, b], kernel_shape=[k, k], strides=[stride] * 2, pads=pads)

    def save(self, path: Path, inputs: list[onnx.ValueInfoProto], output: Dims) -> Path:
        outs = [helper.make_tensor_value_info(output[0], TensorProto.FLOAT, list(output[1]))]
        graph = helper.make_graph(self.nodes, path.stem, inputs, outs, self.weights)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
        model.ir_version = IR_VERSION
        onnx.checker.check_model(model)
        path.parent.mkdir(parents=True, exist_ok=True)
        onnx.save(model, str(path))
        return path


def _rename(g: Graph, value: str, name: str) -> None:
    g.nodes.append(helper.make_node("Identity", [value], [name]))


def resnet18(path: Path, seed: int = 0) -> Path:
    """ResNet-18: 7x7 stem, 4 stages of 2 basic blocks (64..512), global pool, 1000-way Gemm."""
    g = Graph(seed)
    x = g.op("Relu", [g.conv("image", 3, 64, 7, 2)])
    x = g.op("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    c_in = 64
    for c_out in (64, 128, 256, 512):
        for block in range(2):
            stride = 2 if block == 0 and c_out != 64 else 1
            x = _basic_block(g, x, c_in, c_out, stride)
            c_in = c_out
    x = g.op("Flatten", [g.op("GlobalAveragePool", [x])])
    w, b = g.weight((512, 1000), 512), g.const(np.zeros(1000, np.float32))
    _rename(g, g.op("Gemm", [x, w, b]), "logits")
    image = helper.make_tensor_value_info("image", TensorProto.FLOAT, ["N", 3, 224, 224])
    return g.save(path, [image], ("logits", ["N", 1000]))


def _basic_block(g: Graph, x: str, c_in: int, c_out: int, stride: int) -> str:
    y = g.op("Relu", [g.conv(x, c_in, c_out, 3, stride)])
    y = g.conv(y, c_out, c_out, 3)
    skip = g.conv(x, c_in, c_out, 1, stride) if stride != 1 or c_in != c_out else x
    return g.op("Relu", [g.op("Add", [y, skip])])


def mlp(path: Path, seed: int = 0, hidden: int = 256) -> Path:
    """x [N, 256] -> Gemm, Relu, Gemm -> y [N, 16]."""
    g = Graph(seed)
    h = g.op(
        "Relu",
        [g.op("Gemm", ["x", g.weight((256, hidden), 256), g.const(np.zeros(hidden, np.float32))])],
    )
    _rename(
        g, g.op("Gemm", [h, g.weight((hidden, 16), hidden), g.const(np.zeros(16, np.float32))]), "y"
    )
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 256])
    return g.save(path, [x], ("y", ["N", 16]))


def crnn(path: Path, seed: int = 0) -> Path:
    """The OCR recognizer's shape: conv stack (height 32 -> 2, width / 4), BiLSTM, classifier."""
    g = Graph(seed)
    x, c_in = "image", 1
    for c_out, pool in ((16, 2), (32, 2), (64, 0), (64, 1), (96, 0), (96, 1)):
        x, c_in = g.op("Relu", [g.conv(x, c_in, c_out, 3)]), c_out
        if pool:
            kernel = [2, 2] if pool == 2 else [2, 1]
            x = g.op("MaxPool", [x], kernel_shape=kernel, strides=kernel)
    frames = g.op("Transpose", [x], perm=[3, 0, 1, 2])  # [W/4, N, 96, 2]
    frames = g.op("Reshape", [frames, g.const(np.array([0, 0, 192], np.int64))])
    y = _bilstm(g, frames, 192, CRNN_HIDDEN)  # [W/4, N, 2H]
    y = g.op("Transpose", [y], perm=[1, 0, 2])
    w, b = (
        g.weight((2 * CRNN_HIDDEN, CRNN_CLASSES), 2 * CRNN_HIDDEN),
        g.const(np.zeros(CRNN_CLASSES, np.float32)),
    )
    logits = g.op("Add", [g.op("MatMul", [y, w]), b])
    _rename(g, g.op("LogSoftmax", [logits], axis=-1), "logits")
    image = helper.make_tensor_value_info("image", TensorProto.FLOAT, ["N", 1, 32, "W"])
    return g.save(path, [image], ("logits", ["N", "T", CRNN_CLASSES]))


def _bilstm(g: Graph, x: str, features: int, hidden: int) -> str:
    """ONNX LSTM, both directions; Y [T, 2, N, H] -> [T, N, 2H]."""
    w = g.weight((2, 4 * hidden, features), features)
    r = g.weight((2, 4 * hidden, hidden), hidden)
    b = g.const(np.zeros((2, 8 * hidden), np.float32))
    out = g.name("lstm")
    g.nodes.append(
        helper.make_node("LSTM", [x, w, r, b], [out], hidden_size=hidden, direction="bidirectional")
    )
    y = g.op("Transpose", [out], perm=[0, 2, 1, 3])
    return g.op("Reshape", [y, g.const(np.array([0, 0, 2 * hidden], np.int64))])


MODELS: dict[str, Callable[[Path], Path]] = {"resnet": resnet18, "mlp": mlp, "crnn": crnn}

MAX_BATCH = 32
MANIFEST = """\
[function]
name = "{name}"
description = "benchmark model ({name}, random weights)"

[batching]
max_batch_size = {max_batch}
max_queue_delay_ms = {delay}
max_queue_size = {queue}
timeout_ms = 10000
instances = {instances}
{slo}
[backend]
prefer = ["{backend}"]
precision = "{precision}"
threads = {threads}
"""


def write_function(
    name: str,
    folder: Path,
    *,
    backend: str = "onnxruntime",
    precision: str = "fp32",
    threads: int = 0,
    delay_ms: float = 2.0,
    slo_ms: float | None = None,
    queue: int = 1024,
    instances: int = 1,
) -> Path:
    """A function source folder serving model `name` (the model file is made once, reused)."""
    folder.mkdir(parents=True, exist_ok=True)
    model = folder / "model.onnx"
    if not model.exists():
        MODELS[name](model)
    slo = f"latency_slo_ms = {slo_ms}\n" if slo_ms else ""
    (folder / "function.toml").write_text(
        MANIFEST.format(
            name=name,
            max_batch=MAX_BATCH,
            delay=delay_ms,
            queue=queue,
            slo=slo,
            instances=instances,
            backend=backend,
            precision=precision,
            threads=threads,
        ),
        encoding="utf-8",
    )
    return folder


def with_processes(source: Path, folder: Path, per_device: int | str) -> Path:
    """A copy of function folder `source` in `folder` whose manifest asks for `per_device`
    inference processes on each device ([resources] processes_per_device)."""
    shutil.copytree(source, folder, dirs_exist_ok=True)
    manifest = folder / "function.toml"
    document = tomlkit.parse(manifest.read_text(encoding="utf-8"))
    document.setdefault("resources", tomlkit.table())["processes_per_device"] = per_device
    manifest.write_text(tomlkit.dumps(document), encoding="utf-8")
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="folder for <name>.onnx")
    args = parser.parse_args()
    for name, make in MODELS.items():
        print(make(args.out / f"{name}.onnx"))


if __name__ == "__main__":
    main()
