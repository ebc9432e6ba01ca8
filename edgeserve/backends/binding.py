"""A session bound to fixed buffers at one bucket shape (ONNX Runtime's IOBinding).

The batch is written straight into the bound host input buffer (the one copy a request's bytes
make on their way to the GPU) and the outputs land in bound host output buffers. On CUDA both
are pinned (page-locked) memory: the input goes to a device buffer bound once, by one DMA copy
per run (`update_inplace`; ONNX Runtime copies a bound host input only when it is bound, so a
host input bound once would be read once), and ONNX Runtime writes the outputs back by DMA.
On the CPU the host buffers are bound directly and nothing is copied.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from edgeserve.backends import cuda
from edgeserve.backends.buckets import write_parts
from edgeserve.shapes import Shape
from edgeserve.types import TensorDict


class HostMemory:
    """Host buffers for bindings: pinned when a GPU is used (and cuda-python imports)."""

    def __init__(self, pin: bool) -> None:
        self.pinned = pin
        self._pointers: list[int] = []

    def array(self, shape: Shape, dtype: np.dtype) -> np.ndarray:
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        if not self.pinned:
            return np.empty(shape, dtype)
        pointer, flat = cuda.pinned(nbytes, np.dtype(dtype))
        self._pointers.append(pointer)
        return flat.reshape(shape)

    def free(self) -> None:
        """Release pinned memory; no array handed out may be used afterwards."""
        for pointer in self._pointers:
            cuda.free_pinned(pointer)
        self._pointers = []


class Binding:
    """One bucket session's IOBinding over input and output buffers of the bucket's shapes."""

    def __init__(
        self,
        session: Any,
        inputs: Mapping[str, np.ndarray],
        outputs: Mapping[str, np.ndarray],
        memory: HostMemory,
        cuda_device: int | None,
    ) -> None:
        import onnxruntime as ort

        self._session = session
        self.inputs = {name: memory.array(a.shape, a.dtype) for name, a in inputs.items()}
        self.outputs = {name: memory.array(a.shape, a.dtype) for name, a in outputs.items()}
        self._io = session.io_binding()
        self._on_device: dict[str, Any] = {}
        for name, array in self.inputs.items():
            if cuda_device is None:
                self._io.bind_input(
                    name, "cpu", 0, array.dtype, list(array.shape), array.ctypes.data
                )
                continue
            value = ort.OrtValue.ortvalue_from_shape_and_type(
                list(array.shape), array.dtype.type, "cuda", cuda_device
            )
            self._io.bind_ortvalue_input(name, value)
            self._on_device[name] = value
        for name, array in self.outputs.items():
            self._io.bind_output(name, "cpu", 0, array.dtype, list(array.shape), array.ctypes.data)

    def stage(self, parts: Sequence[TensorDict], fills: Mapping[str, float]) -> Staged:
        """Write the parts' rows one after another; what a part lacks on a padded axis is fill."""
        rows = write_parts(self.inputs, parts, fills)
        return Staged({name: buffer[:rows] for name, buffer in self.inputs.items()}, self)

    def run(self, rows: int) -> TensorDict:
        """Run the bound batch; the first `rows` rows of each output, copied out of the buffers."""
        for name, value in self._on_device.items():
            value.update_inplace(self.inputs[name])  # pinned host -> device, one DMA copy
        self._session.run_with_iobinding(self._io)
        self._io.synchronize_outputs()
        return {name: buffer[:rows].copy() for name, buffer in self.outputs.items()}


class Staged(dict[str, np.ndarray]):
    """A batch that already sits in a binding's input buffers: running it copies nothing in."""

    def __init__(self, views: TensorDict, binding: Binding) -> None:
        super().__init__(views)
        self.binding = binding
