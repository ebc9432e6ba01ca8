"""What the v2 metadata routes answer, in the JSON shapes Triton gives them, as pure functions.

The model config is Triton's ModelConfig as JSON, complete enough for `tritonclient`'s
`get_model_config` and perf_analyzer: batched models list dims without the batch dim, and
`max_batch_size` is 0 for an unbatched model (Triton's rule).
"""

from __future__ import annotations

from typing import Any

from edgeserve.backends import BY_NAME, TritonNames
from edgeserve.manifest import Manifest
from edgeserve.types import Signature, TensorSpec

EXTENSIONS = (
    "binary_tensor_data",
    "classification",
    "logging",
    "model_configuration",
    "model_repository",
    "statistics",
    "system_shared_memory",
)


def server_metadata(version: str) -> dict[str, Any]:
    return {"name": "edgeserve", "version": version, "extensions": list(EXTENSIONS)}


def platform(backend_name: str) -> str:
    """Triton's metadata `platform`: the config's platform if it has one, else its backend."""
    names = _triton(backend_name)
    return names.platform or names.backend


def model_metadata(
    name: str, version: str, backend_name: str, signature: Signature
) -> dict[str, Any]:
    return {
        "name": name,
        "versions": [version],
        "platform": platform(backend_name),
        "inputs": [spec.to_json() for spec in signature.inputs],
        "outputs": [spec.to_json() for spec in signature.outputs],
    }


def model_config(
    name: str, backend_name: str, manifest: Manifest, signature: Signature
) -> dict[str, Any]:
    """Triton's ModelConfig JSON for this function (the fields clients and perf_analyzer read)."""
    names = _triton(backend_name)
    batching = manifest.batching
    max_batch_size = batching.max_batch_size if signature.batched else 0
    config: dict[str, Any] = {
        "name": name,
        "platform": names.platform,
        "backend": names.backend,
        "version_policy": {"latest": {"num_versions": 1}},
        "max_batch_size": max_batch_size,
        "input": [
            _tensor_config(spec, signature.batched, is_input=True) for spec in signature.inputs
        ],
        "output": [
            _tensor_config(spec, signature.batched, is_input=False) for spec in signature.outputs
        ],
        "instance_group": [
            {
                "name": name,
                "kind": names.instance_kind,
                "count": batching.instances,
                "gpus": [],
                "secondary_devices": [],
                "profile": [],
                "passive": False,
                "host_policy": "",
            }
        ],
        "default_model_filename": manifest.model.path,
        "model_transaction_policy": {"decoupled": False},
        "parameters": {
            "function_version": {"string_value": manifest.function.version},
            **_index_ranges(signature),
        },
    }
    if max_batch_size > 0:
        config["dynamic_batching"] = _dynamic_batching(manifest)
    return config


INDEX_RANGE = "index_range:"
"""Config parameter `index_range:<input>` = "low..high": the ids an input's lookup table allows
(the door refuses others), so a client such as `edgeserve bench URL` can make valid ones."""


def _index_ranges(signature: Signature) -> dict[str, dict[str, str]]:
    return {
        f"{INDEX_RANGE}{spec.name}": {"string_value": f"{low}..{high}"}
        for spec in signature.inputs
        if spec.index_range is not None
        for low, high in [spec.index_range]
    }


def _tensor_config(spec: TensorSpec, batched: bool, *, is_input: bool) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "name": spec.name,
        "data_type": config_datatype(spec.datatype),
        "dims": list(spec.dims[1:] if batched and _batch_axis(spec) else spec.dims),
        "is_shape_tensor": False,
    }
    if is_input:
        entry.update(format="FORMAT_NONE", optional=spec.optional, allow_ragged_batch=False)
    else:
        entry["label_filename"] = ""
    return entry


def _batch_axis(spec: TensorSpec) -> bool:
    """Whether a tensor of a batching model has its batch axis: an optional input of fixed
    first dim (a weight, a setting) is sent whole, its dims as they are."""
    return not spec.optional or spec.dims[:1] == (-1,)


def config_datatype(datatype: str) -> str:
    """v2 datatype -> Triton config data_type (`BYTES` is `TYPE_STRING` there)."""
    return "TYPE_STRING" if datatype == "BYTES" else f"TYPE_{datatype}"


def _dynamic_batching(manifest: Manifest) -> dict[str, Any]:
    batching = manifest.batching
    return {
        "preferred_batch_size": list(batching.preferred_batch_sizes),
        "max_queue_delay_microseconds": round(batching.max_queue_delay_ms * 1000),
        "preserve_ordering": False,
        "priority_levels": 0,
        "default_priority_level": 0,
        "default_queue_policy": {
            "timeout_action": "REJECT",
            "default_timeout_microseconds": round(batching.timeout_ms * 1000),
            "allow_timeout_override": True,  # a request's `timeout` parameter may shorten it
            "max_queue_size": batching.max_queue_size,
        },
    }


def _triton(backend_name: str) -> TritonNames:
    """How Triton names this backend (its row of the backend table)."""
    backend = BY_NAME.get(backend_name)
    return backend.triton if backend else TritonNames("", backend_name)
