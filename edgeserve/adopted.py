"""The function.toml `edgeserve init` writes for a model of the user's (pure text): its tensors
listed as comments, batching as the model and its batch-axis check allow, and a padding hint
for inputs of variable length."""

from __future__ import annotations

import json
import re
import textwrap
from collections.abc import Mapping

from edgeserve.dryrun import NotABatchAxis, SkippedCheck
from edgeserve.samples import v2_json_carries
from edgeserve.signature import unbatchable
from edgeserve.types import Signature, TensorSpec

DimNames = Mapping[str, Mapping[int, str]]
"""A model's named dims: {tensor: {axis: name}} (backends.sessions.dim_names)."""


def adopted_manifest(
    name: str,
    model_file: str,
    signature: Signature,
    dims: DimNames,
    checked: NotABatchAxis | SkippedCheck | None = None,
) -> str:
    """function.toml for a model: its tensors listed, batching as the model allows."""
    tensors = [*signature.inputs, *signature.outputs]
    width = min(max(len(_shown(spec.name)) for spec in tensors), NAME_COLUMN)
    lines = [
        f"# edgeserve function manifest, written by `edgeserve init` for {model_file}.",
        "# Every key, explained: `edgeserve help manifest` (the reference ships with edgeserve).",
        "",
        "[function]",
        f'name = "{name}"',
        'version = "1"',
        f"description = {toml_string(f'{model_file}, served as read from the model')}",
        "",
        "[model]",
        f"path = {toml_string(model_file)}",
        "# The model's tensors (-1: a dynamic dim). Without a handler, POST /invoke takes",
        '# {"<input>": nested list, ...} of the dims below and answers the outputs the same way;',
        *_samples_comment(signature),
        *(
            f"#   input   {_shown(s.name):<{width}}  {s.datatype} {_dims(s)}"
            for s in signature.inputs
        ),
        *(
            f"#   output  {_shown(s.name):<{width}}  {s.datatype} {_dims(s)}"
            for s in signature.outputs
        ),
        *([] if isinstance(checked, NotABatchAxis) else _padding_hint(signature, dims)),
        "",
        *_batching_lines(signature, checked),
    ]
    return "\n".join(lines) + "\n"


def _shown(name: str) -> str:
    """A tensor name as a comment lists it: quoted where it holds a line break or another
    control character, which would end the comment and leave the rest as invalid TOML."""
    return name if name.isprintable() else toml_string(name)


def _samples_comment(signature: Signature) -> list[str]:
    if v2_json_carries(signature):
        return [
            "# samples/request.json is such a request; samples/v2.json holds the same tensors as",
            "# a KServe v2 infer request, for POST /v2/models/<name>/infer.",
        ]
    return [
        "# samples/request.json is such a request (no samples/v2.json: v2 JSON cannot carry",
        "# BF16 inputs; send them in Triton's binary tensor extension).",
    ]


def _dims(spec: TensorSpec) -> str:
    """A tensor's dims as the manifest lists them, and what the model leaves open about it."""
    if spec.optional:
        return f"{list(spec.dims)} (optional: the model holds a default, used where not sent)"
    return str(list(spec.dims)) if spec.ranked else f"{list(spec.dims)} (no shape in the model)"


def _padding_hint(signature: Signature, dims: DimNames) -> list[str]:
    """Inputs with a dynamic non-batch dim could batch across lengths, if padding is harmless;
    an output whose dim has the same name (`seq`) then follows the input, so that each request
    gets back its own length (without it, serve warns that padding stays off)."""
    variable = [s for s in signature.required if -1 in s.dims[1:]] if signature.batched else []
    hints: list[str] = []
    followed: set[str] = set()
    for spec in variable:
        axis = spec.dims.index(-1, 1)
        hints += [
            f"# `{_shown(spec.name)}` varies in length along axis {axis}. If padding it does not",
            "# change the answer (a mask, or a model that ignores pad tokens), let requests of",
            "# different lengths batch together:",
            f"# [model.inputs.{toml_key(spec.name)}]",
            f"# pad_axis = {axis}",
            "# pad_value = 0",
        ]
        length = dims.get(spec.name, {}).get(axis)
        for output in signature.outputs:
            same = [k for k, dim in dims.get(output.name, {}).items() if k and dim == length]
            if length is None or not same or output.name in followed:
                continue
            followed.add(output.name)
            hints += [
                f"# and `{_shown(output.name)}`, whose axis {same[0]} is `{length}` too, follows",
                "# it:",
                f"# [model.outputs.{toml_key(output.name)}]",
                f"# pad_axis = {same[0]}",
                f"# follows = {toml_string(spec.name)}",
            ]
    return hints


def toml_key(name: str) -> str:
    """A tensor name as a TOML key: bare when TOML allows it, else quoted (`"input.1"`: a dot
    would make a table of `input`)."""
    return name if _BARE_KEY.fullmatch(name) else toml_string(name)


def toml_string(text: str) -> str:
    """`text` as a TOML basic string: a model file named `my "best".onnx` made function.toml
    invalid TOML, and `a\\b.onnx` a path to `a` + backspace. JSON's escapes are TOML's,
    except that JSON writes a character past U+FFFF as a surrogate pair TOML refuses, so those
    are written as themselves (ensure_ascii off), and DEL, which TOML refuses raw, escaped."""
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")


_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
NAME_COLUMN = 32
"""The widest the tensor list aligns names to: a 300-character exporter name padded every
line of it to 300 columns."""


def _batching_lines(
    signature: Signature, checked: NotABatchAxis | SkippedCheck | None
) -> list[str]:
    if isinstance(checked, NotABatchAxis):
        said = (
            "No batching: every first dim of the model is dynamic, as a batch axis is, but a "
            f"run of it showed its first axis is not one: {checked.finding}. Batching needs a "
            "model whose rows are independent (each row answered alone as in a batch), so "
            "every request runs alone."
        )
        return [*_comment(said), "[batching]", "max_batch_size = 0"]
    if not signature.batched:
        return _comment(
            f"No batching: the model has no batch axis ({unbatchable(signature)}), so every "
            "request runs alone. Export the model with a dynamic batch axis to batch."
        )
    unchecked = (
        _comment(
            f"Batching on, unchecked: the batch-axis check did not run (ONNX Runtime "
            f"{checked.reason}). Where a row's answer depends on its batch mates, set "
            "max_batch_size = 0."
        )
        if isinstance(checked, SkippedCheck)
        else []
    )
    return [*unchecked, "[batching]", "max_batch_size = 32", "max_queue_delay_ms = 2.0"]


def _comment(text: str) -> list[str]:
    return textwrap.wrap(text, 96, initial_indent="# ", subsequent_indent="# ")
