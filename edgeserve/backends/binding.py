"""A session bound to fixed buffers at one bucket shape (ONNX Runtime's IOBinding).

The batch is written straight into the binding's host input buffer (the one copy a request's
bytes make on their way to the model). On the CPU the host buffers are bound directly and
nothing else is copied. On CUDA inputs and outputs are bound to device buffers: the batch goes to
the device in one copy from pinned (page-locked) host memory, and each output comes back in one.

With a graph id the run is a CUDA graph: ONNX Runtime captures the kernels of one run into a
graph and then launches the whole graph at once. A CRNN batch of 2 OCR lines on an H100 took
0.48 ms that way against 3.04 ms launched kernel by kernel (benchmarks/RESULTS-gpu.md). A graph
reads and writes the addresses it was captured with, so each binding (one per thread and bucket)
has its own graph, captured by its thread before serving: ONNX Runtime keeps graphs per thread,
and a capture beside another thread's run fails ("operation not permitted when stream is
capturing"). Its graphs are not safe to run from two threads at once either, so a session's runs
take turns (`lock`). A binding checks its graph when it is made: a replay must answer as a plain
run did.
"""

from __future__ import annotations

import abc
import contextlib
import functools
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from edgeserve.backends import cuda
from edgeserve.backends.buckets import write_parts
from edgeserve.backends.registered import DIRECT_BYTES, REGISTRY, Stream
from edgeserve.errors import BackendError
from edgeserve.shapes import Shape
from edgeserve.types import TensorDict

NO_GRAPH = -1
"""ONNX Runtime's graph id for a run that is neither captured nor replayed."""


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


class FirstUses:
    """The runs on one device share it; the first use of a bucket has it alone.

    A first use opens the bucket's session and warms a binding: cuDNN plans its kernels, and
    with graphs ONNX Runtime captures one. Beside another thread's run, that failed the run on
    an H100 ("CUDA failure 900: operation not permitted when stream is capturing", raised by a
    device-wide synchronize), graphs or not: the CRNN benchmark with `instances = 2` answered
    18 requests 500 at the start (benchmarks/RESULTS-gpu.md, ninth session). Buckets that fix
    every dim are all made before serving (`OnnxRuntime.warm_thread`); a dynamic axis that no
    bucket fixes meets new shapes while serving, and each such first use waits for the runs in
    flight and holds the next ones back until it is done."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._running = 0
        self._alone = False
        self._waiting_alone = 0  # first uses go before runs that arrive after them

    @contextlib.contextmanager
    def run(self) -> Iterator[None]:
        with self._changed:
            self._changed.wait_for(lambda: not (self._alone or self._waiting_alone))
            self._running += 1
        try:
            yield
        finally:
            with self._changed:
                self._running -= 1
                self._changed.notify_all()

    @contextlib.contextmanager
    def alone(self) -> Iterator[None]:
        with self._changed:
            self._waiting_alone += 1
            self._changed.wait_for(lambda: not (self._alone or self._running))
            self._waiting_alone -= 1
            self._alone = True
        try:
            yield
        finally:
            with self._changed:
                self._alone = False
                self._changed.notify_all()


class GraphMismatch(BackendError):
    """A binding's CUDA graph answered otherwise than a plain run of the same inputs."""


class Binding(abc.ABC):
    """Input buffers a batch is staged into; `run` answers the batch's rows."""

    inputs: dict[str, np.ndarray]
    _dirty = sys.maxsize
    """Rows past the last batch's that hold an earlier batch's values (at first: every row)."""

    def stage(self, parts: Sequence[TensorDict], fills: Mapping[str, float]) -> Staged:
        """Write the parts' rows one after another; what a part lacks on a padded axis is fill,
        and so are the bucket's rows past the batch's. The model runs those too, so they must
        not hold what the buffer held before (uninitialized memory, an earlier batch's rows): a
        model that reads a value (an index, a size) would fail on it or answer otherwise."""
        rows = write_parts(self.inputs, parts, fills)
        self._fill_past(rows, fills)
        return Staged(self._views(rows), self)

    def _fill_past(self, rows: int, fills: Mapping[str, float]) -> int:
        """Fill the rows from `rows` to the end of the batch before; that end."""
        end = min(self._dirty, len(next(iter(self.inputs.values()))))
        if rows < end:
            for name, buffer in self.inputs.items():
                buffer[rows:end].fill(fills.get(name, 0.0))
        self._dirty = rows
        return end

    def _views(self, rows: int) -> TensorDict:
        return {name: buffer[:rows] for name, buffer in self.inputs.items()}

    @abc.abstractmethod
    def run(self, rows: int) -> TensorDict:
        """Run the staged batch; the first `rows` rows of each output, copied out."""


class HostBinding(Binding):
    """The CPU: inputs and outputs bound in place, warmed by one plain run (on `plain`:
    `samples.plain_array`'s values of the bucket's shapes)."""

    def __init__(self, session: Any, plain: Mapping[str, np.ndarray], outputs: list[str]) -> None:
        self._session = session
        values = session.run(outputs, dict(plain))  # the warm-up, which also sizes the outputs
        self.inputs = {name: np.empty_like(array) for name, array in plain.items()}
        self.outputs = {name: np.empty_like(v) for name, v in zip(outputs, values, strict=True)}
        self._io = session.io_binding()
        for name, array in self.inputs.items():
            self._io.bind_input(name, "cpu", 0, array.dtype, list(array.shape), array.ctypes.data)
        for name, array in self.outputs.items():
            self._io.bind_output(name, "cpu", 0, array.dtype, list(array.shape), array.ctypes.data)

    def run(self, rows: int) -> TensorDict:
        self._session.run_with_iobinding(self._io)
        return {name: buffer[:rows].copy() for name, buffer in self.outputs.items()}


class DeviceBinding(Binding):
    """CUDA: device buffers in and out, host buffers for staging, and a graph id (or NO_GRAPH);
    `turn` is held around every run (a session with graphs runs one at a time).

    Made in three runs: a plain one on sample inputs (cuDNN plans its kernels, and the outputs'
    shapes size the output buffers), one on `plain` under the graph id (where ONNX Runtime
    captures the graph, with the buffers bound for good), and the sample again, which must
    answer as the first did (GraphMismatch otherwise)."""

    def __init__(
        self,
        session: Any,
        plain: Mapping[str, np.ndarray],
        outputs: list[str],
        memory: HostMemory,
        device: int,
        graph_id: int = NO_GRAPH,
        turn: threading.Lock | None = None,
    ) -> None:
        self._session = session
        self._io = session.io_binding()
        self._options = _run_options(graph_id)
        self._stream = None if REGISTRY.cudart is None else Stream(REGISTRY.cudart, device)
        self._copied = False  # whether the batch staged last is on the device already
        self._turn: contextlib.AbstractContextManager[Any] = turn or contextlib.nullcontext()
        self.inputs = {name: memory.array(a.shape, a.dtype) for name, a in plain.items()}
        self._device_inputs = {name: _on_device(a, device) for name, a in plain.items()}
        for name, value in self._device_inputs.items():
            self._io.bind_ortvalue_input(name, value)
        sample = {name: _sample(array) for name, array in plain.items()}
        expected = self._first_run(sample, outputs, device)
        self._device_outputs = {name: _on_device(a, device) for name, a in expected.items()}
        for name, value in self._device_outputs.items():
            self._io.bind_ortvalue_output(name, value)
        rows = len(next(iter(plain.values())))
        self._write(plain)
        self.run(rows)  # with a graph id: captured here
        self._write(sample)
        for name, answer in self.run(rows).items():
            if not np.allclose(answer, expected[name], rtol=1e-4, atol=1e-5, equal_nan=True):
                raise GraphMismatch(f"output `{name}` of graph {graph_id} differs from a plain run")

    def _first_run(
        self, sample: Mapping[str, np.ndarray], outputs: list[str], device: int
    ) -> dict[str, np.ndarray]:
        """Run `sample` plainly (no graph: the outputs are ONNX Runtime's); their values."""
        for name, value in self._device_inputs.items():
            value.update_inplace(sample[name])
        for name in outputs:
            self._io.bind_output(name, "cuda", device)
        with self._turn:
            self._session.run_with_iobinding(self._io, _run_options(NO_GRAPH))
        values = [value.numpy() for value in self._io.get_outputs()]
        return dict(zip(outputs, values, strict=True))

    def _write(self, inputs: Mapping[str, np.ndarray]) -> None:
        for name, array in self.inputs.items():
            array[...] = inputs[name]

    def stage(self, parts: Sequence[TensorDict], fills: Mapping[str, float]) -> Staged:
        """Large parts that lie in a registered arena go to the device from there, one copy
        each (backends/registered.py); the others are staged in the host buffer as on the CPU,
        and copied from it. Without such parts, the batch goes in one copy when it runs.

        The copies are waited for here: with stage-ahead, while the other worker's batch runs,
        so the wait (and the GIL it lets go) is not between two runs of the device."""
        in_place = self._in_place(parts)
        self._copied = bool(in_place)
        if not in_place:
            return super().stage(parts, fills)
        assert self._stream is not None
        try:
            rows = write_parts(self.inputs, parts, fills, skip=in_place)
            self._to_device(parts, in_place, rows, self._fill_past(rows, fills))
        finally:
            self._stream.wait()  # here, not in `run`: beside the other worker's run (device.py)
        rewrite = functools.partial(Binding.stage, self, parts, fills)
        return Staged(self._views(rows), self, rewrite)

    def _to_device(
        self, parts: Sequence[TensorDict], in_place: set[tuple[int, str]], rows: int, end: int
    ) -> None:
        """Queue each part's copy, from where it lies or from its staged rows, and the fill
        of the rows up to `end`."""
        assert self._stream is not None
        for name, buffer in self.inputs.items():
            target, row_bytes = self._device_inputs[name].data_ptr(), buffer.strides[0]
            start = 0
            for index, part in enumerate(parts):
                count = len(part[name])
                source = part[name] if (index, name) in in_place else buffer[start:]
                self._stream.to_device(
                    target + start * row_bytes, source.ctypes.data, count * row_bytes
                )
                start += count
            past = buffer[rows:end]
            self._stream.to_device(target + rows * row_bytes, past.ctypes.data, past.nbytes)

    def _in_place(self, parts: Sequence[TensorDict]) -> set[tuple[int, str]]:
        """(part index, input) of the parts the GPU can read where they lie, leased."""
        if self._stream is None:
            return set()
        found = set()
        for index, part in enumerate(parts):
            for name, array in part.items():
                buffer = self.inputs[name]
                fits = array.dtype == buffer.dtype and array.shape[1:] == buffer.shape[1:]
                if not (array.nbytes >= DIRECT_BYTES and fits and array.flags.c_contiguous):
                    continue
                if (region := REGISTRY.lease(array.ctypes.data, array.nbytes)) is not None:
                    self._stream.hold(region)
                    found.add((index, name))
        return found

    def run(self, rows: int) -> TensorDict:
        """The copies are ONNX Runtime's own: where the event loop is busy, every call that lets
        the GIL go waits to get it back (one more such call, a cuda-python device wait, made a
        contended CRNN batch 0.8 ms slower: RESULTS-gpu.md, fifth session).

        A run ends by synchronizing its own streams, so its outputs are complete when it
        returns. `IOBinding.synchronize_outputs` is not called: it synchronizes the whole
        device, holding the GIL, and so waited for the other threads' runs too (1.0 ms a
        CRNN batch with graphs on an H100, CUPTI's timeline: RESULTS-gpu.md, tenth session)."""
        with self._turn:
            if not self._copied:
                for name, value in self._device_inputs.items():
                    value.update_inplace(self.inputs[name])
            self._session.run_with_iobinding(self._io, self._options)
            return {name: value.numpy()[:rows] for name, value in self._device_outputs.items()}


def _run_options(graph_id: int) -> Any:
    import onnxruntime as ort

    options = ort.RunOptions()
    options.add_run_config_entry("gpu_graph_id", str(graph_id))
    return options


def _on_device(like: np.ndarray, device: int) -> Any:
    """Device memory of `like`'s shape and type (ONNX Runtime's allocator)."""
    import onnxruntime as ort

    return ort.OrtValue.ortvalue_from_shape_and_type(
        list(like.shape), like.dtype.type, "cuda", device
    )


def _sample(plain: np.ndarray) -> np.ndarray:
    """Inputs that tell a graph's answer from a stale one: numbers in [0, 1) for floats; the
    plain values for integers (a random token id or index could be out of the model's range)."""
    if not np.issubdtype(plain.dtype, np.floating):
        return plain
    return np.random.default_rng(0).random(plain.shape).astype(plain.dtype)


class Staged(dict[str, np.ndarray]):
    """A batch that already sits in a binding's input buffers: running it copies nothing in.
    Its values are the host buffers' rows, which lack the parts the GPU read in place until
    `on_host` writes them there (for a run at the batch's own shapes instead)."""

    def __init__(
        self, views: TensorDict, binding: Binding, rewrite: Callable[[], Staged] | None = None
    ) -> None:
        super().__init__(views)
        self.binding = binding
        self._rewrite = rewrite

    def on_host(self) -> TensorDict:
        return dict(self if self._rewrite is None else self._rewrite())
