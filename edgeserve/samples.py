"""Example inputs of a function: files of its samples/ folder, and tensors made from its signature.

Read by build (the precision check), the runtime (warm-up), `invoke` and `bench`, so a sample
means the same thing everywhere: `*.json` is a v2 infer request (or else an /invoke payload),
an image is an /invoke body.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from edgeserve.datatypes import DATATYPES, bf16_values
from edgeserve.errors import InvalidInput
from edgeserve.types import Signature, TensorDict, TensorSpec
from edgeserve.values import spec_array

IMAGE_TYPES = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg"}
"""Image suffixes a function's samples may have, and the Content-Type each is sent with."""
EXAMPLE_DYNAMIC_DIM = 32
"""Size given to dynamic non-batch dims of made-up inputs: large enough for conv and pooling."""
RANDOM_INT_HIGH = 16
"""Random integers lie in [0, 16): small enough to index an embedding or a class table; an
input with an `index_range` (a smaller table, BERT's 2 token types) gets ids within it."""
MASK_WORD = "mask"
"""An integer input named like this (`attention_mask`) gets ones: every token attended."""


def sample_files(folder: Path) -> list[Path]:
    """The files of a samples/ folder, sorted (a folder inside it, even one named a.json, is
    not a sample)."""
    return sorted(path for path in folder.iterdir() if path.is_file())


def is_media(content_type: str) -> bool:
    """Whether a body of this media type is a file (an image, a recording) that a handler
    decodes, not the model's tensors."""
    return content_type.startswith(("image/", "audio/", "video/"))


def content_type(path: Path) -> str:
    """The Content-Type a sample file is sent with."""
    suffix = path.suffix.lower()
    if suffix == ".json":
        return "application/json"
    return IMAGE_TYPES.get(suffix, "application/octet-stream")


def is_v2_request(payload: Any) -> bool:
    """Whether a JSON sample is a v2 infer request (else it is an /invoke payload)."""
    return isinstance(payload, dict) and isinstance(payload.get("inputs"), list)


def v2_inputs(payload: Mapping[str, Any]) -> tuple[TensorDict, dict[str, str]]:
    """The tensors of a v2 JSON infer request and their datatypes; BYTES elements as bytes.

    Raises KeyError, TypeError or ValueError when an input lacks name, datatype, shape or data.
    """
    tensors = {t["name"]: _tensor(t) for t in payload["inputs"]}
    return tensors, {t["name"]: t["datatype"] for t in payload["inputs"]}


def _tensor(tensor: Mapping[str, Any]) -> np.ndarray:
    datatype, shape = tensor["datatype"], tuple(tensor["shape"])
    if datatype == "BYTES":
        data = [x.encode() if isinstance(x, str) else bytes(x) for x in np.ravel(tensor["data"])]
        return np.array(data, dtype=np.object_).reshape(shape)
    return np.asarray(tensor["data"], dtype=DATATYPES[datatype].numpy).reshape(shape)


def example_inputs(
    signature: Signature, rows: int, rng: np.random.Generator | None = None
) -> TensorDict:
    """Inputs of the signature's shapes, `rows` rows when batched: `plain_array`'s values, or
    random with `rng` (the required ones: optional inputs keep the model's defaults)."""
    shapes = _example_shapes(signature, rows)
    tensors = {}
    for spec in signature.required:
        if rng is None:
            tensors[spec.name] = plain_array(spec, shapes[spec.name])
        else:
            tensors[spec.name] = random_input(rng, spec, shapes[spec.name])
    return tensors


def _example_shapes(signature: Signature, rows: int) -> dict[str, tuple[int, ...]]:
    """Each required input's shape: `rows` on the batch axis, `_example_dim` on the others
    dynamic, an axis the model names as a sum of others' (`SummedDim`) their sizes added up."""
    shapes = {}
    for spec in signature.required:
        dims = [_example_dim(spec, axis) if dim < 0 else dim for axis, dim in enumerate(spec.dims)]
        shapes[spec.name] = [rows, *dims[1:]] if signature.batched else dims
    for summed in signature.summed:
        (name, axis), terms = summed.place, summed.terms
        if name in shapes and all(term in shapes for term, _ in terms):
            shapes[name][axis] = summed.constant + sum(shapes[term][at] for term, at in terms)
    return {name: tuple(dims) for name, dims in shapes.items()}


def random_sample(signature: Signature) -> TensorDict:
    """One row of small random values, dynamic dims at EXAMPLE_DYNAMIC_DIM (always the same)."""
    return example_inputs(signature, 1, np.random.default_rng(0))


def with_plain_integers(signature: Signature, tensors: TensorDict) -> TensorDict:
    """`tensors` with each integer input at `plain_array`'s values (ones): what a model reads
    a count or a size from (a TopK's k) takes those where it may refuse random ones."""
    specs = {spec.name: spec for spec in signature.inputs}
    integers = {name for name, spec in specs.items() if spec.datatype.startswith(("INT", "UINT"))}
    return {
        name: plain_array(specs[name], array.shape) if name in integers else array
        for name, array in tensors.items()
    }


def plain_array(spec: TensorSpec, shape: tuple[int, ...]) -> np.ndarray:
    """Values any model should take: zeros, but ones for integers (within the input's
    `index_range`), since models read a count, a size or a divisor from an integer input
    (OpenVINO's TopK refuses k = 0, ONNX Runtime an integer Div by 0), and empty text."""
    if spec.datatype == "BYTES":  # zeros of object dtype are ints, not bytes
        return np.full(shape, b"", dtype=np.object_)
    dtype = DATATYPES[spec.datatype].numpy
    if not spec.datatype.startswith(("INT", "UINT")):
        return np.zeros(shape, dtype=dtype)
    low, high = spec.index_range or (0, 1)
    return np.full(shape, min(max(1, low), high), dtype=dtype)


def plain_values(spec: TensorSpec) -> str:
    """What `plain_array` fills `spec` with, in words (a warm-up that failed says it)."""
    if spec.datatype == "BYTES":
        return "empty text"
    value = plain_array(spec, ()).item()
    return {0: "zeros", 1: "ones"}.get(int(value), f"{value}s")


def _example_dim(spec: TensorSpec, axis: int) -> int:
    """EXAMPLE_DYNAMIC_DIM, within the input's min_dims and max_dims."""
    size = EXAMPLE_DYNAMIC_DIM
    if spec.min_dims is not None and spec.min_dims[axis] != -1:
        size = max(size, spec.min_dims[axis])
    if spec.max_dims is not None and spec.max_dims[axis] != -1:
        size = min(size, spec.max_dims[axis])
    return size


def random_input(rng: np.random.Generator, spec: TensorSpec, shape: tuple[int, ...]) -> np.ndarray:
    """Random values the server accepts for this input: integer ids within its `index_range`
    (the door refuses others), ones for an integer mask, else `_random_array`'s."""
    if not spec.datatype.startswith(("INT", "UINT")):
        return _random_array(rng, spec.datatype, shape)
    high = RANDOM_INT_HIGH if spec.index_range is None else spec.index_range[1] + 1
    if MASK_WORD in spec.name.lower() and high > 1:
        return np.ones(shape, dtype=DATATYPES[spec.datatype].numpy)
    return _random_array(rng, spec.datatype, shape, min(high, RANDOM_INT_HIGH))


def _random_array(
    rng: np.random.Generator, datatype: str, shape: tuple[int, ...], int_high: int = RANDOM_INT_HIGH
) -> np.ndarray:
    """Random values of a v2 datatype: fractions in [0, 1), ints in [0, int_high), booleans,
    short words."""
    if datatype == "BYTES":
        return np.array(
            [bytes(rng.integers(97, 123, 8, dtype=np.uint8)) for _ in range(int(np.prod(shape)))],
            dtype=np.object_,
        ).reshape(shape)
    if datatype == "BF16":
        return (rng.random(shape, dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16)
    dtype = DATATYPES[datatype].numpy
    if dtype.kind == "f":
        return rng.random(shape).astype(dtype)
    if dtype.kind == "b":
        return rng.random(shape) < 0.5
    return rng.integers(0, max(int_high, 1), shape).astype(dtype)


def json_samples(
    folder: Path | None, signature: Signature, handler: bool
) -> list[tuple[str, TensorDict]]:
    """The JSON samples of a samples/ folder that hold the model's inputs (`json_sample`),
    each named as `samples/<file>`."""
    if folder is None or not folder.is_dir():
        return []
    found = ((path, json_sample(path, signature, handler)) for path in sample_files(folder))
    return [(f"samples/{path.name}", t) for path, t in found if t is not None]


def json_sample(path: Path, signature: Signature, handler: bool) -> TensorDict | None:
    """The model's inputs held by a JSON sample, None where it holds others (or is not JSON):
    a v2 request's tensors; without a `handler` an /invoke payload's too (`init` writes one),
    since /invoke then hands the model its JSON as the inputs."""
    if path.suffix != ".json":
        return None
    try:
        payload = orjson.loads(path.read_bytes())
        if is_v2_request(payload):
            tensors = v2_inputs(payload)[0]
        elif not handler and isinstance(payload, dict) and _named(payload, signature):
            specs = [spec for spec in signature.inputs if spec.name in payload]
            tensors = {spec.name: spec_array(spec, payload[spec.name]) for spec in specs}
        else:
            return None
    except (OSError, orjson.JSONDecodeError, KeyError, TypeError, ValueError, InvalidInput):
        return None  # not a tensor sample, or not one of this model's
    return tensors if fits_signature(tensors, signature) else None


def _named(tensors: Any, signature: Signature) -> bool:
    """Whether `tensors` are named as the model's inputs: each required one, optional ones."""
    return (
        {s.name for s in signature.required} <= set(tensors) <= {s.name for s in signature.inputs}
    )


def fits_signature(batch: TensorDict, signature: Signature) -> bool:
    """The model's inputs, each of a shape its dims allow (-1: any size)."""
    specs = {spec.name: spec for spec in signature.inputs}
    return _named(batch, signature) and all(
        specs[name].fits(value.shape) for name, value in batch.items()
    )


def sample_request(signature: Signature, tensors: TensorDict | None = None) -> dict[str, Any]:
    """An /invoke request of the model's own tensors (for a function without a handler):
    `tensors`, else one row (batch axis included when batched) of `random_sample`'s (BF16 as
    numbers, as /invoke takes them, not as their raw bits)."""
    tensors = random_sample(signature) if tensors is None else tensors
    bf16 = {spec.name for spec in signature.inputs if spec.datatype == "BF16"}
    return {
        name: json_values(bf16_values(array) if name in bf16 else array)
        for name, array in tensors.items()
    }


def sample_v2_request(
    signature: Signature, tensors: TensorDict | None = None
) -> dict[str, Any] | None:
    """`sample_request`'s tensors as a KServe v2 JSON infer request; None where an input is
    BF16, which v2 JSON has no numbers for (Triton's binary extension carries it)."""
    if not v2_json_carries(signature):
        return None
    return v2_request(random_sample(signature) if tensors is None else tensors, signature)


def v2_json_carries(signature: Signature) -> bool:
    """Whether v2 JSON can carry the model's inputs: no BF16 (v2 JSON has no numbers for it)."""
    return all(spec.datatype != "BF16" for spec in signature.required)


def v2_request(tensors: TensorDict, signature: Signature) -> dict[str, Any]:
    """A v2 JSON infer request of `tensors`, the model's inputs, in the model's order."""
    return {
        "inputs": [
            {"name": spec.name, "datatype": spec.datatype, "shape": list(tensors[spec.name].shape),
             "data": json_values(tensors[spec.name].ravel())}
            for spec in signature.inputs
            if spec.name in tensors
        ]
    }  # fmt: skip


def json_values(array: np.ndarray) -> Any:
    """An array as nested JSON lists: floats rounded to 3 places, bytes as text."""
    if array.dtype.kind == "f":
        return np.round(array.astype(np.float64), 3).tolist()
    if array.dtype.kind == "O":
        return np.vectorize(lambda value: value.decode("utf-8"), otypes=[object])(array).tolist()
    return array.tolist()
