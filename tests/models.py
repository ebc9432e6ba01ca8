"""Small real ONNX models for tests, built with onnx.helper (no downloads, fixed seeds)."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = [helper.make_opsetid("", 17)]


def _save(graph: onnx.GraphProto, path: Path, check: bool = True) -> Path:
    """`check`: run onnx's checker (which wants a shape on every graph output, though ONNX
    Runtime and OpenVINO load models without one)."""
    model = helper.make_model(graph, opset_imports=OPSET, producer_name="edgeserve-tests")
    model.ir_version = 8
    if check:
        onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def mlp_model(
    path: Path,
    n_in: int = 16,
    hidden: int = 32,
    n_out: int = 4,
    seed: int = 0,
    batch: int | str = "N",
) -> Path:
    """x [N, n_in] FP32 -> y [N, n_out]: Gemm, Relu, Gemm."""
    rng = np.random.default_rng(seed)
    weights = [
        numpy_helper.from_array(rng.normal(0, 0.5, (n_in, hidden)).astype(np.float32), "w1"),
        numpy_helper.from_array(rng.normal(0, 0.1, hidden).astype(np.float32), "b1"),
        numpy_helper.from_array(rng.normal(0, 0.5, (hidden, n_out)).astype(np.float32), "w2"),
        numpy_helper.from_array(rng.normal(0, 0.1, n_out).astype(np.float32), "b2"),
    ]
    nodes = [
        helper.make_node("Gemm", ["x", "w1", "b1"], ["h"]),
        helper.make_node("Relu", ["h"], ["hr"]),
        helper.make_node("Gemm", ["hr", "w2", "b2"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, n_in])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, n_out])],
        weights,
    )
    return _save(graph, path)


def conv_model(
    path: Path,
    seed: int = 0,
    *,
    names: tuple[str, str] = ("image", "logits"),
    size: int = 16,
    classes: int = 8,
    softmax: bool = False,
) -> Path:
    """image [N, 3, size, size] FP32 -> logits [N, classes]: Conv, Relu, GlobalAveragePool,
    Flatten, Gemm (and a Softmax when asked)."""
    rng = np.random.default_rng(seed)
    weights = [
        numpy_helper.from_array(rng.normal(0, 0.3, (6, 3, 3, 3)).astype(np.float32), "k"),
        numpy_helper.from_array(rng.normal(0, 0.3, (6, classes)).astype(np.float32), "w"),
        numpy_helper.from_array(np.zeros(classes, np.float32), "b"),
    ]
    gemm_out = "logits" if softmax else names[1]
    nodes = [
        helper.make_node("Conv", [names[0], "k"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("GlobalAveragePool", ["r"], ["p"]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("Gemm", ["f", "w", "b"], [gemm_out]),
    ]
    if softmax:
        nodes.append(helper.make_node("Softmax", ["logits"], [names[1]], axis=1))
    graph = helper.make_graph(
        nodes,
        "conv",
        [helper.make_tensor_value_info(names[0], TensorProto.FLOAT, ["N", 3, size, size])],
        [helper.make_tensor_value_info(names[1], TensorProto.FLOAT, ["N", classes])],
        weights,
    )
    return _save(graph, path)


def varlen_model(path: Path, doubled: bool = True) -> Path:
    """x [N, L] FP32 with L variable -> total [N] (sum over L), doubled [N, L] (unless not
    `doubled`: an output whose shape varies is one perf_analyzer 2.41 cannot validate).

    Zero padding along L leaves `total` exact, which makes padded batching checkable.
    """
    nodes = [helper.make_node("ReduceSum", ["x", "axes"], ["total"], keepdims=0)]
    outputs = [helper.make_tensor_value_info("total", TensorProto.FLOAT, ["N"])]
    if doubled:
        nodes.append(helper.make_node("Add", ["x", "x"], ["doubled"]))
        outputs.append(helper.make_tensor_value_info("doubled", TensorProto.FLOAT, ["N", "L"]))
    graph = helper.make_graph(
        nodes,
        "varlen",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "L"])],
        outputs,
        [numpy_helper.from_array(np.array([1], np.int64), "axes")],
    )
    return _save(graph, path)


def even_rows_model(path: Path) -> Path:
    """x FP32 [N, 3] -> y FP32 [N, 3], x itself, made through pairs of values (a Reshape to
    [-1, 2] and back): a batch of an odd number of rows fails inside the model, on any
    backend ("The input tensor cannot be reshaped to the requested shape")."""
    paired = helper.make_node("Reshape", ["x", "pairs"], ["paired"])
    back = [
        helper.make_node("Shape", ["x"], ["dims"]),
        helper.make_node("Reshape", ["paired", "dims"], ["y"]),
    ]
    rows = [[helper.make_tensor_value_info(name, TensorProto.FLOAT, ["N", 3])] for name in "xy"]
    pairs = numpy_helper.from_array(np.array([-1, 2], np.int64), "pairs")
    return _save(helper.make_graph([paired, *back], "even_rows", *rows, [pairs]), path)


def tokens_model(path: Path, vocab: int = 50, width: int = 16, seed: int = 0) -> Path:
    """tokens [N, L] INT64 -> embedded [N, L, width], pooled [N, L // 2, width] (max over
    pairs of neighbours: a sequence model that downsamples by 2, as a CRNN does by 4)."""
    table = np.random.default_rng(seed).normal(0, 1, (vocab, width)).astype(np.float32)
    nodes = [
        helper.make_node("Gather", ["table", "tokens"], ["embedded"]),
        helper.make_node("Transpose", ["embedded"], ["channels"], perm=[0, 2, 1]),
        helper.make_node("MaxPool", ["channels"], ["pooled_t"], kernel_shape=[2], strides=[2]),
        helper.make_node("Transpose", ["pooled_t"], ["pooled"], perm=[0, 2, 1]),
    ]
    graph = helper.make_graph(
        nodes,
        "tokens",
        [helper.make_tensor_value_info("tokens", TensorProto.INT64, ["N", "L"])],
        [
            helper.make_tensor_value_info("embedded", TensorProto.FLOAT, ["N", "L", width]),
            helper.make_tensor_value_info("pooled", TensorProto.FLOAT, ["N", "H", width]),
        ],
        [numpy_helper.from_array(table, "table")],
    )
    return _save(graph, path)


def write_function(folder: Path, model_builder, manifest: str, handler: str | None = None) -> Path:
    """A function source folder: function.toml, model.onnx and optionally handler.py."""
    folder.mkdir(parents=True, exist_ok=True)
    model_builder(folder / "model.onnx")
    (folder / "function.toml").write_text(manifest)
    if handler is not None:
        (folder / "handler.py").write_text(handler)
    return folder


def identity_model(path: Path, datatypes: tuple[str, ...], row: int = 3) -> Path:
    """One Identity per v2 datatype: `in_<DT>` [N, row] -> `out_<DT>` [N, row] (several outputs)."""
    from edgeserve.datatypes import DATATYPES

    def value(prefix: str, datatype: str) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(
            f"{prefix}_{datatype}", DATATYPES[datatype].onnx, ["N", row]
        )

    nodes = [helper.make_node("Identity", [f"in_{dt}"], [f"out_{dt}"]) for dt in datatypes]
    graph = helper.make_graph(
        nodes,
        "identity",
        [value("in", dt) for dt in datatypes],
        [value("out", dt) for dt in datatypes],
    )
    return _save(graph, path)


def sequence_model(
    path: Path, vocab: int = 32, width: int = 8, seed: int = 0, via: str | None = None
) -> Path:
    """tokens INT64 [N, L] -> embedding mean FP32 [N, width]: Gather, ReduceMean (a text model).
    `via`: an op between the tokens and the Gather: "Cast" (to INT32, as exporters write),
    which the door sees through, or "Abs", arithmetic it does not follow, so that the door
    cannot bound the tokens by the table's rows (signature.py) and one past it fails in the
    backend."""
    rng = np.random.default_rng(seed)
    table = numpy_helper.from_array(rng.normal(0, 1, (vocab, width)).astype(np.float32), "table")
    nodes = [
        *_lookup_prelude(via),
        helper.make_node("Gather", ["table", _ids(via)], ["embedded"]),
        helper.make_node("ReduceMean", ["embedded"], ["pooled"], axes=[1], keepdims=0),
    ]
    graph = helper.make_graph(
        nodes,
        "sequence",
        [helper.make_tensor_value_info("tokens", TensorProto.INT64, ["N", "L"])],
        [helper.make_tensor_value_info("pooled", TensorProto.FLOAT, ["N", width])],
        [table],
    )
    return _save(graph, path)


def _lookup_prelude(via: str | None) -> list[onnx.NodeProto]:
    if via is None:
        return []
    cast = {"to": TensorProto.INT32} if via == "Cast" else {}
    return [helper.make_node(via, ["tokens"], ["ids"], **cast)]


def _ids(via: str | None) -> str:
    return "tokens" if via is None else "ids"


def exported_names_model(path: Path, width: int | str = 4) -> Path:
    """Tensor names as exporters write them: `input.1` (PyTorch), `serving/x:0` (TensorFlow)
    FP32 [N, width] -> `StatefulPartitionedCall:0` (their sum), `onnx::Out 1` (the first)."""
    nodes = [
        helper.make_node("Add", ["input.1", "serving/x:0"], ["StatefulPartitionedCall:0"]),
        helper.make_node("Identity", ["input.1"], ["onnx::Out 1"]),
    ]
    tensor = functools.partial(helper.make_tensor_value_info, elem_type=TensorProto.FLOAT)
    graph = helper.make_graph(
        nodes,
        "exported",
        [tensor("input.1", shape=["N", width]), tensor("serving/x:0", shape=["N", width])],
        [
            tensor("StatefulPartitionedCall:0", shape=["N", width]),
            tensor("onnx::Out 1", shape=["N", width]),
        ],
    )
    return _save(graph, path)


def pair_model(path: Path) -> Path:
    """Two inputs with a fixed batch of 1: features FP32 [1, 4], mask INT32 [1, 4] ->
    masked FP32 [1, 4] (features where the mask is set) and total FP32 [1]."""
    nodes = [
        helper.make_node("Cast", ["mask"], ["mask_f"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["features", "mask_f"], ["masked"]),
        helper.make_node("ReduceSum", ["masked", "axes"], ["total"], keepdims=0),
    ]
    graph = helper.make_graph(
        nodes,
        "pair",
        [
            helper.make_tensor_value_info("features", TensorProto.FLOAT, [1, 4]),
            helper.make_tensor_value_info("mask", TensorProto.INT32, [1, 4]),
        ],
        [
            helper.make_tensor_value_info("masked", TensorProto.FLOAT, [1, 4]),
            helper.make_tensor_value_info("total", TensorProto.FLOAT, [1]),
        ],
        [numpy_helper.from_array(np.array([1], np.int64), "axes")],
    )
    return _save(graph, path)


def masked_tokens_model(path: Path) -> Path:
    """`input_ids` and `attention_mask` INT64 [batch, seq] (one named dim, as exported text
    models have) -> `total` INT64 [batch]: the sum of the ids the mask keeps."""
    nodes = [
        helper.make_node("Mul", ["input_ids", "attention_mask"], ["kept"]),
        helper.make_node("ReduceSum", ["kept", "axes"], ["total"], keepdims=0),
    ]
    tokens = ["batch", "seq"]
    graph = helper.make_graph(
        nodes,
        "masked_tokens",
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, tokens),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, tokens),
        ],
        [helper.make_tensor_value_info("total", TensorProto.INT64, ["batch"])],
        [numpy_helper.from_array(np.array([1], np.int64), "axes")],
    )
    return _save(graph, path)


def classifier_model(path: Path, seed: int = 0) -> Path:
    """A conv net with a softmax: pixels FP32 [N, 3, 32, 32] -> probabilities FP32 [N, 10]."""
    return conv_model(
        path, seed, names=("pixels", "probabilities"), size=32, classes=10, softmax=True
    )


def slow_model(
    path: Path,
    depth: int = 20,
    rows: int = 256,
    dim: int = 1024,
    vocab: int | None = None,
    via: str | None = None,
) -> Path:
    """x [N, 1, dim] FP32 -> y [N]: x tiled to [N, rows, dim], then `depth` MatMuls by one
    [dim, dim] weight, summed: about 0.3 s a row on one CPU core, for tests that need a queue.
    With `vocab`, the input is tokens INT64 [N, rows] looked up in a [vocab, dim] table (a token
    past it is refused by ONNX Runtime while the batch runs, when `via` hides the lookup from
    the door as in `sequence_model`)."""
    rng = np.random.default_rng(0)
    weight = (rng.standard_normal((dim, dim)) / np.sqrt(dim)).astype(np.float32)
    if vocab is None:
        first = helper.make_node("Tile", ["x", "repeats"], ["h0"])
        given = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 1, dim])
        table = numpy_helper.from_array(np.array([1, rows, 1], np.int64), "repeats")
    else:
        first = helper.make_node("Gather", ["table", _ids(via)], ["h0"])
        given = helper.make_tensor_value_info("tokens", TensorProto.INT64, ["N", rows])
        table = numpy_helper.from_array(rng.random((vocab, dim), dtype=np.float32), "table")
    nodes = [*_lookup_prelude(via if vocab is not None else None), first]
    for layer in range(depth):
        nodes.append(helper.make_node("MatMul", [f"h{layer}", "w"], [f"h{layer + 1}"]))
    nodes.append(helper.make_node("ReduceSum", [f"h{depth}", "axes"], ["y"], keepdims=0))
    graph = helper.make_graph(
        nodes,
        "slow",
        [given],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N"])],
        [
            numpy_helper.from_array(weight, "w"),
            table,
            numpy_helper.from_array(np.array([1, 2], np.int64), "axes"),
        ],
    )
    return _save(graph, path)


def branching_model(path: Path) -> Path:
    """x [N, 4] FP32 -> y: 2x where the batch sums above 0, else 3x (an ONNX `If`: control flow,
    which CUDA graphs cannot capture)."""

    def branch(name: str, factor: float) -> onnx.GraphProto:
        scale = numpy_helper.from_array(np.array(factor, np.float32), f"{name}_factor")
        return helper.make_graph(
            [helper.make_node("Mul", ["x", f"{name}_factor"], [f"{name}_y"])],
            name,
            [],
            [helper.make_tensor_value_info(f"{name}_y", TensorProto.FLOAT, ["N", 4])],
            [scale],
        )

    nodes = [
        helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0),
        helper.make_node("Greater", ["total", "zero"], ["positive"]),
        helper.make_node(
            "If",
            ["positive"],
            ["y"],
            then_branch=branch("then", 2.0),
            else_branch=branch("else", 3.0),
        ),
    ]
    graph = helper.make_graph(
        nodes,
        "branching",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
        [numpy_helper.from_array(np.array(0.0, np.float32), "zero")],
    )
    return _save(graph, path)


def nonzero_model(path: Path) -> Path:
    """x FP32 [N, 4] -> y INT64 [K, 2]: the indices of x's nonzero values, one row each. Its
    outputs' first dim is dynamic, as a batch axis would be, but it is not one."""
    nodes = [
        helper.make_node("NonZero", ["x"], ["at"]),
        helper.make_node("Transpose", ["at"], ["y"], perm=[1, 0]),
    ]
    graph = helper.make_graph(
        nodes,
        "nonzero",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.INT64, ["K", 2])],
    )
    return _save(graph, path)


def centered_model(path: Path) -> Path:
    """points FP32 [P, 3] -> centered FP32 [P, 3]: each point minus the mean of all of them (a
    point cloud, a graph's nodes). Every first dim is dynamic, as a batch axis would be, but
    its rows compute together: stacked with another request's, each answer changes."""
    nodes = [
        helper.make_node("ReduceMean", ["points"], ["centroid"], axes=[0], keepdims=1),
        helper.make_node("Sub", ["points", "centroid"], ["centered"]),
    ]
    graph = helper.make_graph(
        nodes,
        "centered",
        [helper.make_tensor_value_info("points", TensorProto.FLOAT, ["P", 3])],
        [helper.make_tensor_value_info("centered", TensorProto.FLOAT, ["P", 3])],
    )
    return _save(graph, path)


def total_model(path: Path) -> Path:
    """x FP32 [N, 4] -> total FP32 []: the sum of every value (a batched input, an output
    without the batch axis: a rank-0 loss or score)."""
    graph = helper.make_graph(
        [helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0)],
        "total",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("total", TensorProto.FLOAT, [])],
    )
    return _save(graph, path)


def reshaping_model(path: Path, allowzero: bool = False) -> Path:
    """x FP32 [N, 6], cols INT64 [N, 1] -> y FP32 [N, C]: x reshaped to [N, C], C the largest
    `cols` of the batch (0 keeps 6, unless `allowzero`: then it fails as 7 does). C = 6 answers
    x itself; any other C (7, or most random ones) fails inside the model, on every backend,
    though every check at the door passes."""
    nodes = [
        helper.make_node("Shape", ["x"], ["dims"]),
        helper.make_node("Gather", ["dims", "first"], ["rows"]),
        helper.make_node("Concat", ["rows", "largest"], ["shape"], axis=0),
        helper.make_node("Reshape", ["x", "shape"], ["y"], allowzero=int(allowzero)),
    ]
    first = numpy_helper.from_array(np.array([0], np.int64), "first")
    return _by_the_largest(path, ("x", 6), "cols", nodes, "y", [first])


def top_model(path: Path) -> Path:
    """x FP32 [N, 4], k INT64 [N, 1] -> top FP32 [N, K]: TopK of each row, k the largest of the
    batch; a k past the 4 values fails inside ONNX Runtime ("k argument [9] should not be
    greater than specified axis dim value [4]")."""
    nodes = [helper.make_node("TopK", ["x", "largest"], ["top", "where"], axis=1)]
    return _by_the_largest(path, ("x", 4), "k", nodes, "top")


def divide_model(path: Path) -> Path:
    """x INT32 [N, 4], d INT32 [N, 1] -> q INT32 [N, 4]: x divided by d (integer Div, which
    ONNX Runtime refuses for a zero divisor: "Integer division by zero")."""
    graph = helper.make_graph(
        [helper.make_node("Div", ["x", "d"], ["q"])],
        "divide",
        [
            helper.make_tensor_value_info("x", TensorProto.INT32, ["N", 4]),
            helper.make_tensor_value_info("d", TensorProto.INT32, ["N", 1]),
        ],
        [helper.make_tensor_value_info("q", TensorProto.INT32, ["N", 4])],
    )
    return _save(graph, path)


def _by_the_largest(
    path: Path,
    data: tuple[str, int],
    size: str,
    nodes: list[onnx.NodeProto],
    output: str,
    weights: list[onnx.TensorProto] | None = None,
) -> Path:
    """`data` FP32 [N, width] and `size` INT64 [N, 1] -> `output` FP32 [N, ?], computed by
    `nodes` from `data` and `largest`, the batch's largest `size` ([1])."""
    name, width = data
    largest = helper.make_node("ReduceMax", [size], ["largest"], axes=[0], keepdims=0)
    graph = helper.make_graph(
        [largest, *nodes],
        output,
        [
            helper.make_tensor_value_info(name, TensorProto.FLOAT, ["N", width]),
            helper.make_tensor_value_info(size, TensorProto.INT64, ["N", 1]),
        ],
        [helper.make_tensor_value_info(output, TensorProto.FLOAT, ["N", "M"])],
        weights or [],
    )
    return _save(graph, path)


def shapeless_model(path: Path, shape: tuple[int, ...] = (-1, 2, 3)) -> Path:
    """x FP32 [N, 6] -> y FP32 of no declared shape (not even a rank, as a Loop's output or a
    custom op's may be): x reshaped to `shape` ([N, 2, 3] by default; (-1,): flat, [N * 6])."""
    target = numpy_helper.from_array(np.array(shape, np.int64), "shape")
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "shape"], ["y"])],
        "shapeless",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [target],
    )
    return _save(graph, path, check=False)


def any_rank_model(path: Path, output_shape: bool = False) -> Path:
    """x FP32 of no declared shape (any rank, any dims: not even `shape {}`, which is rank 0)
    -> y FP32: 2x, of x's shape (declared as none either, unless `output_shape`: [-1])."""
    two = numpy_helper.from_array(np.array(2.0, np.float32), "two")
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "two"], ["y"])],
        "any_rank",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["M"] if output_shape else None)],
        [two],
    )
    return _save(graph, path, check=False)


OPTIONAL_DEFAULTS = {
    "scale": np.array([2.0], np.float32),
    "bias": np.full((1, 4), 0.5, np.float32),
    "w": np.random.default_rng(0).normal(0, 1, (4, 3)).astype(np.float32),
}
"""optional_model's defaults: the initializers of its optional inputs."""


def optional_model(path: Path) -> Path:
    """x FP32 [N, 4] -> y FP32 [N, 3] = (x * scale + bias) @ w, as older exporters (or
    keep_initializers_as_inputs) write a model: `scale` [1], `bias` [N, 4] and the weight
    `w` [4, 3] are graph inputs that also have initializers (OPTIONAL_DEFAULTS), so a request
    may send them or leave them at their defaults. `bias` has the batch axis (its default,
    [1, 4], broadcasts); `scale` and `w` have none."""
    nodes = [
        helper.make_node("Mul", ["x", "scale"], ["scaled"]),
        helper.make_node("Add", ["scaled", "bias"], ["shifted"]),
        helper.make_node("MatMul", ["shifted", "w"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "optional",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4]),
            helper.make_tensor_value_info("scale", TensorProto.FLOAT, [1]),
            helper.make_tensor_value_info("bias", TensorProto.FLOAT, ["N", 4]),
            helper.make_tensor_value_info("w", TensorProto.FLOAT, [4, 3]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])],
        [numpy_helper.from_array(value, name) for name, value in OPTIONAL_DEFAULTS.items()],
    )
    return _save(graph, path)


def scalar_model(path: Path) -> Path:
    """x FP32 [] -> y FP32 []: x squared (a rank-0 input: no batch axis, no dims at all)."""
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "x"], ["y"])],
        "scalar",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])],
    )
    return _save(graph, path)


def bert_like_model(
    path: Path, vocab: int = 100, width: int = 8, seed: int = 0, over_batch: bool = False
) -> Path:
    """A BERT's inputs, INT64 [batch, seq] each: `input_ids` (a table of `vocab` rows),
    `token_type_ids` (a table of 2 rows, as every BERT has) and `attention_mask` ->
    `hidden` FP32 [batch, seq, width] (the masked sum of both embeddings) and `pooled`
    FP32 [batch, width] (its sum over the sequence). `over_batch`: `pooled` sums over the
    batch too, [1, width], though declared [batch, width] (a batch cannot be split back)."""
    rng = np.random.default_rng(seed)
    tables = [
        numpy_helper.from_array(rng.normal(0, 1, (rows, width)).astype(np.float32), name)
        for name, rows in (("words", vocab), ("types", 2))
    ]
    nodes = [
        helper.make_node("Gather", ["words", "input_ids"], ["word_embedded"]),
        helper.make_node("Gather", ["types", "token_type_ids"], ["type_embedded"]),
        helper.make_node("Add", ["word_embedded", "type_embedded"], ["embedded"]),
        helper.make_node("Cast", ["attention_mask"], ["mask_f"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["mask_f", "last"], ["mask_3d"]),
        helper.make_node("Mul", ["embedded", "mask_3d"], ["hidden"]),
        helper.make_node("ReduceSum", ["hidden", "seq_axis"], ["per_row"], keepdims=0),
        helper.make_node(
            "ReduceSum" if over_batch else "Identity",
            ["per_row", "batch_axis"] if over_batch else ["per_row"],
            ["pooled"],
        ),
    ]
    tokens = ["batch", "sequence"]
    graph = helper.make_graph(
        nodes,
        "bert_like",
        [
            helper.make_tensor_value_info(name, TensorProto.INT64, tokens)
            for name in ("input_ids", "token_type_ids", "attention_mask")
        ],
        [
            helper.make_tensor_value_info("hidden", TensorProto.FLOAT, [*tokens, width]),
            helper.make_tensor_value_info("pooled", TensorProto.FLOAT, ["batch", width]),
        ],
        [
            *tables,
            numpy_helper.from_array(np.array([2], np.int64), "last"),
            numpy_helper.from_array(np.array([1], np.int64), "seq_axis"),
            numpy_helper.from_array(np.array([0], np.int64), "batch_axis"),
        ],
    )
    return _save(graph, path)


def lookup_model(
    path: Path,
    table: tuple[list[onnx.TensorProto], list[onnx.NodeProto]],
    ids: tuple[int, list[onnx.NodeProto]] = (TensorProto.INT64, []),
    op: str = "Gather",
) -> Path:
    """tokens [N, 4] -> rows FP32: `op` over a table of 4 columns, Gather's [N, 4, 4] (an
    embedding), GatherElements' [N, 4]. `table`: the initializers and nodes that make `table`
    (tests/test_lookups.py: float16, quantized, a Constant); `ids`: the type of `tokens` and
    the nodes that make `ids` of it (none: an Identity)."""
    (inits, table_nodes), (ids_type, id_nodes) = table, ids
    id_nodes = id_nodes or [helper.make_node("Identity", ["tokens"], ["ids"])]
    out = ["N", 4, 4] if op == "Gather" else ["N", 4]
    graph = helper.make_graph(
        [*table_nodes, *id_nodes, helper.make_node(op, ["table", "ids"], ["rows"])],
        "lookup",
        [helper.make_tensor_value_info("tokens", ids_type, ["N", 4])],
        [helper.make_tensor_value_info("rows", TensorProto.FLOAT, out)],
        inits,
    )
    return _save(graph, path)


def zipmap_model(path: Path) -> Path:
    """skl2onnx's default classifier output: features FP32 [N, 3] -> `label` INT64 [N] (the
    argmax) and `output_probability`, ai.onnx.ml ZipMap's sequence of maps {class: p}."""
    nodes = [
        helper.make_node("ArgMax", ["features"], ["label"], axis=1, keepdims=0),
        helper.make_node("Softmax", ["features"], ["probabilities"], axis=1),
        helper.make_node(
            "ZipMap",
            ["probabilities"],
            ["output_probability"],
            domain="ai.onnx.ml",
            classlabels_int64s=[0, 1, 2],
        ),
    ]
    probabilities = helper.make_sequence_type_proto(
        helper.make_map_type_proto(
            TensorProto.INT64, helper.make_tensor_type_proto(TensorProto.FLOAT, [])
        )
    )
    graph = helper.make_graph(
        nodes,
        "zipmap",
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["N", 3])],
        [
            helper.make_tensor_value_info("label", TensorProto.INT64, ["N"]),
            helper.make_value_info("output_probability", probabilities),
        ],
    )
    model = helper.make_model(
        graph, opset_imports=[*OPSET, helper.make_opsetid("ai.onnx.ml", 1)], ir_version=8
    )
    onnx.checker.check_model(model, full_check=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def determinant_model(path: Path) -> Path:
    """x FP32 [N, 3, 3] -> y FP32 [N]: each matrix's determinant (ONNX `Det`), which ONNX
    Runtime computes and OpenVINO (2026.4) refuses: it has no conversion for the op."""
    graph = helper.make_graph(
        [helper.make_node("Det", ["x"], ["y"])],
        "determinant",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N"])],
    )
    return _save(graph, path)


def quantized_model(path: Path, quant_format: str = "QDQ", per_pixel: bool = False) -> Path:
    """`conv_model` (or, `per_pixel`, `pixels_model`) quantized to int8 as ONNX Runtime's
    `quantize_static` does it, calibrated on 8 seeded random images: QDQ (QuantizeLinear/
    DequantizeLinear pairs around the float ops) or QOperator (QLinearConv, com.microsoft's
    QGemm)."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

    size = 32 if per_pixel else 16

    class Images(CalibrationDataReader):
        def __init__(self) -> None:
            rngs = (np.random.default_rng(seed) for seed in range(8))
            self.batches = iter({"image": r.random((2, 3, size, size), np.float32)} for r in rngs)

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.batches, None)

    floats = path.with_suffix(".float.onnx")
    source = pixels_model(floats) if per_pixel else conv_model(floats)
    quantize_static(str(source), str(path), Images(), quant_format=QuantFormat[quant_format])
    return path


def pixels_model(path: Path, channels: int = 8, seed: int = 6) -> Path:
    """image FP32 [N, 3, 32, 32] -> features FP32 [N, channels, 32, 32]: three Conv + Relu, an
    answer per pixel (as a segmentation model's). Seed 6: quantized, OpenVINO 2026.4 answers
    a few of its pixels one int8 step away from ONNX Runtime (seeds 0 to 5 and 7: none)."""
    rng = np.random.default_rng(seed)
    nodes, weights, x = [], [], "image"
    for layer, given in enumerate((3, channels, channels)):
        k = rng.normal(0, 1 / np.sqrt(given * 9), (channels, given, 3, 3)).astype(np.float32)
        b = rng.normal(0, 0.1, channels).astype(np.float32)
        weights += [
            numpy_helper.from_array(k, f"k{layer}"),
            numpy_helper.from_array(b, f"b{layer}"),
        ]
        nodes += [
            helper.make_node("Conv", [x, f"k{layer}", f"b{layer}"], [f"c{layer}"], pads=[1] * 4),
            helper.make_node("Relu", [f"c{layer}"], [f"r{layer}"]),
        ]
        x = f"r{layer}"
    nodes.append(helper.make_node("Identity", [x], ["features"]))
    graph = helper.make_graph(
        nodes,
        "pixels",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["N", 3, 32, 32])],
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["N", channels, 32, 32])],
        weights,
    )
    return _save(graph, path)


def oddly_named_model(path: Path) -> Path:
    """`first\\nline` FP32 [N, 2] (a name holding a line break) -> 300 `o`s, its negation."""
    graph = helper.make_graph(
        [helper.make_node("Neg", ["first\nline"], ["o" * 300])],
        "oddly_named",
        [helper.make_tensor_value_info("first\nline", TensorProto.FLOAT, ["N", 2])],
        [helper.make_tensor_value_info("o" * 300, TensorProto.FLOAT, ["N", 2])],
    )
    return _save(graph, path)


def top_k_model(path: Path) -> Path:
    """x FP32 [N, 6], k INT64 [1] -> values FP32 [N, K] and indices INT64 [N, K]: TopK with
    the k a request sends (past 6, ONNX Runtime fails the run)."""
    graph = helper.make_graph(
        [helper.make_node("TopK", ["x", "k"], ["values", "indices"], axis=1)],
        "top_k",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 6]),
            helper.make_tensor_value_info("k", TensorProto.INT64, [1]),
        ],
        [
            helper.make_tensor_value_info("values", TensorProto.FLOAT, ["N", "K"]),
            helper.make_tensor_value_info("indices", TensorProto.INT64, ["N", "K"]),
        ],
    )
    return _save(graph, path)


W_CONSTANT = np.arange(16 * 4, dtype=np.float32).reshape(16, 4) / 64


def constant_weights_model(path: Path, location: str = "m.onnx.data") -> Path:
    """x FP32 [N, 16] -> y = x @ W_CONSTANT [N, 4], the weight a Constant's value kept in the
    side file `location` (relative to the model's folder), as onnx's
    `convert_model_to_external_data(convert_attribute=True)` writes it."""
    weight = onnx.TensorProto(name="w", data_type=TensorProto.FLOAT, dims=W_CONSTANT.shape)
    weight.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", "0"), ("length", W_CONSTANT.nbytes)):
        weight.external_data.add(key=key, value=str(value))
    (path.parent / location).parent.mkdir(parents=True, exist_ok=True)
    (path.parent / location).write_bytes(W_CONSTANT.tobytes())
    graph = helper.make_graph(
        [
            helper.make_node("Constant", [], ["w"], value=weight),
            helper.make_node("MatMul", ["x", "w"], ["y"]),
        ],
        "constant_weights",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
    )
    return _save(graph, path, check=False)


def decoder_step_model(path: Path, width: int = 4, vocab: int = 10) -> Path:
    """One attention layer of one head, named as optimum exports a decoder with its past:
    input_ids INT64 [batch_size, sequence_length], attention_mask INT64 [batch_size,
    "past_sequence_length + sequence_length"], past_key_values.0.key/value FP32 [batch_size,
    1, past_sequence_length, width] -> logits FP32 [batch_size, sequence_length, vocab] and
    present.0.key/value (the past and the new tokens' embeddings). The mask is added to the
    scores, so its length must be the past's and the new tokens' together."""
    rng = np.random.default_rng(0)
    total = "past_sequence_length + sequence_length"
    past = ["batch_size", 1, "past_sequence_length", width]
    nodes = [
        helper.make_node("Gather", ["embedding", "input_ids"], ["embedded"]),
        helper.make_node("Unsqueeze", ["embedded", "one"], ["new"]),  # [b, 1, seq, width]
        *(
            helper.make_node(
                "Concat", [f"past_key_values.0.{kv}", "new"], [f"present.0.{kv}"], axis=2
            )
            for kv in ("key", "value")
        ),
        helper.make_node("Transpose", ["present.0.key"], ["keys"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["new", "keys"], ["scores"]),  # [b, 1, seq, total]
    ]
    masked = [
        helper.make_node("Cast", ["attention_mask"], ["mask"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["mask", "middle"], ["mask_4d"]),  # [b, 1, 1, total]
        helper.make_node("Add", ["scores", "mask_4d"], ["masked"]),
        helper.make_node("Softmax", ["masked"], ["weights"], axis=-1),
        helper.make_node("MatMul", ["weights", "present.0.value"], ["context"]),
        helper.make_node("Squeeze", ["context", "one"], ["context_3d"]),
        helper.make_node("MatMul", ["context_3d", "unembedding"], ["logits"]),
    ]
    graph = helper.make_graph(
        [*nodes, *masked],
        "decoder_step",
        [
            helper.make_tensor_value_info(
                "input_ids", TensorProto.INT64, ["batch_size", "sequence_length"]
            ),
            helper.make_tensor_value_info(
                "attention_mask", TensorProto.INT64, ["batch_size", total]
            ),
            helper.make_tensor_value_info("past_key_values.0.key", TensorProto.FLOAT, past),
            helper.make_tensor_value_info("past_key_values.0.value", TensorProto.FLOAT, past),
        ],
        [
            helper.make_tensor_value_info(
                "logits", TensorProto.FLOAT, ["batch_size", "sequence_length", vocab]
            ),
            *(
                helper.make_tensor_value_info(
                    f"present.0.{kv}", TensorProto.FLOAT, ["batch_size", 1, total, width]
                )
                for kv in ("key", "value")
            ),
        ],
        [
            numpy_helper.from_array(
                rng.normal(0, 1, (vocab, width)).astype(np.float32), "embedding"
            ),
            numpy_helper.from_array(
                rng.normal(0, 1, (width, vocab)).astype(np.float32), "unembedding"
            ),
            numpy_helper.from_array(np.array([1], np.int64), "one"),
            numpy_helper.from_array(np.array([1, 2], np.int64), "middle"),
        ],
    )
    return _save(graph, path)


def half_model(path: Path, inside_only: bool = False, softmax_11: bool = False) -> Path:
    """x [N, 16] -> y [N, 8]: MatMul and Add of float16 weights, then Relu (or, `softmax_11`,
    opset 11's Softmax at axis 1 of y seen as [N, 2, 4], which OpenVINO 2026.4 computes over
    axis 1 alone). FP16 in and out, or (`inside_only`) FP32 ones cast to float16 and back,
    as a model exported in half precision behind float32 inputs is."""
    rng = np.random.default_rng(0)
    outside = TensorProto.FLOAT if inside_only else TensorProto.FLOAT16
    x, y = ("x_half", "y_half") if inside_only else ("x", "y")
    last = [helper.make_node("Relu", ["a"], [y])]
    if softmax_11:
        last = [
            helper.make_node("Reshape", ["a", "grouped"], ["g"]),
            helper.make_node("Softmax", ["g"], ["s"], axis=1),
            helper.make_node("Reshape", ["s", "flat"], [y]),
        ]
    nodes = [
        helper.make_node("MatMul", [x, "w"], ["m"]),
        helper.make_node("Add", ["m", "b"], ["a"]),
        *last,
    ]
    if inside_only:
        nodes.insert(0, helper.make_node("Cast", ["x"], [x], to=TensorProto.FLOAT16))
        nodes.append(helper.make_node("Cast", [y], ["y"], to=TensorProto.FLOAT))
    graph = helper.make_graph(
        nodes,
        "half",
        [helper.make_tensor_value_info("x", outside, ["N", 16])],
        [helper.make_tensor_value_info("y", outside, ["N", 8])],
        [
            numpy_helper.from_array(rng.normal(0, 0.5, (16, 8)).astype(np.float16), "w"),
            numpy_helper.from_array(rng.normal(0, 0.1, 8).astype(np.float16), "b"),
            numpy_helper.from_array(np.array([0, 2, 4], np.int64), "grouped"),
            numpy_helper.from_array(np.array([0, 8], np.int64), "flat"),
        ],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 11 if softmax_11 else 17)], ir_version=8
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def dynamic_quantized_model(path: Path) -> Path:
    """edgeserve's demo MLP quantized as ONNX Runtime's `quantize_dynamic` does it:
    DynamicQuantizeLinear, MatMulInteger, int8 weights."""
    from onnxruntime.quantization import quantize_dynamic

    from edgeserve.modelgen import mlp_model as demo_mlp

    quantize_dynamic(str(demo_mlp(path.with_suffix(".float.onnx"))), str(path))
    return path
