"""OpenVINO on the CPU: the default backend where there is no NVIDIA GPU.

Precision: "fp32" pins INFERENCE_PRECISION_HINT to f32, because OpenVINO otherwise computes in bf16
on AMX / AVX512-BF16 CPUs (~0.1-0.4 % relative error); "auto" lets OpenVINO choose (bf16 there,
fastest); "fp16" asks for f16 where the CPU has it (Arm, AVX512-FP16) and is refused elsewhere;
"int8" computes in int8 only where the model carries quantization (an NNCF-quantized IR or Q/DQ
nodes), so it compiles like "auto" and the model decides.

Streams: with one instance the batcher runs one batch at a time, so the model is compiled for
LATENCY (one stream using every core); with N instances, N batches run at once, so it is compiled
for THROUGHPUT with NUM_STREAMS = N and each worker thread owns one InferRequest.

Threads: OpenVINO pins them to cores by default on Linux, each process as if it were alone. Where
several inference processes share the CPU (`shares_cpu`: edgeserve/workers), pinning is off:
pinned, eight processes put their threads on the same few cores and served functions/ocr at
114-121 pages/s against 777-793 unpinned (benchmarks/RESULTS-gpu.md, sixth session). Alone, a
process keeps it: a batch of 8 OCR lines took 7.5 ms pinned against 9.0 ms unpinned on 2 cores.
"""

from __future__ import annotations

import io
import logging
import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from edgeserve.backends.options import (
    LoadOptions,
    TritonNames,
    missing_module,
    run_failure,
    unranked_inputs,
    unsupported_types,
)
from edgeserve.datatypes import bf16_bits
from edgeserve.errors import BackendError
from edgeserve.hardware import Platform
from edgeserve.types import Signature, TensorDict

IR_PATH = "model/model.xml"
"""Where `prepare` puts the OpenVINO IR in a bundle (the weights go beside it, model.bin)."""
INPUTS_IR = "model/inputs.xml"
"""The IR taking the model's optional inputs as inputs (only for a model that has some)."""
DEFAULTS = "model/defaults.npy"
"""The optional inputs' defaults, one .npy record each, in the model's input order."""
log = logging.getLogger(__name__)
_GENERATED_NAME = re.compile(r"([A-Za-z][A-Za-z0-9]*)_\d+")


class OpenVINO:
    """A model compiled once for the CPU; one InferRequest per calling thread."""

    name = "openvino"
    package: ClassVar[str | None] = "openvino"
    platforms: ClassVar[tuple[str, ...]] = ("cpu",)
    triton: ClassVar[TritonNames] = TritonNames("", "openvino")
    prepared: ClassVar[tuple[str, ...]] = (
        IR_PATH,
        "model/model.bin",
        INPUTS_IR,
        "model/inputs.bin",
        DEFAULTS,
    )
    optional_inputs: ClassVar[bool] = True  # through INPUTS_IR (see `optional_model`)
    modules: ClassVar[dict[str, str]] = {
        "openvino": "the openvino package is not installed (pip install openvino)"
    }

    @classmethod
    def prepare(cls, model_path: Path, bundle: Path) -> None:
        """The IR, converted once at build: loading it is faster than converting the ONNX;
        for a model with optional inputs, also the IR taking them and their defaults."""
        export_ir(model_path, bundle / IR_PATH)
        made = optional_model(model_path)
        if made is not None:
            export_ir(model_path, bundle / INPUTS_IR, made[0])
            with (bundle / DEFAULTS).open("wb") as file:
                for default in made[1].values():
                    np.save(file, default, allow_pickle=False)

    @classmethod
    def available(cls, platform: Platform) -> str | None:
        return missing_module(cls.modules, platform)

    int_range: ClassVar[tuple[int, int] | None] = (-(2**31), 2**31 - 1)
    """The INT64 / UINT64 input values it computes exactly: its CPU plugin computes 64-bit
    integers in 32 bits (2**40 + 1 answered 1, measured with OpenVINO 2026.4)."""

    @classmethod
    def declines(cls, signature: Signature, model: Path) -> str | None:
        """What of the model OpenVINO would not serve as written: string tensors (its warm-up
        failed: "Unsupported data type: object"), FP64 (computed in FP32 without a word), 64-bit
        integer outputs (computed in 32 bits: wrong values with no error), an input that is also
        an output (its compiled model has no such output), ops outside ONNX's default domain
        (ai.onnx.ml's classifiers from skl2onnx: it has no conversion for them), and inputs of
        no declared rank (its CPU plugin "doesn't support Parameter operation with dynamic
        rank")."""
        both = {spec.name for spec in signature.inputs} & {s.name for s in signature.outputs}
        if both:
            return f"openvino cannot answer an input as an output ({sorted(both)})"
        wide = next((s for s in signature.outputs if s.datatype in ("INT64", "UINT64")), None)
        if wide is not None:
            return (
                f"openvino computes {wide.datatype} in 32 bits (output `{wide.name}`): "
                "values past 2**31 would be wrong"
            )
        return (
            unsupported_types(signature, ("BYTES", "FP64"), "openvino")
            or unranked_inputs(signature, "openvino")
            or _foreign_op(model)
        )

    @classmethod
    def differs(cls, model: Path, signature: Signature) -> str | None:
        """Why its answers are not ONNX Runtime's (`agreement.py`: conversions that compute
        otherwise, with no error), or None."""
        from edgeserve.backends.agreement import disagreement

        found = disagreement(cls.name, cls, model, signature)
        return (
            found
            and f'{found}. Hint: serve it with ONNX Runtime: [backend] prefer = ["onnxruntime"]'
        )

    @classmethod
    def reaches_gpu(cls, platform: Platform) -> bool:
        """OpenVINO's GPU plugin is for Intel GPUs: an NVIDIA GPU is out of its reach."""
        return False

    def __init__(self, model_path: Path, options: LoadOptions) -> None:
        self.signature = options.signature
        self.buckets: tuple[int, ...] = ()
        self.profile = options.profile
        self._model_path, self._options = model_path, options
        prepared = options.prepared / IR_PATH if options.prepared else None
        source = prepared if prepared and prepared.is_file() else model_path
        self._main = self._compile(source, lambda core: core.read_model(str(source)))
        self._optional = [spec.name for spec in self.signature.inputs if spec.optional]
        self._sendable = frozenset(self._optional)
        self._taking: tuple[_Compiled, dict[str, np.ndarray]] | None = None
        self._lock = threading.Lock()

    def infer(self, inputs: TensorDict) -> TensorDict:
        compiled = self._main
        if not inputs.keys().isdisjoint(self._sendable):  # a batch sending optional inputs
            compiled, defaults = self._taking_optional()
            inputs = {**defaults, **inputs}  # those not sent at the model's defaults
        inputs = {n: a if a.ndim else self._scalar(n, a) for n, a in inputs.items()}
        try:
            # share_outputs=False: OpenVINO reuses its output buffers on the next call, so copy.
            results = compiled.request().infer(inputs, share_inputs=True, share_outputs=False)
        except Exception as exc:  # RuntimeError for everything: the text says what failed
            raise run_failure(self.name, _message(exc)) from None
        # a BF16 output comes back as its bits in a float16 array (numpy has no bfloat16)
        return {
            name: bf16_bits(results[port]) if bf16 else np.asarray(results[port])
            for name, port, bf16 in compiled.outputs
        }

    def _scalar(self, name: str, array: np.ndarray) -> Any:
        """A rank-0 input as OpenVINO takes it: a read-only one (a binary tensor is a view of
        the body) failed ("array is not writeable"; arrays of any rank share their memory
        read-only), and BF16 bits in a uint16 scalar were refused ("Failed to set tensor for
        input with precision: u16"), which a uint16 array of rank 1 or more is not."""
        if name in self.signature.bf16_inputs:
            import openvino as ov

            tensor = ov.Tensor(ov.Type.bf16, ov.Shape([]))
            tensor.data.view(np.uint16)[...] = array
            return tensor
        return array if array.flags.writeable else array.copy()

    def close(self) -> None:
        self._main.close()
        if self._taking is not None:
            self._taking[0].close()

    def _taking_optional(self) -> tuple[_Compiled, dict[str, np.ndarray]]:
        """The model taking the optional inputs, and their defaults: compiled on the first batch
        sending one (the bundle's INPUTS_IR, or, for a model not built so, made from the ONNX)."""
        with self._lock:
            if self._taking is None:
                log.info(
                    "openvino: a request sends optional inputs; compiling the model that "
                    "takes them (once)"
                )
                self._taking = self._load_taking()
        return self._taking

    def _load_taking(self) -> tuple[_Compiled, dict[str, np.ndarray]]:
        prepared = self._options.prepared
        if prepared is not None and (prepared / INPUTS_IR).is_file():
            with (prepared / DEFAULTS).open("rb") as file:
                defaults = {name: np.load(file, allow_pickle=False) for name in self._optional}
            ir = prepared / INPUTS_IR
            return self._compile(ir, lambda core: core.read_model(str(ir))), defaults
        made = optional_model(self._model_path)
        if made is None:
            raise BackendError(f"openvino: {self._model_path} has no optional inputs")
        return self._compile(self._model_path, lambda core: made[0]), made[1]

    def _compile(self, source: Path, read: Callable[[Any], Any]) -> _Compiled:
        """The model `read` gives, reshaped to the profile and compiled for the CPU."""
        import openvino as ov

        try:
            core = ov.Core()
            model = read(core)
            if self.profile:
                model.reshape({n: _bounded(r.min, r.max) for n, r in self.profile.items()})
            compiled = _compile_on_cpu(core, model, compile_config(self._options))
        except Exception as exc:  # openvino raises RuntimeError (and subclasses) for everything
            raise BackendError(f"openvino: cannot load {source}: {_message(exc)}") from None
        return _Compiled(compiled, self.signature)


class _Compiled:
    """A compiled model, its output ports, and one InferRequest per calling thread."""

    def __init__(self, compiled: Any, signature: Signature) -> None:
        self.model = compiled
        self.outputs = [
            (spec.name, _port(compiled, spec.name), spec.datatype == "BF16")
            for spec in signature.outputs
        ]
        self._local = threading.local()

    def request(self) -> Any:
        request = getattr(self._local, "request", None)
        if request is None:
            request = self._local.request = self.model.create_infer_request()
        return request

    def close(self) -> None:
        self._local = threading.local()
        self.model = None


def optional_model(onnx_path: Path) -> tuple[Any, dict[str, np.ndarray]] | None:
    """An OpenVINO model of the ONNX model taking its optional inputs (graph inputs with an
    initializer, which OpenVINO otherwise reads as constants and folds away) as inputs, and
    their defaults in the model's input order; None for a model without any. Needs the onnx
    package: build makes it (INPUTS_IR, DEFAULTS), so a bundle served needs none."""
    import openvino as ov

    try:
        import onnx
        from onnx import numpy_helper
        from onnx.external_data_helper import load_external_data_for_model
    except ImportError:  # serving a bundle built before it held INPUTS_IR, without onnx
        raise BackendError(
            f"openvino: {onnx_path}: the bundle has no IR taking the optional inputs, and the onnx "
            "package that would make one is not installed. Hint: build the bundle again"
        ) from None
    try:
        model = onnx.load(str(onnx_path), load_external_data=False)
        names = [value.name for value in model.graph.input]
        held = {init.name: init for init in model.graph.initializer if init.name in names}
        if not held:
            return None
        load_external_data_for_model(model, str(onnx_path.parent))  # the defaults may be there
        defaults = {name: numpy_helper.to_array(held[name]) for name in names if name in held}
        kept = [init for init in model.graph.initializer if init.name not in held]
        del model.graph.initializer[:]
        model.graph.initializer.extend(kept)
        return ov.convert_model(io.BytesIO(model.SerializeToString())), defaults
    except Exception as exc:  # onnx's and openvino's own errors: the model cannot be converted
        raise BackendError(
            f"openvino: cannot convert {onnx_path} with its optional inputs as inputs: "
            f"{_message(exc)}"
        ) from None


def _foreign_op(model: Path) -> str | None:
    """Why OpenVINO is not used for a model with ops outside ONNX's default domain, or None:
    it converts few of them (ai.onnx.ml's Normalizer, but not LinearClassifier nor the tree
    ensembles), and a model it cannot convert failed `build` with its raw conversion report."""
    from edgeserve.modelfile import foreign_ops

    found = foreign_ops(model)
    if not found:
        return None
    return (
        f"openvino does not serve ops outside ONNX's default domain ({', '.join(found)}). "
        'Hint: serve it with ONNX Runtime: [backend] prefer = ["onnxruntime"]'
    )


def compile_config(options: LoadOptions) -> dict[str, Any]:
    """OpenVINO properties for the options (see the module docstring for the reasons)."""
    import openvino as ov
    import openvino.properties as props
    import openvino.properties.hint as hints

    config: dict[str, Any] = {hints.enable_cpu_pinning(): False} if options.shares_cpu else {}
    if options.instances > 1:
        config[hints.performance_mode()] = hints.PerformanceMode.THROUGHPUT
        config[props.num_streams()] = options.instances
    else:
        config[hints.performance_mode()] = hints.PerformanceMode.LATENCY
    if options.threads > 0:
        config[props.inference_num_threads()] = options.threads
    precision = {"fp32": ov.Type.f32, "fp16": ov.Type.f16}.get(options.precision)
    if precision is not None:
        config[hints.inference_precision()] = precision
    return config


def _compile_on_cpu(core: Any, model: Any, config: dict[str, Any]) -> Any:
    """Compile at `config`; where it leaves the precision to OpenVINO ("auto", "int8") and
    OpenVINO's own choice has no kernel, at f32: ONNX Runtime's quantize_static Q/DQ Conv did
    not compile in bf16 ("No suitable implementations", 2026.4 on an AMX CPU), and build
    refused a model OpenVINO serves at f32."""
    import openvino as ov
    import openvino.properties.hint as hints

    try:
        return core.compile_model(model, "CPU", config)
    except Exception as exc:
        if hints.inference_precision() in config:
            raise
        log.warning("openvino: compiling at f32, as its own precision failed: %s", _message(exc))
        pinned = {**config, hints.inference_precision(): ov.Type.f32}
        return core.compile_model(model, "CPU", pinned)


def export_ir(onnx_path: Path, xml_path: Path, converted: Any = None) -> None:
    """Convert an ONNX model to OpenVINO IR (xml + bin), keeping fp32 weights (`converted`:
    the model already converted, to save)."""
    try:
        import openvino as ov
    except ImportError:
        raise BackendError(
            f"openvino: cannot convert {onnx_path} to IR: {OpenVINO.modules['openvino']}. "
            'Hint: or leave openvino out of [backend] prefer (e.g. prefer = ["onnxruntime"])'
        ) from None
    try:
        model = ov.convert_model(str(onnx_path)) if converted is None else converted
        _name_generated_ops(model)
        xml_path.parent.mkdir(parents=True, exist_ok=True)
        ov.save_model(model, str(xml_path), compress_to_fp16=False)
    except Exception as exc:
        raise BackendError(f"openvino: cannot convert {onnx_path} to IR: {_message(exc)}") from None


def _name_generated_ops(model: Any) -> None:
    """Rename ops OpenVINO named from a process-wide counter (`Transpose_1942`) by their position.

    Without this the IR written for the same ONNX differs from one export to the next, and so
    would the bundle's content hash. Parameters and Results keep their names (inputs/outputs).
    """
    for index, op in enumerate(model.get_ordered_ops()):
        generated = _GENERATED_NAME.fullmatch(op.get_friendly_name())
        if generated and op.get_type_name() not in ("Parameter", "Result"):
            op.set_friendly_name(f"{generated.group(1)}_{index}")


def _bounded(low: tuple[int, ...], high: tuple[int, ...]) -> Any:
    import openvino as ov

    return ov.PartialShape([ov.Dimension(lo, hi) for lo, hi in zip(low, high, strict=True)])


def _port(compiled: Any, name: str) -> Any:
    for output in compiled.outputs:
        if name in output.get_names():
            return output
    raise BackendError(f"openvino: the compiled model has no output named `{name}`")


def _message(exc: BaseException) -> str:
    """OpenVINO's text without its "Exception from <file>:<line>:" frames."""
    lines = [line.strip() for line in str(exc).splitlines()]
    kept = [line for line in lines if line and not line.startswith("Exception from ")]
    return " ".join(kept) or type(exc).__name__
