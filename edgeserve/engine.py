"""Where a function's batches run: the `Engine` a Runtime submits to.

`LocalEngine` wires the batcher to the backend in this process: the batcher calls
`backend.infer` on its worker threads. With front processes (edgeserve.workers) a front holds a
`RemoteEngine` instead, whose batches run in the inference process.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from edgeserve.batching import Batcher, BatchPolicy, stack_rows
from edgeserve.shapes import ShapeProfile
from edgeserve.stats import ModelStats
from edgeserve.types import Backend, TensorDict
from edgeserve.warmup import Sample, Warmup, warmup_batches

if TYPE_CHECKING:
    from edgeserve.types import Signature


class Engine(Protocol):
    """What runs a function's batches: `LocalEngine` here, or `workers.RemoteEngine` (the
    inference process shared by every front)."""

    @property
    def backend_name(self) -> str: ...
    @property
    def profile(self) -> ShapeProfile | None:
        """The shapes its backend was loaded for: the data plane refuses others at the door."""

    @property
    def ready(self) -> bool:
        """Whether batches can run (a RemoteEngine is not while no inference process is up)."""

    @property
    def degraded(self) -> str | None:
        """What is away while the rest serves (a RemoteEngine's restarting inference process)."""

    async def start(self) -> None: ...
    async def stop(self, drain_timeout_s: float) -> None: ...
    async def submit(self, inputs: TensorDict, deadline: float, arrived: float) -> TensorDict: ...
    async def admit(self, deadline: float) -> None:
        """Wait (bounded) for room in the queue, or raise Unavailable: before a body is read."""

    def check_room(self, rows: int) -> None:
        """Refuse `rows` now if the queue could never hold them (413) or cannot now (503)."""

    def hurry(self) -> None:
        """Draining: run what is queued without waiting for company."""


class LocalEngine:
    """The backend and its batcher in this process; starting warms up every batch size, on
    the function's `samples` where one fits (edgeserve.warmup)."""

    ready = True
    degraded = None

    def __init__(
        self,
        backend: Backend,
        signature: Signature,
        policy: BatchPolicy,
        stats: ModelStats,
        samples: Sequence[Sample] = (),
    ) -> None:
        self.backend = backend
        self.signature = signature
        self.samples = samples
        # a backend with bound buffers (ONNX Runtime on CUDA) assembles each batch into them
        assemble = getattr(backend, "assemble", stack_rows)
        stage_ahead = getattr(backend, "stages_ahead", False)
        self.batcher = Batcher(backend.infer, signature, policy, stats, assemble, stage_ahead)
        self.submit = self.batcher.submit
        self.admit = self.batcher.admit
        self.check_room = self.batcher.check_room
        self.hurry = self.batcher.hurry

    @property
    def backend_name(self) -> str:
        return self.backend.name

    @property
    def profile(self) -> ShapeProfile | None:
        return self.backend.profile

    async def start(self) -> None:
        """Start the batcher, running one batch per preferred size (and backend bucket) on each
        of its threads first: what a backend keeps per thread is made before any request."""
        preferred = self.batcher.policy.preferred_batch_sizes
        sizes = _warmup_sizes((*preferred, *self.backend.buckets), self.batcher.policy)
        batches = warmup_batches(self.signature, sizes, self.samples, self.backend.profile)
        warmup = Warmup(batches)
        each_thread = getattr(self.backend, "warm_thread", None)

        def warm_up() -> None:
            if each_thread is not None:
                each_thread()
            warmup.run(self.backend.infer)

        await self.batcher.start(warm_up)
        warmup.report(self.signature.batched and self.batcher.policy.max_batch_size > 0)

    async def stop(self, drain_timeout_s: float) -> None:
        await self.batcher.stop(drain_timeout_s)
        self.backend.close()


def _warmup_sizes(preferred: Sequence[int], policy: BatchPolicy) -> list[int]:
    if policy.max_batch_size == 0:  # batching off: one request a run, of one row when it has rows
        return [1]
    return sorted(set(preferred) | {1})
