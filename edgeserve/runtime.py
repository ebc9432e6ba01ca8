"""A loaded function: bundle + engine (backend + batcher) + handler, and its lifecycle.

    load (backend, handler) -> start (batcher workers, warm-up per preferred size) -> ready
    stop: refuse new work -> drain the queue (bounded) -> close the backend

Every request (v2 or /invoke) ends in `Engine.submit` (edgeserve.engine): `LocalEngine` runs
the batches in this process; with front processes (edgeserve.workers) a front's Runtime holds a
`RemoteEngine` instead: the same handler and checks, the batches in the inference process.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from edgeserve.batching import EWMA_WEIGHT, ONE_REQUEST, REQUEST_NUMBERS
from edgeserve.dataplane.checks import InputChecks, check_names
from edgeserve.datatypes import as_numbers
from edgeserve.deadline import Deadline
from edgeserve.engine import Engine, LocalEngine
from edgeserve.errors import (
    DeadlineExceeded,
    EdgeserveError,
    HandlerError,
    InvalidInput,
    Unavailable,
    echo,
    echo_json,
)
from edgeserve.handler import check_items, import_handler, item_place, one_row
from edgeserve.memory import trim_when_idle
from edgeserve.samples import is_media, is_v2_request
from edgeserve.stats import ModelStats
from edgeserve.types import Context, TensorDict
from edgeserve.values import spec_array

if TYPE_CHECKING:
    from edgeserve.bundle import Bundle
    from edgeserve.manifest import BatchingSection, Manifest
    from edgeserve.types import Signature

log = logging.getLogger("edgeserve")
T = TypeVar("T")


HOOK_INLINE_S = 0.0005
"""A handler hook learned to take less than this runs on the event loop: the hop to a worker
thread and back costs more than the hook itself (0.3-0.6 ms on a busy front, against 0.3 ms
for functions/ocr's postprocess: benchmarks/RESULTS-gpu.md, seventh session). A hook that has
not run yet, or that got slower, runs on a thread."""


class Runtime:
    """One function, ready to serve requests from any number of concurrent callers."""

    def __init__(self, bundle: Bundle, engine: Engine, stats: ModelStats | None = None) -> None:
        self.bundle = bundle
        self.engine = engine
        self._model_version = bundle.manifest.function.model_version
        self.stats = stats or ModelStats(bundle.manifest.function.name, self.model_version)
        self.checks = self._door()
        self._timeout_s = bundle.manifest.batching.timeout_ms / 1000.0
        self.handler = (
            None
            if bundle.handler_path is None
            else import_handler(bundle.handler_path, bundle.handler_source)
        )
        self._hook_s: dict[str, float] = {}  # each hook's own time, an EWMA (HOOK_INLINE_S)
        self.started = False
        self.timings: dict[str, float] = {}
        self._housekeeping: asyncio.Task[None] | None = None

    @classmethod
    def load(
        cls,
        bundle: Bundle,
        *,
        backend: str | None = None,
        batching: BatchingSection | None = None,
        stats: ModelStats | None = None,
        threads: int = 0,
    ) -> Runtime:
        """Load the model on the backend that fits this machine (or the one asked for), and
        the handler (`LocalEngine.load` says what `batching` and `threads` change)."""
        started = time.perf_counter()
        function = bundle.manifest.function
        stats = stats or ModelStats(function.name, function.model_version)
        engine = LocalEngine.load(
            bundle, backend=backend, batching=batching, stats=stats, threads=threads
        )
        runtime = cls(bundle, engine, stats)
        runtime.timings["load_s"] = time.perf_counter() - started
        return runtime

    @property
    def manifest(self) -> Manifest:
        return self.bundle.manifest

    @property
    def signature(self) -> Signature:
        return self.bundle.signature

    @property
    def name(self) -> str:
        return self.bundle.name

    @property
    def version(self) -> str:
        return self.bundle.version

    @property
    def model_version(self) -> str:
        """The integer v2 model version the HTTP API reports (FunctionInfo.model_version; read
        once: every response names it, and working it out matches a regular expression)."""
        return self._model_version

    @property
    def backend_name(self) -> str:
        return self.engine.backend_name

    @property
    def ready(self) -> bool:
        """Started, not draining, and its engine can run batches."""
        return self.started and self.engine.ready

    @property
    def degraded(self) -> str | None:
        """Ready, but with part of its engine away (readiness says which), else None."""
        return self.engine.degraded if self.ready else None

    @property
    def root(self) -> Path:
        return self.bundle.root

    async def start(self) -> None:
        """Start the engine (warm-up included), then report ready."""
        if self.started:
            return
        started = time.perf_counter()
        await self.engine.start()
        self.checks = self._door()  # a remote engine says its shapes once connected
        self.timings["warmup_s"] = time.perf_counter() - started
        self._housekeeping = asyncio.create_task(trim_when_idle(self._requests_seen))
        self.started = True
        log.info(
            "%s v%s ready on %s (load %.2f s, warm-up %.2f s)",
            self.name,
            self.version,
            self.backend_name,
            self.timings.get("load_s", 0.0),
            self.timings["warmup_s"],
        )

    def begin_drain(self) -> None:
        """Shutdown has begun: report not ready, and run what is queued without waiting."""
        self.started = False
        self.engine.hurry()

    async def stop(self, drain_timeout_s: float = 30.0) -> None:
        """Refuse new work, run what is queued within the bound, fail the rest (503), close."""
        self.started = False
        if self._housekeeping is not None:
            self._housekeeping.cancel()
        await self.engine.stop(drain_timeout_s)

    async def admit(self, arrived: float) -> None:
        """Let a request in once the queue has room (batching.door), before its body is read;
        Unavailable while not ready, or when no room came in time."""
        if not self.ready:
            raise Unavailable(f"`{self.name}` is not ready (loading, warming up or draining)")
        await self.engine.admit(arrived + self._timeout_s)

    async def infer(
        self, inputs: TensorDict, timeout_s: float | None = None, *, arrived: float | None = None
    ) -> TensorDict:
        """Run one request's tensors (batch axis included when the model is batched).

        `timeout_s` (Triton's `timeout` request parameter) may shorten the manifest's
        timeout_ms for this request, never lengthen it. `arrived` (time.monotonic()) is when
        the request reached the server: its deadline and latency_slo_ms count from there.
        """
        with self._counted():
            return await self._run(inputs, Deadline.of(arrived, self._timeout_s, timeout_s))

    async def invoke(self, payload: Any, content_type: str, *, arrived: float | None = None) -> Any:
        """The function's own interface: handler.preprocess -> batcher -> handler.postprocess.

        One request however many items it became: one deadline, one count in the statistics,
        and one outcome: items the queue cannot take refuse it before any runs, and when one
        item fails the others are withdrawn.
        """
        with self._counted():
            when = Deadline.of(arrived, self._timeout_s, None)
            if self.handler is None:
                tensors = await self._run(self._tensors_from(payload, content_type), when)
                # arrays, not lists: JSON writes float32 as such (0.2, not 0.20000000298023224)
                return as_numbers(tensors, self.signature)
            ctx = Context(content_type, self.manifest.handler.options, self.root)
            items = await self._hook("preprocess", payload, ctx)
            if hasattr(self.handler, "preprocess"):
                items = self._checked(items)
            self.engine.check_room(len(items))
            results = await _all_or_none(
                self._run_item(item, when, index) for index, item in enumerate(items)
            )
            # BF16 outputs are raw bits (datatypes.py), which JSON or a handler reads as integers
            numbers = [as_numbers(result, self.signature) for result in results]
            return await self._hook("postprocess", numbers, ctx)

    def _door(self) -> InputChecks:
        """The checks every request passes, against the shapes the engine's backend takes."""
        batching = self.signature.batched and self.manifest.batching.max_batch_size > 0
        name = self.engine.backend_name  # "?" in a front until its inference process says
        return InputChecks.for_backend(self.signature, self.engine.profile, batching, name)

    def _requests_seen(self) -> int:
        counters = self.stats.snapshot()
        return counters.success.count + counters.fail.count

    def _counted(self) -> _Counted:
        return _Counted(self.stats)

    async def _run(self, inputs: TensorDict, when: Deadline) -> TensorDict:
        checked = self.checks(inputs)  # the one check: the engine and backend trust it
        try:
            return await self.engine.submit(checked, when.deadline, when.arrived)
        except DeadlineExceeded as passed:  # the batcher's words, and which limit ran out
            raise when.passed(passed, self.manifest.batching) from None

    def _checked(self, items: Any) -> list[TensorDict]:
        """preprocess's items held to the contract; a violation names the handler's file."""
        try:
            return check_items(items, self.signature, sizes=False)
        except HandlerError as exc:
            raise HandlerError(exc.message, str(self.bundle.handler_source)) from None

    async def _run_item(self, item: TensorDict, when: Deadline, index: int) -> TensorDict:
        """One of preprocess's items; a refusal names it (the client sent a page, not it)."""
        try:
            if not self.signature.batched:
                return await self._run(item, when)
            outputs = await self._run(one_row(item, self.signature), when)
        except InvalidInput as exc:
            raise InvalidInput(f"{item_place(index, self.signature)}: {exc.message}") from None
        return {name: value[0] for name, value in outputs.items()}

    async def _hook(self, hook: str, *args: Any) -> Any:
        """A handler hook on a worker thread (it may hold the CPU for milliseconds), or on the
        event loop once it has proved cheap (HOOK_INLINE_S); timed as the request waits for
        it (the thread hop included) where the handler defines it."""
        started = time.perf_counter_ns()
        try:
            if self._hook_s.get(hook, HOOK_INLINE_S) < HOOK_INLINE_S:
                return self._call_handler(hook, *args)
            return await asyncio.to_thread(self._call_handler, hook, *args)
        finally:
            if hasattr(self.handler, hook):
                self.stats.handler_done(hook, time.perf_counter_ns() - started)

    def _call_handler(self, hook: str, *args: Any) -> Any:
        """Run a handler hook, learning its own time; our own errors pass through, anything
        else is the handler's fault."""
        started = time.perf_counter()
        try:
            return self._hook_result(hook, *args)
        finally:
            took = time.perf_counter() - started
            old = self._hook_s.get(hook, took)
            self._hook_s[hook] = old + EWMA_WEIGHT * (took - old)

    def _hook_result(self, hook: str, *args: Any) -> Any:
        func = getattr(self.handler, hook, None)
        if func is None:  # a missing hook: the payload is one item, the items are the answer
            if hook == "postprocess":
                return args[0]
            return [self._tensors_from(args[0], args[1].content_type)]
        try:
            return func(*args)
        except EdgeserveError:
            raise
        except Exception as exc:  # the details go to the log, not to the client
            raise EdgeserveError(f"handler.{hook} failed") from exc

    def _tensors_from(self, payload: Any, content_type: str) -> TensorDict:
        """{"<input name>": nested list or array} per model input, typed by the signature."""
        if not isinstance(payload, dict):
            names = [spec.name for spec in self.signature.inputs]
            found = echo_json(payload)
            if isinstance(payload, bytes) and not content_type.endswith("msgpack"):  # as sent
                found = _raw_body(len(payload), content_type)
            raise InvalidInput(
                f"/invoke: expected a JSON object (or msgpack map) with the inputs {names}, "
                f"got {found}"
            )
        try:
            check_names(self.signature, payload)
        except InvalidInput as exc:
            # {"inputs": [...]}, named as no input of the model (one named `inputs` is its own)
            if is_v2_request(payload) and self.signature.input("inputs") is None:
                raise InvalidInput(_v2_body(self.name, exc.message)) from None
            raise
        return {
            spec.name: spec_array(spec, payload[spec.name])
            for spec in self.signature.inputs
            if spec.name in payload  # an optional input left out: the model's default
        }


class _Counted:
    """Counts one request, failed unless its block completes, with its duration (a plain
    context manager: a generator-based one costs several microseconds a request)."""

    __slots__ = ("_started", "_stats")

    def __init__(self, stats: ModelStats) -> None:
        self._stats = stats
        self._started = time.perf_counter_ns()
        stats.request_started()

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        self._stats.request_done(kind is None, time.perf_counter_ns() - self._started)


async def _all_or_none(work: Iterable[Awaitable[T]]) -> list[T]:
    """Await all as one request (ONE_REQUEST: the batcher fails its waiting items together);
    on the first failure cancel the rest and raise that failure, not an exception group."""
    token = ONE_REQUEST.set(next(REQUEST_NUMBERS))  # the tasks copy this context
    try:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(_awaited(one)) for one in work]
    except BaseExceptionGroup as failed:
        raise failed.exceptions[0] from None
    finally:
        ONE_REQUEST.reset(token)
    return [task.result() for task in tasks]


async def _awaited(work: Awaitable[T]) -> T:
    return await work


def _v2_body(name: str, refused: str) -> str:
    """What /invoke says of a KServe v2 infer request sent to it (init's samples/v2.json)."""
    return (
        f'/invoke: the body is a KServe v2 infer request ({{"inputs": [...]}}), which /invoke '
        f"does not read ({refused}). Hint: POST it to /v2/models/{name}/infer, or send "
        "/invoke the tensors by name, as samples/request.json does"
    )


def _raw_body(size: int, content_type: str) -> str:
    """What a body that is not JSON or msgpack was, and what to do: an image (a classifier's
    user sends one first) needs a handler to become the model's tensors."""
    kind = echo(content_type) or "no Content-Type"
    sent = f"{size} bytes sent as {kind}, which is not JSON or msgpack"
    hint = "send them with Content-Type: application/json (or application/msgpack)"
    if is_media(content_type):
        hint = (
            "without a handler, /invoke takes only the model's tensors; to take the file "
            "itself, add a handler.py whose preprocess decodes it into them and name it in "
            'function.toml, [handler] module = "handler" (`edgeserve help manifest`); or send '
            "the tensors with Content-Type: application/json"
        )
    return f"{sent}. Hint: {hint}"
