"""`edgeserve build` runs the handler before it writes a bundle: imported from the user's file,
then every /invoke sample (an image, or a JSON payload that is not a v2 request) through
preprocess, serve's door (the checks every request passes), the model (ONNX Runtime, fp32) and
postprocess, and the answer encoded as a response would be. A mistake is reported with the
user's file and line and the sample, so it never first shows up as a 500 in production."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

import numpy as np
import orjson

from edgeserve.dataplane import InputChecks
from edgeserve.datatypes import as_numbers
from edgeserve.errors import ConfigError, EdgeserveError, HandlerError, InvalidInput, ModelRefused
from edgeserve.handler import check_items, import_handler, item_place, one_row, where
from edgeserve.http.invoke import decode_payload, encode_result
from edgeserve.manifest import Manifest
from edgeserve.modelfile import op_types
from edgeserve.samples import (
    IMAGE_TYPES,
    content_type,
    is_v2_request,
    random_sample,
    sample_files,
    with_plain_integers,
)
from edgeserve.types import Backend, Context, Signature, TensorDict

T = TypeVar("T")


@dataclass(frozen=True)
class DryRun:
    """The samples the handler ran on, end to end."""

    samples: tuple[str, ...]

    def describe(self) -> str:
        if not self.samples:
            return "handler: imported (no /invoke samples in samples/ to run it on)"
        return f"handler: ran {', '.join(self.samples)} through preprocess, model, postprocess"


def dry_run(source: Path, manifest: Manifest, signature: Signature) -> DryRun | None:
    """Import the handler and run it on the samples; None without a handler."""
    if manifest.handler.module is None:
        return None
    shown = source / f"{manifest.handler.module}.py"
    handler = import_handler(shown)
    samples = _invoke_samples(source / "samples") if hasattr(handler, "preprocess") else []
    if not samples:
        return DryRun(())
    from edgeserve.backends import load_backend  # heavy: only when there is something to run

    engine = load_backend("onnxruntime", source / manifest.model.path)
    batching = signature.batched and manifest.batching.max_batch_size > 0
    door = InputChecks.for_backend(signature, engine.profile, batching, "onnxruntime")
    try:
        for sample in samples:
            _Trial(handler, shown, sample, manifest, signature).run(engine, door)
    finally:
        engine.close()
    return DryRun(tuple(path.relative_to(source).as_posix() for path in samples))


def runnable_sample(model: Path, signature: Signature) -> TensorDict:
    """init's sample request: `random_sample`'s values, or, where ONNX Runtime fails on them,
    the same with integers at ones, where it runs on those (a TopK's k drawn as 12 for an axis
    of 6 answered every `edgeserve invoke` of the sample with a 422). The random ones where
    neither runs, or the model does not load: build then says why."""
    from edgeserve.backends import load_backend

    drawn = random_sample(signature)
    try:
        engine = load_backend("onnxruntime", model, signature=signature)
    except EdgeserveError:
        return drawn
    try:
        for sample in (drawn, with_plain_integers(signature, drawn)):
            try:
                engine.infer(sample)
                return sample
            except EdgeserveError:
                continue
    finally:
        engine.close()
    return drawn


BATCH_CHECK_ROWS = 3


@dataclass(frozen=True)
class SkippedCheck:
    """The batch-axis check could not run: said, so a build does not pass it in silence."""

    reason: str

    def describe(self) -> str:
        return (
            f"warning: the batch-axis check did not run: ONNX Runtime {self.reason}; a model "
            "whose first axis is not a batch axis then fails its batched requests, or answers "
            "them wrong. Hint: check the error above, or set [batching] max_batch_size = 0"
        )


def check_batch_axis(source: Path, manifest: Manifest, signature: Signature) -> SkippedCheck | None:
    """Refuse a batched function whose model's first axis is not a batch axis (see
    `batch_axis_verdict`), saying what showed it and what to do."""
    if not signature.batched or manifest.batching.max_batch_size == 0:
        return None
    model = source / manifest.model.path
    verdict = batch_axis_verdict(model, signature)
    if isinstance(verdict, NotABatchAxis):
        raise ConfigError(f"{model}: {verdict.finding}. {NOT_A_BATCH_AXIS_HINT}")
    return verdict


@dataclass(frozen=True)
class NotABatchAxis:
    """What a run showed of a model whose first dims are all dynamic: its first axis is not a
    batch axis. Build refuses batching it; init writes max_batch_size = 0 and says why."""

    finding: str  # "outputs {'y': [1, 4]} for a batch of 3 rows: their first axis is not ..."


def not_a_batch_axis(model: Path, signature: Signature) -> str:
    """What a run shows of a model whose first dims are all dynamic but no batch axis ("": they
    are one, the model has none to check, or the check could not run, which build then says):
    init writes batching off for it and tune sweeps no batch sizes, where build would refuse
    them."""
    verdict = batch_axis_verdict(model, signature) if signature.batched else None
    return verdict.finding if isinstance(verdict, NotABatchAxis) else ""


def batch_axis_verdict(model: Path, signature: Signature) -> NotABatchAxis | SkippedCheck | None:
    """Whether the first axis of a model whose first dims are all dynamic (`signature.batched`)
    is a batch axis: an output such as NonZero's [K, 2] or a sum over axis 0 loses it (every
    request then failed with a 500: its rows cannot be handed back), and a model whose rows
    compute together (a point cloud centered on its mean, a graph's nodes) keeps it but
    answered each request of a shared batch wrong, with a 200. Run on random inputs of
    BATCH_CHECK_ROWS rows, then on each row alone (ONNX Runtime, fp32), ids within each
    input's `index_range`; None: it is one. A model that does not load or run on them is a
    SkippedCheck (the rest of the build may still serve it on another backend)."""
    from edgeserve.backends import load_backend
    from edgeserve.samples import example_inputs

    rows = BATCH_CHECK_ROWS
    inputs = example_inputs(signature, rows, np.random.default_rng(0))
    try:
        engine = load_backend("onnxruntime", model, signature=signature)
    except EdgeserveError as exc:
        return SkippedCheck(f"cannot load the model ({exc.message})")
    try:
        runs = [engine.infer(inputs) for _ in range(2)]
        alone = [
            engine.infer({n: a[row : row + 1] for n, a in inputs.items()}) for row in range(rows)
        ]
    except EdgeserveError as exc:
        return SkippedCheck(f"failed on {rows} random rows ({exc.message})")
    finally:
        engine.close()
    batched, again = (as_numbers(outputs, signature) for outputs in runs)
    lost = _rows_lost(batched, rows, signature)
    if lost:
        return NotABatchAxis(lost)
    if not all(_close(again[name], array) for name, array in batched.items()):
        return SkippedCheck(
            "answered the same rows differently twice (a random op?), so each row alone "
            "could not be compared with its row in a batch"
        )
    noise = QUANTIZED_NOISE if op_types(model) & DYNAMIC_QUANTIZATION else FLOAT_NOISE
    apart = (
        _row_apart(batched, as_numbers(out, signature), row, noise) for row, out in enumerate(alone)
    )
    return next((NotABatchAxis(found) for found in apart if found), None)


FLOAT_NOISE = 1e-4
"""How far a row alone may move from its row in a batch, as a share of the output's largest
value: a kernel may sum in another order for another batch size."""
QUANTIZED_NOISE = 0.05
"""The same for a dynamically quantized model (onnxruntime's quantize_dynamic), whose
activations are quantized with a scale taken over the whole batch: a row's answer moves with
its batch mates (0.4% of the output's largest value in a two-layer MLP), as it does in Triton."""
DYNAMIC_QUANTIZATION = frozenset({"DynamicQuantizeLinear", "DynamicQuantizeMatMul"})


NOT_A_BATCH_AXIS_HINT = "Hint: serve it one request a run, [batching] max_batch_size = 0"


def _rows_lost(outputs: TensorDict, rows: int, signature: Signature) -> str:
    """Every output must hold the batch's rows on its first axis: one of dynamic first dim may
    not (NonZero's [K, 2]), nor one the model declares no shape for (its rank shows here)."""
    wrong = {n: list(array.shape) for n, array in outputs.items() if array.shape[:1] != (rows,)}
    if not wrong:
        return ""
    unranked = [spec.name for spec in signature.outputs if not spec.ranked and spec.name in wrong]
    said = f" ({', '.join(unranked)}: no shape declared in the model)" if unranked else ""
    return (
        f"outputs {wrong}{said} for a batch of {rows} rows: their first axis is not the batch "
        "axis, so batches cannot be split back into requests"
    )


def _row_apart(batched: TensorDict, alone: TensorDict, row: int, noise: float) -> str:
    """Row `row` run alone must answer what it answered in the batch, within `noise`."""
    for name, together in batched.items():
        own, mine = alone[name], together[row : row + 1]
        if not _close(own, mine, noise):
            return (
                f"output `{name}` of row {row} alone differs from its row in a batch of "
                f"{len(together)} ({_difference(own, mine)}): its first axis is not a batch "
                "axis: the rows of a batch compute together, so a request batched with others "
                "would be answered wrong"
            )
    return ""


def _close(own: np.ndarray, mine: np.ndarray, noise: float = FLOAT_NOISE) -> bool:
    if own.shape != mine.shape or own.dtype.kind not in "fiu":
        return own.shape == mine.shape and bool(np.array_equal(own, mine))
    scale = float(np.max(np.abs(mine[np.isfinite(mine)]), initial=1.0))
    return bool(np.allclose(own, mine, rtol=1e-3, atol=noise * scale, equal_nan=True))


def _difference(own: np.ndarray, mine: np.ndarray) -> str:
    if own.shape != mine.shape:
        return f"shape {list(own.shape)} against {list(mine.shape)}"
    if own.dtype.kind not in "fiu":
        return "other values"
    gap = np.abs(own.astype(np.float64) - mine.astype(np.float64))
    return f"by up to {float(np.nanmax(gap)):.3g}"


def _invoke_samples(folder: Path) -> list[Path]:
    """Samples that go to /invoke: images, and JSON payloads that are not v2 infer requests."""
    if not folder.is_dir():
        return []
    found = []
    for path in sample_files(folder):
        suffix = path.suffix.lower()
        if suffix in IMAGE_TYPES or (suffix == ".json" and not _is_v2(path)):
            found.append(path)
    return found


def _is_v2(path: Path) -> bool:
    try:
        return is_v2_request(orjson.loads(path.read_bytes()))
    except orjson.JSONDecodeError as exc:
        raise ConfigError(f"{path}: not valid JSON: {exc}") from None


@dataclass(frozen=True)
class _Trial:
    """One sample through the handler, with errors that name the handler file and the sample."""

    handler: ModuleType
    shown: Path
    sample: Path
    manifest: Manifest
    signature: Signature

    def run(self, engine: Backend, door: InputChecks) -> None:
        ctx = Context(content_type(self.sample), self.manifest.handler.options, self.shown.parent)
        payload = decode_payload(self.sample.read_bytes(), ctx.content_type)
        items = self._contract(
            lambda: check_items(self._hook("preprocess", payload, ctx), self.signature)
        )
        outputs = [self._infer(engine, door, item, index) for index, item in enumerate(items)]
        postprocess = getattr(self.handler, "postprocess", None)
        answer = outputs if postprocess is None else self._hook("postprocess", outputs, ctx)
        self._contract(lambda: encode_result(answer, None))

    def _hook(self, name: str, *args: Any) -> Any:
        try:
            return getattr(self.handler, name)(*args)
        except InvalidInput as exc:
            raise ConfigError(
                f"{self.sample}: handler.{name} refused this sample ({where(exc, self.shown)}): "
                f"{exc.message}. Hint: make the sample a request the handler accepts"
            ) from None
        except EdgeserveError:
            raise
        except Exception as exc:
            raise ConfigError(
                f"{where(exc, self.shown)}: handler.{name} raised {type(exc).__name__}: {exc} "
                f"(on {self.sample})"
            ) from exc

    def _contract(self, step: Callable[[], T]) -> T:
        try:
            return step()
        except HandlerError as exc:
            raise HandlerError(f"{self.shown}: on {self.sample.name}: {exc.message}") from None

    def _infer(
        self, engine: Backend, door: InputChecks, item: TensorDict, index: int
    ) -> TensorDict:
        """One item through the door serve holds and the model: what serve would refuse (an
        id past an embedding's table, which ONNX Runtime answers in its kernel's words, and
        OpenVINO with zeros) is refused as serve words it, naming the sample."""
        batched = self.signature.batched
        try:
            outputs = engine.infer(door(one_row(item, self.signature) if batched else item))
        except (InvalidInput, ModelRefused) as exc:
            raise ConfigError(
                f"{self.sample}: serving would refuse {item_place(index, self.signature)} "
                f"({exc.status}): {exc.message}. Hint: make preprocess ({self.shown}) give the "
                "model values it takes, or the sample a request the handler should refuse"
            ) from None
        return {name: value[0] for name, value in outputs.items()} if batched else outputs
