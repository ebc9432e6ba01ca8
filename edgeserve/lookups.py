"""The inputs a model uses to look rows up in one of its weights (an embedding's token ids).

OpenVINO, the CPU default, answers an id past an embedding's rows with zeros and a 200; ONNX
Runtime fails the run, and its words (`idx=40 must be within the inclusive range [-32,31]`)
reach the client as a 422 that names its kernel, not the input. So each input whose values
all reach a lookup's indices gets the range the table allows (ONNX takes -n..n-1 for n rows),
and the door (dataplane/checks.py) refuses the rest with a 400 naming the input and the table.

Covered: an input reaching the indices of a `Gather` or `GatherElements` directly or through
ops that keep every value (Identity, Reshape, Squeeze, Unsqueeze, Flatten, Transpose, a Cast
to an integer type: a float id cast to int, as Keras models take them, counts as truncated),
whose data is a weight (an initializer or a Constant, directly or through Identity, Cast or
DequantizeLinear: a float16 or quantized table). A weight the graph also lists as an input
(keep_initializers_as_inputs) bounds the ids unless a request sends its own. Not covered, so
never refused: ids computed first (Add, Abs, Where: the door cannot tell which values reach
the table), GatherND (each place on its last axis indexes another axis), lookups inside
subgraphs (If, Loop).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import onnx
from onnx import TensorProto

from edgeserve.types import TensorSpec

KEEP_VALUES = frozenset({"Identity", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Transpose"})
"""Ops whose first output holds every value of their first input, moved or reshaped."""

KEEP_DIMS = frozenset({"Identity", "Cast", "DequantizeLinear"})
"""Ops whose first output has their first input's dims: a table stored in another type."""

LOOKUPS = frozenset({"Gather", "GatherElements"})
"""Ops whose second input indexes their first along `axis` (0 unless given), -n..n-1 for n."""

_INTEGERS = ("INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32", "UINT64")
_CAST_TO_INTEGERS = frozenset(getattr(TensorProto, name) for name in _INTEGERS)  # v2's names
_ID_DATATYPES = frozenset({*_INTEGERS, "FP16", "FP32", "FP64"})
"""Inputs whose values may be ids (BF16 travels as raw bits; BYTES and BOOL are no ids)."""


@dataclasses.dataclass(frozen=True)
class Table:
    """A weight the model looks rows up in, by the name its file gives it, and its dims."""

    name: str
    dims: tuple[int, ...]


def with_index_ranges(inputs: list[TensorSpec], graph: onnx.GraphProto) -> list[TensorSpec]:
    """The inputs, each that indexes a table given the range of the narrowest one it indexes
    (every value must fit every table) and that table's name, for the door's message."""
    tables = _tables(graph)
    return [_with_index_range(spec, graph, tables) for spec in inputs]


def _with_index_range(
    spec: TensorSpec, graph: onnx.GraphProto, tables: dict[str, Table]
) -> TensorSpec:
    if spec.datatype not in _ID_DATATYPES:
        return spec
    found = list(_lookups(spec.name, graph, tables))
    if not found:
        return spec
    rows, name = min(found)
    return dataclasses.replace(spec, index_range=(-rows, rows - 1), index_table=name)


def _lookups(
    name: str, graph: onnx.GraphProto, tables: dict[str, Table]
) -> Iterator[tuple[int, str]]:
    """(rows, table name) of each lookup whose indices `name`'s values reach, every one."""
    carried = {name}
    for node in graph.node:  # ONNX lists nodes in topological order
        if node.input and node.input[0] in carried and _keeps_values(node):
            carried.add(node.output[0])
        if node.op_type not in LOOKUPS or len(node.input) < 2 or node.input[1] not in carried:
            continue
        table = tables.get(node.input[0])
        axis = _int_attribute(node, "axis", 0)
        if table is not None and -len(table.dims) <= axis < len(table.dims):
            yield table.dims[axis], table.name


def _keeps_values(node: onnx.NodeProto) -> bool:
    """A Cast is followed to an integer type only: cast to a float, an id may come back as
    another (float16 holds the integers exactly up to 2048); to a bool, as 0 or 1."""
    if node.op_type == "Cast":
        return _int_attribute(node, "to", 0) in _CAST_TO_INTEGERS
    return node.op_type in KEEP_VALUES


def _tables(graph: onnx.GraphProto) -> dict[str, Table]:
    """The weights by each name the graph holds them under: initializers and Constants, and
    what `KEEP_DIMS` ops make of them (a table keeps its own name)."""
    tables = {init.name: Table(init.name, tuple(init.dims)) for init in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and node.output:
            value = next((a.t for a in node.attribute if a.name == "value"), None)
            if value is not None:
                tables[node.output[0]] = Table(node.output[0], tuple(value.dims))
        elif node.op_type in KEEP_DIMS and node.input and node.input[0] in tables:
            tables[node.output[0]] = tables[node.input[0]]
    return tables


def _int_attribute(node: onnx.NodeProto, name: str, default: int) -> int:
    return next((a.i for a in node.attribute if a.name == name), default)
