"""ONNX Runtime: the backend that runs everywhere (CPU), and on NVIDIA through the CUDA EP.

Sessions use `threads` intra-op threads (0: ONNX Runtime's default), one inter-op thread and
sequential execution: parallelism comes from the batcher's instances, which call `run`
concurrently (a session is safe to share between threads). Precision is the model's own: ONNX
Runtime has no switch for it, so an fp16 or int8 model must be converted before the build.

On CUDA every batch runs at a bucket shape (`buckets`: rows and padded axes rounded up), in a
session opened and warmed for that shape alone, so no request makes cuDNN plan again (not for
text inputs, nor where a BF16 tensor crosses, which numpy cannot hold in a bound buffer); the batch
is assembled straight into that session's pinned, bound buffers (`binding`), and outputs are cut
back to the batch's rows. A padded axis is padded to its bucket rather than to the batch's widest
item; the batcher cuts outputs that follow it back to each request's own length as before.

With `cuda_graphs` (the manifest's [backend]), a bucket's session knows its shape (the model's
named dynamic dims are fixed to it, so shape arithmetic folds away and every node can stay on the
GPU) and each binding runs as a CUDA graph. A model ONNX Runtime cannot capture (a node on the
CPU, control flow) runs kernel by kernel, with a warning at load.
"""

from __future__ import annotations

import functools
import itertools
import logging
import re
import threading
from collections.abc import Mapping, Sequence
from importlib.util import find_spec
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from edgeserve.backends import cuda
from edgeserve.backends.binding import (
    Binding,
    DeviceBinding,
    FirstUses,
    HostBinding,
    HostMemory,
    Staged,
)
from edgeserve.backends.buckets import Buckets, batch_shapes, buckets_for
from edgeserve.backends.options import LoadOptions, TritonNames, missing_module, run_failure
from edgeserve.backends.registered import REGISTRY, loaded_cudart
from edgeserve.backends.sessions import (
    check_loads,
    dim_names,
    fixed_dims,
    new_session,
    providers,
    run_bf16,
    with_graphs,
)
from edgeserve.batching.rows import stack_rows
from edgeserve.errors import BackendError, EdgeserveError, InvalidElement, ModelRefused
from edgeserve.hardware import Platform
from edgeserve.samples import plain_array
from edgeserve.shapes import Shape
from edgeserve.types import Signature, TensorDict, TensorSpec

log = logging.getLogger(__name__)


class OnnxRuntime:
    """One InferenceSession shared by every worker thread; with buckets, one per bucket shape."""

    name = "onnxruntime"
    package: ClassVar[str | None] = "onnxruntime"
    platforms: ClassVar[tuple[str, ...]] = ("jetson", "nvidia-gpu", "cpu", "lambda")
    triton: ClassVar[TritonNames] = TritonNames("onnxruntime_onnx", "onnxruntime")
    prepared: ClassVar[tuple[str, ...]] = ()
    int_range: ClassVar[tuple[int, int] | None] = None
    optional_inputs: ClassVar[bool] = True  # fed by name, in place of their initializers
    modules: ClassVar[dict[str, str]] = {
        "onnxruntime": "the onnxruntime package is not installed (pip install onnxruntime)"
    }

    @classmethod
    def prepare(cls, model_path: Path, bundle: Path) -> None:
        """Nothing written (ONNX Runtime reads the ONNX model as it is), but the model must load:
        one of a custom domain's ops built, and `serve` then failed to start."""
        if find_spec("onnxruntime") is None:
            raise BackendError(f"onnxruntime: {cls.modules['onnxruntime']}")
        check_loads(model_path)

    @classmethod
    def available(cls, platform: Platform) -> str | None:
        return missing_module(cls.modules, platform)

    @classmethod
    def declines(cls, signature: Signature, model: Path) -> str | None:
        """Nothing: ONNX Runtime runs every tensor type an ONNX model has."""
        return None

    @classmethod
    def differs(cls, model: Path, signature: Signature) -> str | None:
        """Nothing: ONNX Runtime is what the other backends' answers are held to."""
        return None

    @classmethod
    def reaches_gpu(cls, platform: Platform) -> bool:
        """Only the onnxruntime-gpu wheel has the CUDA provider; the CPU wheel runs anywhere."""
        import onnxruntime as ort

        return platform.has_cuda and "CUDAExecutionProvider" in ort.get_available_providers()

    def __init__(self, model_path: Path, options: LoadOptions) -> None:
        import onnxruntime as ort

        self.signature = options.signature
        self.profile = options.profile
        cuda = (
            options.cuda_device
            if "CUDAExecutionProvider" in ort.get_available_providers()
            else None
        )
        if cuda is not None and hasattr(ort, "preload_dlls"):
            ort.preload_dlls()  # the pip nvidia-* CUDA / cuDNN libraries, before the session
        if cuda is not None and (cudart := loaded_cudart()) is not None:
            REGISTRY.enable(cudart)  # the fronts' arenas are read in place (registered.py)
        self.providers_requested = providers(cuda, tf32=options.precision != "fp32")
        self._model_path = model_path
        self._options = options
        self._output_names = [spec.name for spec in self.signature.outputs]
        every = (*self.signature.inputs, *self.signature.outputs)
        self._bf16 = frozenset(spec.name for spec in every if spec.datatype == "BF16")
        self._fills = {spec.name: spec.pad_value for spec in self.signature.inputs}
        bucketed = cuda is not None if options.buckets is None else options.buckets
        # text cannot sit in a bound buffer, nor BF16 in one of numpy's types (it crosses as
        # OrtValues: `run_bf16`); such a model runs at its batches' own shapes
        bindable = not self._bf16 and all(s.datatype != "BYTES" for s in self.signature.inputs)
        if bucketed and self._bf16:
            log.info("onnxruntime: BF16 tensors: no bound buffers, each batch at its own shape")
        self.shapes = (
            buckets_for(self.signature, self.profile) if bucketed and bindable else Buckets()
        )
        self.buckets = self.shapes.rows  # already warm at load: warming them again is cheap
        # bound buffers are per thread: on a GPU the batcher assembles the next batch into
        # another thread's buffers while one runs (batching/device.py)
        self.stages_ahead = bool(self.shapes.rows) and cuda is not None
        self._memory = HostMemory(pin=cuda is not None and _has_cuda_python())
        self._cuda = cuda
        # whether new bindings run as CUDA graphs (off for good once ONNX Runtime fails to
        # capture). Only where buckets decide every shape: then every binding is made, and its
        # graph captured, before serving (a capture beside another thread's run fails)
        # buckets hold the required inputs: a batch sending an optional one runs at its own
        # shapes (zeros bound in its place would stand in for the model's default)
        self._dims = {spec.name: spec.dims for spec in self.signature.required}
        self.graphs = cuda is not None and options.cuda_graphs and self.shapes.decides(self._dims)
        self._graph_ids = itertools.count()
        self._dim_names = dim_names(model_path) if self.graphs else {}
        self._sessions: dict[Key, Any] = {}
        self._turns: dict[Key, threading.Lock] = {}  # a graph session's runs, one at a time
        self._first_uses = FirstUses()  # a new bucket's session and binding: made alone
        self._refused: frozenset[Key] = frozenset()  # buckets the model failed on at warm-up
        self._local = threading.local()
        self._lock = threading.Lock()
        self._open_buckets()
        self.providers: list[str] = next(iter(self._sessions.values())).get_providers()
        if options.cuda_device is not None and "CUDAExecutionProvider" not in self.providers:
            log.warning("onnxruntime: CUDA was requested but only %s are usable", self.providers)

    @property
    def plans(self) -> int:
        """Sessions opened so far: each plans its kernels for the shapes it runs (see buckets)."""
        return len(self._sessions)

    def assemble(self, parts: Sequence[TensorDict], fills: Mapping[str, float]) -> TensorDict:
        """A batch of `parts`, written straight into its bucket's bound buffers when it has one
        (a batch sending an optional input has none)."""
        bucketed = self.shapes.rows and parts[0].keys() == self._dims.keys()
        bucket = self.shapes.shapes(batch_shapes(parts)) if bucketed else None
        if bucket is None or (self._refused and _key(bucket) in self._refused):
            return stack_rows(parts, fills)
        return self._binding(bucket).stage(parts, fills)

    def infer(self, inputs: TensorDict) -> TensorDict:
        if not isinstance(inputs, Staged) and self.shapes.rows:
            inputs = self.assemble([inputs], self._fills)
        feeds = {} if isinstance(inputs, Staged) else {n: _text(n, a) for n, a in inputs.items()}
        try:
            with self._first_uses.run():
                if isinstance(inputs, Staged):
                    return self._run_staged(inputs)
                values = self._run(self._session(()), feeds)
        except EdgeserveError:
            raise
        except Exception as exc:  # its Fail, InvalidArgument, RuntimeException, ...: the text says
            raise run_failure(self.name, _message(exc)) from None
        return dict(zip(self._output_names, values, strict=True))

    def _run_staged(self, staged: Staged) -> TensorDict:
        """Run a batch in its bound buffers. Outputs whose shapes follow the inputs' values (a
        TopK of the k a request sends) cannot go into buffers sized once, at the warm-up:
        ONNX Runtime refuses every such run. The bindings then go, for good, and this batch
        and the next run at their own shapes."""
        try:
            return staged.binding.run(len(next(iter(staged.values()))))
        except Exception as exc:
            if _PREALLOCATED not in str(exc):
                raise
            self._unbind(f"an output's shape follows the inputs' values ({str(exc)[:200]})")
        values = self._run(self._session(()), staged.on_host())
        return dict(zip(self._output_names, values, strict=True))

    def _run(self, session: Any, feeds: TensorDict) -> list[np.ndarray]:
        if not self._bf16:
            return list(session.run(self._output_names, feeds))
        return run_bf16(session, self._output_names, feeds, self._bf16)

    def close(self) -> None:
        self._sessions.clear()
        self._local = threading.local()
        self._memory.free()

    def warm_thread(self) -> None:
        """This thread's bound buffers for every bucket, each warmed by a first run (where
        cuDNN plans) and its CUDA graph captured: the batcher calls it on each of its threads,
        one at a time, before serving."""
        if self.shapes.decides(self._dims):
            for shapes in self.shapes.every(self._dims):
                if _key(shapes) not in self._refused:
                    self._binding(shapes)

    def _open_buckets(self) -> None:
        """Open and warm a session per bucket shape (none without buckets, or where a dynamic
        axis no bucket decides leaves the shapes unknown: one for any shape). A bucket the
        model fails on (a Reshape to a width an input gives, made-up values a model refuses
        at one batch size) is dropped alone: batches that would run in it run at their own
        shapes, as without buckets, the others in theirs. Where it fails on every bucket,
        buckets are off (the engine's warm-up then says what the model failed on)."""
        if self.shapes.decides(self._dims):
            failed, every = self._warm_buckets()
            if not failed:
                return
            if len(failed) < every:
                self._refused = frozenset(failed)
                words = "; ".join(f"{dict(key)}: {said}" for key, said in failed.items())
                log.warning(
                    "onnxruntime: %d of %d buckets are off, the model failed on them at warm-up "
                    "(%s): batches of their shapes run at their own",
                    len(failed),
                    every,
                    words,
                )
            else:
                self._unbind(f"the warm-up of its buckets failed ({next(iter(failed.values()))})")
        self._session(())

    def _warm_buckets(self) -> tuple[dict[Key, str], int]:
        """Warm this thread's binding of every bucket; those the model failed on (ModelRefused:
        the values, at that shape) with its words, their sessions closed; how many there are."""
        failed: dict[Key, str] = {}
        every = list(self.shapes.every(self._dims))
        for shapes in every:
            try:
                self._binding(shapes)
            except EdgeserveError:
                raise
            except Exception as exc:
                failure = run_failure(self.name, _message(exc))
                if not isinstance(failure, ModelRefused):
                    raise
                failed[_key(shapes)] = failure.message[:300]
                self._sessions.pop(_key(shapes), None)
                self._turns.pop(_key(shapes), None)
        return failed, len(every)

    def _unbind(self, why: str) -> None:
        """Bound buffers, buckets and CUDA graphs off for good: each batch at its own shapes."""
        if self.shapes.rows:
            log.warning("onnxruntime: bound buffers and CUDA graphs are off: %s", why)
        self.shapes, self.buckets, self.graphs, self.stages_ahead = Buckets(), (), False, False

    def _session(self, key: Key) -> Any:
        with self._lock:
            if key not in self._sessions:
                if key and self._sessions:
                    log.info("onnxruntime: opening a session for the new bucket %s", dict(key))
                self._sessions[key] = self._open(key)
            return self._sessions[key]

    def _open(self, key: Key) -> Any:
        """A session for one bucket (its shape fixed, and graphs on where they work), or for any
        shape (key ())."""
        fixed = fixed_dims(self._dim_names, dict(key))
        new = functools.partial(new_session, self._model_path, self._options, fixed=fixed)
        if not (key and self.graphs):
            return new(self.providers_requested)
        try:
            session = new(with_graphs(self.providers_requested))
        except BackendError as exc:
            self._no_graphs(exc)
            return new(self.providers_requested)
        self._turns[key] = threading.Lock()
        return session

    def _binding(self, shapes: dict[str, Shape]) -> Binding:
        """This thread's binding for a bucket (made, with its warm-up runs, on first use)."""
        key = _key(shapes)
        bindings = self._local.__dict__.setdefault("bindings", {})
        if key not in bindings:
            with self._first_uses.alone():
                bindings[key] = self._bind(key, self._session(key))
        binding: Binding = bindings[key]
        return binding

    def _bind(self, key: Key, session: Any) -> Binding:
        plain = {name: plain_array(_spec(self.signature, name), shape) for name, shape in key}
        if self._cuda is None:
            return HostBinding(session, plain, self._output_names)
        turn = self._turns.get(key)  # a session opened for graphs: its runs take turns
        bind = functools.partial(
            DeviceBinding, session, plain, self._output_names, self._memory, self._cuda, turn=turn
        )
        if not (self.graphs and turn):
            return bind()
        try:
            return bind(graph_id=next(self._graph_ids))
        except Exception as exc:  # the capture failed (ONNX Runtime's own errors) or mismatched
            self._no_graphs(exc)
            return bind()

    def _no_graphs(self, reason: Exception) -> None:
        """From now on, sessions and bindings without CUDA graphs (the ones that work keep them)."""
        log.warning("onnxruntime: CUDA graphs are off for this model: %s", str(reason)[:300])
        self.graphs = False


_PREALLOCATED = "pre-allocated output OrtValues"
"""ONNX Runtime's words for an output that outgrew its bound buffer (1.31: "... has shape {1,0}
but the computed output shape for this run is {1,2}. When calling Run() with pre-allocated
output OrtValues on a model with dynamic output shapes, ...")."""

Key = tuple[tuple[str, Shape], ...]
"""A bucket's input shapes, sorted by name; () is the session for shapes no bucket holds."""


def _key(shapes: Mapping[str, Shape]) -> Key:
    return tuple(sorted(shapes.items()))


def _spec(signature: Signature, name: str) -> TensorSpec:
    return next(spec for spec in signature.inputs if spec.name == name)


def _has_cuda_python() -> bool:
    try:
        cuda.runtime()
    except BackendError:
        log.warning("onnxruntime: cuda-python is missing: bound buffers are not pinned")
        return False
    return True


_STATUS = re.compile(r"^\[ONNXRuntimeError\] : \d+ : \w+ : ")


def _message(exc: Exception) -> str:
    """ONNX Runtime's text without its "[ONNXRuntimeError] : 1 : FAIL : " prefix."""
    return _STATUS.sub("", str(exc).strip())


def _text(name: str, array: np.ndarray) -> np.ndarray:
    """BYTES elements as str: ONNX Runtime's Python API would store a bytes element as its repr."""
    if array.dtype != object or not any(isinstance(item, bytes) for item in array.flat):
        return array
    try:
        decoded = [item.decode() if isinstance(item, bytes) else item for item in array.flat]
    except UnicodeDecodeError as exc:
        raise _not_text(name, array, exc) from None
    return np.array(decoded, dtype=object).reshape(array.shape)


def _not_text(name: str, array: np.ndarray, exc: UnicodeDecodeError) -> InvalidElement:
    """Which element of a BYTES tensor is not UTF-8, and where it breaks: the first equal to
    the bytes that failed (the error holds a copy of them)."""
    at = next(index for index, item in enumerate(array.flat) if item == exc.object)
    element = tuple(int(axis) for axis in np.unravel_index(at, array.shape))
    return InvalidElement.of(
        name,
        element,
        f"is not UTF-8 ({exc.reason} at its byte {exc.start}), and onnxruntime takes UTF-8 text "
        "only; send text, or binary data encoded as text (base64)",
    )
