"""What a bench sends: the function's samples, or tensors synthesized from the model's metadata.

Bodies are built once, before the load starts. v2 requests go out in Triton's binary tensor
extension by default (JSON header, `Inference-Header-Content-Length`, raw tensor bytes), the
way perf_analyzer and tritonclient send them; `protocol="json"` sends JSON tensors instead.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from edgeserve.dataplane.metadata import INDEX_RANGE
from edgeserve.dataplane.raw import tensor_bytes
from edgeserve.errors import ConfigError, did_you_mean
from edgeserve.samples import IMAGE_TYPES, is_v2_request, random_input, sample_files, v2_inputs
from edgeserve.types import TensorDict, TensorSpec

DEFAULT_DYNAMIC_DIM = 16
"""A dynamic (-1) non-batch dim without a --shape override becomes this."""
INVOKE_ITEMS = 0
"""An /invoke request becomes as many items as the handler makes: the server counts them."""


@dataclass(frozen=True)
class Body:
    """One request before the HTTP framing: path, headers, body bytes and batch rows."""

    path: str
    headers: dict[str, str]
    body: bytes
    items: int


@dataclass(frozen=True)
class ModelInputs:
    """The inputs of a served model, from `GET /v2/models/{m}` and its config."""

    name: str
    inputs: tuple[tuple[str, str, tuple[int, ...]], ...]  # (name, datatype, shape)
    batched: bool
    index_ranges: Mapping[str, tuple[int, int]] = field(default_factory=dict)

    @classmethod
    def from_server(cls, metadata: Mapping[str, Any], config: Mapping[str, Any]) -> ModelInputs:
        """The inputs a request must send (an input the config marks `optional`, as Triton's
        does, is left to the model's default, as perf_analyzer leaves it)."""
        optional = {entry.get("name") for entry in config.get("input", ()) if entry.get("optional")}
        specs = tuple(
            (spec["name"], spec["datatype"], tuple(int(d) for d in spec["shape"]))
            for spec in metadata["inputs"]
            if spec["name"] not in optional
        )
        batched = int(config.get("max_batch_size", 0)) > 0
        return cls(metadata["name"], specs, batched, _index_ranges(config))


def _index_ranges(config: Mapping[str, Any]) -> dict[str, tuple[int, int]]:
    """The inputs' `index_range:<name>` config parameters ("low..high"; edgeserve's own, so a
    server that lacks them, or Triton, leaves ids unbounded but for random_input's own)."""
    ranges = {}
    for key, value in (config.get("parameters") or {}).items():
        text = value.get("string_value", "") if isinstance(value, Mapping) else ""
        low, _, high = str(text).partition("..")
        if key.startswith(INDEX_RANGE) and _is_int(low) and _is_int(high):
            ranges[key.removeprefix(INDEX_RANGE)] = (int(low), int(high))
    return ranges


def _is_int(text: str) -> bool:
    return text.removeprefix("-").isdigit()


def parse_shapes(values: Sequence[str]) -> dict[str, tuple[int, ...]]:
    """`--shape x:1,16` (perf_analyzer's form, batch dim excluded) -> {"x": (1, 16)}."""
    shapes = {}
    for value in values:
        name, _, dims = value.partition(":")
        parts = dims.split(",")
        if not name or not all(part.isdigit() and int(part) > 0 for part in parts):
            raise ConfigError(f"--shape {value!r}: expected NAME:D1,D2,... with positive dims")
        shapes[name] = tuple(int(part) for part in parts)
    return shapes


def synthesize(
    model: ModelInputs, shapes: Mapping[str, tuple[int, ...]], batch_size: int, seed: int = 0
) -> TensorDict:
    """Random tensors of each input's datatype and shape (dynamic dims resolved). An input not
    in `shapes` whose declared shape is one that is (a BERT's attention_mask beside its
    input_ids: [-1, -1] both) is sized alike: `--shape input_ids:64` alone sent 16-token masks,
    and every request failed on the model's tied `seq` dim."""
    names = [name for name, _, _ in model.inputs]
    for unknown in sorted(set(shapes) - set(names)):  # silently ignored, it sized nothing
        raise ConfigError(
            f"--shape {unknown}: the model has no input `{unknown}`; expected one of {names}"
            f"{did_you_mean(unknown, names)} (NAME is an input's name, not a dim's)"
        )
    rng = np.random.default_rng(seed)
    tensors = {}
    alike: dict[tuple[int, ...], tuple[int, ...]] = {}  # a declared shape: the first size given
    for name, _, shape in model.inputs:
        if name in shapes:
            alike.setdefault(shape, shapes[name])
    for name, datatype, shape in model.inputs:
        dims = shape[1:] if model.batched else shape
        if name not in shapes and shape in alike and len(alike[shape]) == len(dims):
            dims = alike[shape]
        elif name in shapes:
            if len(shapes[name]) != len(dims):
                raise ConfigError(
                    f"--shape {name}: expected {len(dims)} dims (batch dim excluded) "
                    f"to match {list(shape)}, got {list(shapes[name])}"
                )
            dims = shapes[name]
        dims = tuple(DEFAULT_DYNAMIC_DIM if d < 0 else d for d in dims)
        full = (batch_size, *dims) if model.batched else dims
        spec = TensorSpec(name, datatype, shape, index_range=model.index_ranges.get(name))
        tensors[name] = random_input(rng, spec, full)
    return tensors


def encode_infer(
    model: str, tensors: TensorDict, datatypes: Mapping[str, str], binary: bool, items: int
) -> Body:
    """A v2 infer request for these tensors, binary (Triton's extension) or JSON."""
    path = f"/v2/models/{model}/infer"
    if not binary:
        inputs = [_json_tensor(name, datatypes[name], array) for name, array in tensors.items()]
        body = orjson.dumps({"inputs": inputs})
        return Body(path, {"Content-Type": "application/json"}, body, items)
    raws = [tensor_bytes(array, datatypes[name]) for name, array in tensors.items()]
    header = orjson.dumps(
        {
            "inputs": [
                _header_tensor(name, datatypes[name], array, len(raw))
                for (name, array), raw in zip(tensors.items(), raws, strict=True)
            ],
            "parameters": {"binary_data_output": True},
        }
    )
    headers = {"Inference-Header-Content-Length": str(len(header))}
    return Body(path, headers, header + b"".join(raws), items)


def _header_tensor(name: str, datatype: str, array: np.ndarray, size: int) -> dict[str, Any]:
    return {
        "name": name,
        "datatype": datatype,
        "shape": list(array.shape),
        "parameters": {"binary_data_size": size},
    }


def _json_tensor(name: str, datatype: str, array: np.ndarray) -> dict[str, Any]:
    if datatype == "BF16":
        raise ConfigError(f"input {name}: BF16 travels only in binary; drop --protocol json")
    flat = array.ravel().tolist()
    if datatype == "BYTES":
        flat = [x.decode("utf-8", "replace") if isinstance(x, bytes) else str(x) for x in flat]
    return {"name": name, "datatype": datatype, "shape": list(array.shape), "data": flat}


def has_samples(folder: Path) -> bool:
    """Whether `folder` holds a file `read_samples` would send."""
    kinds = {*IMAGE_TYPES, ".json"}
    return folder.is_dir() and any(path.suffix.lower() in kinds for path in folder.iterdir())


def read_samples(samples: Path, model: ModelInputs, binary: bool) -> list[Body]:
    """samples/*.json (v2 infer requests, or /invoke payloads) and images (/invoke bodies)."""
    bodies = [body for _, body in sample_bodies(samples, model, binary)]
    if not bodies:
        raise ConfigError(f"{samples}: no *.json or image samples; Hint: leave out --inputs")
    return bodies


def sample_bodies(samples: Path, model: ModelInputs, binary: bool) -> list[tuple[Path, Body]]:
    """Each sample file a request is made of (other files, a sample's expected answer, are
    left out), with that request: what `doctor` sends and names its findings by."""
    bodies = []
    for path in sample_files(samples):
        suffix = path.suffix.lower()
        if suffix in IMAGE_TYPES:
            headers = {"Content-Type": IMAGE_TYPES[suffix]}
            bodies.append((path, Body("/invoke", headers, path.read_bytes(), INVOKE_ITEMS)))
        elif suffix == ".json":
            bodies.append((path, _json_sample(path, model, binary)))
    return bodies


def _json_sample(path: Path, model: ModelInputs, binary: bool) -> Body:
    try:
        payload = orjson.loads(path.read_bytes())
    except orjson.JSONDecodeError as exc:
        raise ConfigError(f"{path}: not valid JSON: {exc}") from None
    if not is_v2_request(payload):
        headers = {"Content-Type": "application/json"}
        return Body("/invoke", headers, orjson.dumps(payload), INVOKE_ITEMS)
    try:
        tensors, datatypes = v2_inputs(payload)
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"{path}: a v2 input needs name, datatype, shape, data ({exc})") from None
    rows = next(iter(tensors.values())).shape[0] if model.batched and tensors else 1
    return encode_infer(model.name, tensors, datatypes, binary, rows)
