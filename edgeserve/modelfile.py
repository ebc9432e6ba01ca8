"""What an ONNX file holds besides its tensors' specs (signature.py): the side files its weights
lie in, and the ops of its graphs, subgraphs included. Read without the weights."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import onnx

from edgeserve.errors import ConfigError


def external_data(model: Path) -> list[str]:
    """The side files an ONNX model keeps its weights in (models over 2 GB must), relative to
    its folder; ConfigError for one outside that folder or missing. Every stored tensor counts:
    onnx's `convert_model_to_external_data(convert_attribute=True)` moves Constants' values out
    too, and init left their file behind (build: "External data path does not exist")."""
    from onnx.external_data_helper import ExternalDataInfo, uses_external_data

    proto = load_proto(model)
    locations = sorted(
        {
            ExternalDataInfo(tensor).location
            for tensor in _weights(proto)
            if uses_external_data(tensor)
        }
    )
    for location in locations:
        if Path(location).is_absolute() or ".." in Path(location).parts:
            raise ConfigError(
                f"{model}: external data {location!r} lies outside the model's folder"
            )
        if not (model.parent / location).is_file():
            raise ConfigError(f"{model}: external data file {model.parent / location} is missing")
    return locations


ONNX_DOMAINS = frozenset({"", "ai.onnx"})
"""The default domain's two spellings: the ops every ONNX runtime has."""


def foreign_ops(model: Path) -> list[str]:
    """`domain.op` of each op outside ONNX's default domain (ai.onnx.ml's LinearClassifier,
    a vendor's), subgraphs included; the model's own functions are not foreign."""
    proto = load_proto(model)
    local = {function.domain for function in proto.functions}
    found = (
        f"{n.domain}.{n.op_type}" for n in _nodes(proto) if n.domain not in ONNX_DOMAINS | local
    )
    return list(dict.fromkeys(found))


def op_types(model: Path) -> set[str]:
    """The op types the model uses, subgraphs included, whatever their domain."""
    return {node.op_type for node in _nodes(load_proto(model))}


def _nodes(proto: onnx.ModelProto) -> Iterator[onnx.NodeProto]:
    return (node for graph in _graphs(proto) for node in graph.node)


def _weights(proto: onnx.ModelProto) -> Iterator[onnx.TensorProto]:
    """Every tensor the model stores: initializers and attributes' (a Constant's value),
    subgraphs' included."""
    for graph in _graphs(proto):
        yield from graph.initializer
        for node in graph.node:
            for attribute in node.attribute:
                yield from [attribute.t] if attribute.HasField("t") else attribute.tensors


def _graphs(proto: onnx.ModelProto) -> Iterator[onnx.GraphProto]:
    """The main graph and every subgraph (If's branches, Loop's and Scan's bodies)."""
    graphs = [proto.graph]
    while graphs:
        graph = graphs.pop()
        yield graph
        for node in graph.node:
            for attribute in node.attribute:
                graphs.extend([attribute.g] if attribute.HasField("g") else attribute.graphs)


def load_proto(model_path: Path) -> onnx.ModelProto:
    """The model's graph without its weights; ConfigError for a file that is not ONNX."""
    try:
        return onnx.load(str(model_path), load_external_data=False)
    except FileNotFoundError:
        raise ConfigError(f"{model_path}: model file not found ([model] path)") from None
    except Exception as exc:  # onnx raises DecodeError, ValueError, ...: all mean "not ONNX"
        raise ConfigError(
            f"{model_path}: not a readable ONNX model: {exc}{_other_format(model_path)}"
        ) from None


_FORMATS = (  # where a file of another framework says what it is, what it is, how to export
    (0, b"PK\x03\x04", "a zip file (as torch.save writes a PyTorch checkpoint)",
     "torch.onnx.export(model, example_inputs, 'model.onnx')"),
    (0, b"\x80", "a Python pickle (an older PyTorch checkpoint, or a scikit-learn model)",
     "torch.onnx.export, or skl2onnx for scikit-learn"),
    (0, b"\x89HDF", "an HDF5 file (a Keras model)", "tf2onnx.convert.from_keras"),
    (4, b"TFL3", "a TensorFlow Lite model", "tf2onnx with --tflite"),
)  # fmt: skip


def _other_format(path: Path) -> str:
    """What a file that is not ONNX is, from its first bytes, and how to export it ("": not
    known): a PyTorch checkpoint read only "Wire format was corrupt"."""
    try:
        with path.open("rb") as file:
            head = file.read(8)
    except OSError:
        return ""
    for at, signature, what, how in _FORMATS:
        if head[at:].startswith(signature):
            return f". It is {what}: export the model to ONNX first ({how})"
    return ""
