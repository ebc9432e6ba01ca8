"""How a backend is asked to load a model: one value shared by every backend's constructor."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from edgeserve.backends.tensors import ShapeProfile
from edgeserve.errors import ConfigError

Precision = Literal["fp32", "fp16", "int8", "auto"]


@dataclass(frozen=True)
class LoadOptions:
    """`device` is "cpu" or "cuda:N"; `profile` bounds the input shapes (TensorRT needs one)."""

    precision: Precision = "fp32"
    threads: int = 0
    instances: int = 1
    device: str = "cpu"
    profile: ShapeProfile | None = None
    ir_path: Path | None = None
    cache_dir: Path | None = None
    buckets: bool | None = None
    """Run batches at bucket shapes in bound buffers (None: where CUDA is used)."""
    pad_axes: tuple[tuple[str, int], ...] = ()
    """(input, axis) pairs the batcher pads (the manifest's pad_axis): buckets round them up."""

    @property
    def cuda_device(self) -> int | None:
        """The CUDA device index, or None when the device is the CPU."""
        if self.device == "cpu":
            return None
        kind, _, index = self.device.partition(":")
        if kind != "cuda" or not (index or "0").isdigit():
            raise ConfigError(f"device {self.device!r}: expected 'cpu' or 'cuda:<index>'")
        return int(index or "0")
