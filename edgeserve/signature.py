"""Tensor specs read from the model file, with the manifest's overrides applied. Batching
follows Triton's auto-complete rule: it applies only when every input and output has a dynamic
first dimension; otherwise the function serves one request per run, unbatched."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import onnx

from edgeserve import datatypes
from edgeserve.errors import ConfigError, did_you_mean
from edgeserve.lookups import with_index_ranges
from edgeserve.manifest import BatchingSection, ModelSection, TensorOverride
from edgeserve.modelfile import load_proto
from edgeserve.overrides import check_pad_axis, class_labels, merge_dims, size_bounds
from edgeserve.types import Signature, SummedDim, TensorSpec, TiedDim


def read_signature(
    model_path: Path, section: ModelSection, manifest: Path | None = None, batching: bool = True
) -> Signature:
    """Read names, datatypes and dims from an ONNX file (weights are not loaded).

    `manifest`: the function.toml the overrides came from, named in errors about them;
    `batching`: whether the function batches where the model can (`[batching] max_batch_size`
    above 0), which the dims shown for an output of no declared shape follow.
    """
    graph = load_proto(model_path).graph
    initializers = {init.name for init in graph.initializer}
    where = manifest or model_path
    graph_inputs = list(graph.input)  # those with an initializer too: optional, it their default
    if not graph.output:  # an empty file reads as an empty model; one without outputs answers {}
        raise ConfigError(f"{model_path}: the model has no outputs (an empty or truncated file?)")
    _check_overrides_exist(section, graph_inputs, list(graph.output), where)
    for kind, values in (("input", graph_inputs), ("output", graph.output)):
        for value in values:
            _check_tensor(value, kind, model_path)
    inputs = [
        _optional(_spec(v, section.inputs, where, "inputs"), where)
        if v.name in initializers
        else _spec(v, section.inputs, where, "inputs")
        for v in graph_inputs
    ]
    outputs = [_spec(v, section.outputs, where, "outputs") for v in graph.output]
    outputs = [_resolve_follows(spec, inputs, where) for spec in outputs]
    inputs = with_index_ranges(inputs, graph)
    required = [spec for spec in inputs if not spec.optional]
    batched = bool(required) and all(
        spec.dims and spec.dims[0] == -1 for spec in required + outputs
    )  # an input of no declared shape, of any rank, may have no batch axis: it runs alone
    batched = batched and all(spec.ranked for spec in required)
    batched = batched and not any(tie.spans_first_axis for tie in _tied_dims(graph_inputs, False))
    outputs = [_unranked_dims(spec, batched and batching) for spec in outputs]
    for spec in required if batched else ():
        if any(bound and bound[0] != -1 for bound in (spec.min_dims, spec.max_dims)):
            raise ConfigError(
                f"{where}: field `model.inputs.{spec.name}`: axis 0 is the batch axis, which "
                "[batching] max_batch_size bounds: give -1 there in min_dims and max_dims"
            )
    tied, summed = _tied_dims(graph_inputs, batched), _summed_dims(graph_inputs)
    return Signature(tuple(inputs), tuple(outputs), batched, tied, summed)


_NOT_TENSORS = {
    "sequence_type": ("a sequence", "export it as a tensor (ConcatFromSequence stacks one)"),
    "map_type": ("a map", "export it as a tensor"),
    "optional_type": ("an optional", "export it as a tensor (OptionalGetElement unwraps one)"),
    "sparse_tensor_type": ("a sparse tensor", "export it as a dense tensor"),
    None: (
        "of no declared type",
        "declare its type; onnx.shape_inference.infer_shapes(model) fills it in",
    ),
}
_ZIPMAP = (
    "a sequence of maps (skl2onnx's ZipMap)",
    "export it as a tensor; for skl2onnx classifiers, to_onnx(model, X, options={'zipmap': False})",
)


def _check_tensor(value: onnx.ValueInfoProto, kind: str, model_path: Path) -> None:
    """Refuse a value that is not a tensor: KServe v2 (and Triton) carry tensors only, and its
    element type read as 0, which named neither the cause nor the fix."""
    which = value.type.WhichOneof("value")
    if which == "tensor_type":
        return
    what, hint = _NOT_TENSORS.get(which, _NOT_TENSORS[None])
    if which == "sequence_type" and value.type.sequence_type.elem_type.WhichOneof("value") == (
        "map_type"
    ):
        what, hint = _ZIPMAP
    raise ConfigError(
        f"{model_path}: {kind} `{value.name}` is {what}, not a tensor; KServe v2 serves tensors "
        f"only. Hint: {hint}"
    )


def _tied_dims(values: list[onnx.ValueInfoProto], batched: bool) -> tuple[TiedDim, ...]:
    """Named dims on more than one input axis: ONNX gives a name one size wherever it appears.
    A request whose tensors disagree there failed inside the model alone (a 500), and in a
    batch whose padding evened them out it was answered as if it were right."""
    axes: dict[str, list[tuple[str, int]]] = {}
    for value in values:
        for axis, dim in enumerate(value.type.tensor_type.shape.dim):
            if dim.dim_param and not (batched and axis == 0):
                axes.setdefault(dim.dim_param, []).append((value.name, axis))
    return tuple(TiedDim(name, tuple(places)) for name, places in axes.items() if len(places) > 1)


def _summed_dims(values: list[onnx.ValueInfoProto]) -> tuple[SummedDim, ...]:
    """Input axes named as a sum of dims other input axes name, and integers: every made-up
    input (init's sample, build's checks, the warm-up) sized each dynamic axis alike, so an
    optimum decoder's attention_mask [batch, "past_sequence_length + sequence_length"] was
    32 long beside 32 past and 32 new tokens, and the model failed on each of them."""
    named: dict[str, tuple[str, int]] = {}
    params = []
    for value in values:
        for axis, dim in enumerate(value.type.tensor_type.shape.dim):
            if dim.dim_param:
                named.setdefault(dim.dim_param, (value.name, axis))
                params.append(((value.name, axis), [p.strip() for p in dim.dim_param.split("+")]))
    found = []
    for place, parts in params:
        terms = [named.get(part) for part in parts if not part.isdigit()]
        if len(parts) > 1 and terms and all(terms) and place not in terms:
            constant = sum(int(part) for part in parts if part.isdigit())
            found.append(SummedDim(" + ".join(parts), place, tuple(filter(None, terms)), constant))
    return tuple(found)


def _optional(spec: TensorSpec, where: Path) -> TensorSpec:
    """A graph input with an initializer of its name (older exporters, keep_initializers_as_
    inputs): optional, the initializer its default, as Triton's ONNX Runtime backend takes it.
    It pads nothing and bounds nothing: a request sends it whole or not at all."""
    if spec.pad_axis is not None or spec.min_dims is not None or spec.max_dims is not None:
        raise ConfigError(
            f"{where}: field `model.inputs.{spec.name}`: an optional input (the model holds a "
            "default for it) takes no pad_axis, min_dims nor max_dims; expected dims only"
        )
    return dataclasses.replace(spec, optional=True)


def unbatchable(signature: Signature) -> str:
    """Why the model has no batch axis ("": it has one): "x [1, 16], y [1, 4]: no dynamic first
    dim"; "a [-1, -1]: its first dim N sizes a later axis too" for a first dim named later."""
    tied = signature.tied_first
    specs = signature.fixed_first_dims()
    fixed = ", ".join(f"{spec.name} {spec.shown}" for spec in specs if spec.name not in tied)
    return "; ".join(
        ([f"{fixed}: no dynamic first dim"] if fixed else [])
        + [
            f"{spec.name} {spec.shown}: its first dim {tied[spec.name]} sizes a later axis too"
            for spec in specs
            if spec.name in tied
        ]
    )


def check_max_batch_size(signature: Signature, batching: BatchingSection, manifest: Path) -> None:
    """Refuse a max_batch_size written for a model that cannot batch, as Triton refuses to load
    one: it could only be ignored, and the function would not batch as its manifest says."""
    if signature.batched or "max_batch_size" not in batching.model_fields_set:
        return
    if batching.max_batch_size == 0:
        return
    raise ConfigError(
        f"{manifest}: field `batching.max_batch_size`: found {batching.max_batch_size}, but the "
        f"model cannot batch ({unbatchable(signature)}); expected 0. "
        "Hint: set [batching] max_batch_size = 0 (every request runs alone), or export the "
        "model with a dynamic first dim to batch"
    )


def dims_of(value: onnx.ValueInfoProto) -> tuple[int, ...]:
    """A graph tensor's dims as the model declares them, -1 for a dynamic (named or unknown) one."""
    shape = value.type.tensor_type.shape.dim
    return tuple(d.dim_value if d.HasField("dim_value") else -1 for d in shape)


def _unranked_dims(spec: TensorSpec, batched: bool) -> TensorSpec:
    """An output the model declares no shape for (a Loop's, a custom op's): its dims unknown,
    shown as Triton's config would give them: -1 (after the batch axis, -1 too, where the model
    batches). Its rank, unknown until a run, may still hold the batch axis: it batches when
    every other tensor does, and build's batch-axis check (dryrun.check_batch_axis) runs it on a
    batch to see that its first axis holds the batch's rows; else build refuses it, saying so."""
    if spec.ranked:
        return spec
    return dataclasses.replace(spec, dims=(-1, -1) if batched else (-1,))


def _spec(
    value: onnx.ValueInfoProto, overrides: dict[str, TensorOverride], where: Path, kind: str
) -> TensorSpec:
    elem_type = value.type.tensor_type.elem_type
    try:
        datatype = datatypes.from_onnx(elem_type).name
    except ValueError:
        raise ConfigError(
            f"{where}: tensor `{value.name}`: ONNX type {_type_name(elem_type)} has no KServe v2 "
            f"datatype; expected one of {sorted(datatypes.DATATYPES)}. Hint: cast it to one in "
            "the model (Cast to INT8 from INT4, to FP16 or FP32 from a FLOAT8)"
        ) from None
    dims = dims_of(value)
    ranked = value.type.tensor_type.HasField("shape")
    if not ranked:  # no declared shape: unknown rank (any, for an input), not rank 0
        dims = (-1,)
    override = overrides.get(value.name)
    if override is None:
        return TensorSpec(value.name, datatype, dims, ranked=ranked)
    field = f"model.{kind}.{value.name}"
    if override.dims is not None:  # an unranked output's dims may be given whole
        dims = merge_dims(field, dims if ranked else (), override.dims, where, any_rank=not ranked)
        ranked = True
    if override.pad_axis is not None:
        check_pad_axis(f"{field}.pad_axis", override.pad_axis, dims, where)
    if kind == "inputs" and (override.follows is not None or override.ratio != 1.0):
        raise ConfigError(
            f"{where}: field `{field}`: `follows` and `ratio` describe outputs only "
            "(how an output's length follows a padded input)"
        )
    if kind == "inputs" and override.labels is not None:
        raise ConfigError(
            f"{where}: field `{field}.labels`: labels name an output's classes (the "
            "classification extension), not an input's"
        )
    if kind == "outputs" and (override.min_dims or override.max_dims) is not None:
        raise ConfigError(
            f"{where}: field `{field}`: `min_dims` and `max_dims` bound inputs only (the sizes "
            "a request may send)"
        )
    low, high = (
        size_bounds(f"{field}.{key}", dims, bound, where, least)
        for key, bound, least in (
            ("min_dims", override.min_dims, 0),  # 0: an empty axis (a decoder's first past)
            ("max_dims", override.max_dims, 1),
        )
    )
    if low and high and any(lo > hi >= 0 for lo, hi in zip(low, high, strict=True)):
        raise ConfigError(
            f"{where}: field `{field}`: min_dims {list(low)} exceed max_dims {list(high)}"
        )
    return TensorSpec(
        value.name,
        datatype,
        dims,
        override.pad_axis,
        override.pad_value,
        override.follows,
        override.ratio,
        min_dims=low,
        max_dims=high,
        labels=class_labels(f"{field}.labels", override.labels, where),
        ranked=ranked,
    )


def _type_name(elem_type: int) -> str:
    """ONNX's name of an element type and its number (`INT4 (22)`)."""
    try:
        return f"{onnx.TensorProto.DataType.Name(elem_type)} ({elem_type})"
    except ValueError:  # a number this onnx does not know
        return str(elem_type)


def _resolve_follows(spec: TensorSpec, inputs: list[TensorSpec], where: Path) -> TensorSpec:
    """An output's pad axis follows a padded input: the one named, or the only one there is."""
    if spec.pad_axis is None:
        if spec.follows is not None:
            raise ConfigError(
                f"{where}: field `model.outputs.{spec.name}.follows`: also give the output's "
                "pad_axis (the axis whose length follows the input)"
            )
        return spec
    padded = [s.name for s in inputs if s.pad_axis is not None]
    follows = spec.follows or (padded[0] if len(padded) == 1 else None)
    if follows not in padded:
        raise ConfigError(
            f"{where}: field `model.outputs.{spec.name}.follows`: found {spec.follows!r}, "
            f"expected one of the inputs with a pad_axis {padded}"
        )
    return dataclasses.replace(spec, follows=follows)


def _check_overrides_exist(
    section: ModelSection,
    inputs: list[onnx.ValueInfoProto],
    outputs: list[onnx.ValueInfoProto],
    where: Path,
) -> None:
    for kind, names, found in (
        ("inputs", section.inputs, inputs),
        ("outputs", section.outputs, outputs),
    ):
        known = [value.name for value in found]
        for name in names:
            if name not in known:
                raise ConfigError(
                    f"{where}: [model.{kind}.{name}]: the model has no {kind[:-1]} `{name}`; "
                    f"expected one of {known}{did_you_mean(name, known)}"
                )
