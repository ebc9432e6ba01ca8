"""`edgeserve build` runs the handler before it writes a bundle: imported from the user's file,
then every /invoke sample (an image, or a JSON payload that is not a v2 request) through
preprocess, the model (ONNX Runtime, fp32) and postprocess, and the answer encoded as a
response would be. A mistake is reported with the user's file and line and the sample, so it
never first shows up as a 500 in production."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

import numpy as np
import orjson

from edgeserve.errors import ConfigError, EdgeserveError, HandlerError, InvalidInput
from edgeserve.handler import check_items, import_handler, where
from edgeserve.http.invoke import decode_payload, encode_result
from edgeserve.manifest import Manifest
from edgeserve.samples import IMAGE_TYPES, content_type, is_v2_request, sample_files
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
    try:
        for sample in samples:
            _Trial(handler, shown, sample, manifest, signature).run(engine)
    finally:
        engine.close()
    return DryRun(tuple(path.relative_to(source).as_posix() for path in samples))


BATCH_CHECK_ROWS = 3


@dataclass(frozen=True)
class SkippedCheck:
    """The batch-axis check could not run: said, so a build does not pass it in silence."""

    reason: str

    def describe(self) -> str:
        return (
            f"warning: the batch-axis check did not run: ONNX Runtime {self.reason}; a model "
            "whose outputs lose the batch axis then fails its batched requests. Hint: check "
            "the error above, or set [batching] max_batch_size = 0"
        )


def check_batch_axis(source: Path, manifest: Manifest, signature: Signature) -> SkippedCheck | None:
    """Refuse a batched model whose outputs do not keep the batch axis first: an output such
    as NonZero's [K, 2] or a sum over axis 0 has a dynamic first dim as the batch has, and
    every request then failed with a 500 (its rows cannot be handed back). Run once on random
    inputs of BATCH_CHECK_ROWS rows (ONNX Runtime, fp32), ids within each input's
    `index_range`; a model that does not load or run on them is a SkippedCheck (the rest of
    the build may still serve it on another backend)."""
    if not signature.batched or manifest.batching.max_batch_size == 0:
        return None
    from edgeserve.backends import load_backend
    from edgeserve.samples import example_inputs

    rows = BATCH_CHECK_ROWS
    try:
        engine = load_backend("onnxruntime", source / manifest.model.path, signature=signature)
    except EdgeserveError as exc:
        return SkippedCheck(f"cannot load the model ({exc.message})")
    try:
        outputs = engine.infer(example_inputs(signature, rows, np.random.default_rng(0)))
    except EdgeserveError as exc:
        return SkippedCheck(f"failed on {rows} random rows ({exc.message})")
    finally:
        engine.close()
    wrong = {n: list(array.shape) for n, array in outputs.items() if array.shape[:1] != (rows,)}
    if wrong:
        raise ConfigError(
            f"{source / manifest.model.path}: outputs {wrong} for a batch of {rows} rows: their "
            "first axis is not the batch axis, so batches cannot be split back into requests. "
            "Hint: serve it one request a run, [batching] max_batch_size = 0"
        )
    return None


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

    def run(self, engine: Backend) -> None:
        ctx = Context(content_type(self.sample), self.manifest.handler.options, self.shown.parent)
        payload = decode_payload(self.sample.read_bytes(), ctx.content_type)
        items = self._contract(
            lambda: check_items(self._hook("preprocess", payload, ctx), self.signature)
        )
        outputs = [self._infer(engine, item) for item in items]
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

    def _infer(self, engine: Backend, item: TensorDict) -> TensorDict:
        if not self.signature.batched:
            return engine.infer(item)
        outputs = engine.infer({name: value[np.newaxis] for name, value in item.items()})
        return {name: value[0] for name, value in outputs.items()}
