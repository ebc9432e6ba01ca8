"""Where a function's batches run: the `Engine` a Runtime submits to.

`LocalEngine` wires the batcher to the backend in this process: the batcher calls
`backend.infer` on its worker threads. With front processes (edgeserve.workers) a front holds a
`RemoteEngine` instead, whose batches run in the inference process.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from edgeserve.backends import BY_NAME, choose, default_device, load_backend, probe
from edgeserve.batching import Batcher, BatchPolicy, stack_rows
from edgeserve.samples import json_samples
from edgeserve.shapes import ShapeProfile, shape_profile
from edgeserve.stats import ModelStats
from edgeserve.types import Backend, TensorDict
from edgeserve.warmup import Sample, Warmup, warmup_batches

if TYPE_CHECKING:
    from edgeserve.bundle import Bundle
    from edgeserve.manifest import BatchingSection
    from edgeserve.types import Signature

log = logging.getLogger("edgeserve")

GPU_SWITCH_INTERVAL_S = 0.0005
"""With a GPU, a batch thread that finishes a copy or a run must get the GIL back from the
event loop at once: at Python's default 5 ms, a ResNet-18 batch of 32 took 2.1x its in-process
time inside the server on an H100, at 0.5 ms 1.4x (benchmarks/RESULTS-gpu.md)."""


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

    @classmethod
    def load(
        cls,
        bundle: Bundle,
        *,
        stats: ModelStats,
        backend: str | None = None,
        batching: BatchingSection | None = None,
        threads: int = 0,
    ) -> LocalEngine:
        """The bundle's model loaded on the backend that fits this machine (or the one asked
        for), behind its batcher: what a Runtime (and `doctor`) runs in this process.

        `batching` replaces the manifest's [batching] where a front knows better (Lambda runs
        one invocation at a time: aws_lambda/adapter.py); `threads`, this process's share of
        the cores where inference processes share the CPU: the backend's thread count unless
        [backend] threads sets one, and no thread pinned to a core."""
        manifest = bundle.manifest
        platform = probe()
        choice = choose(platform, prefer=bundle.planned_backends(), override=backend)
        if choice.name not in bundle.planned_backends():
            why = BY_NAME[choice.name].declines(bundle.signature, bundle.model_path)
            log.warning(
                "%s is not a backend this bundle was planned for (%s)%s: it serves the model "
                "unchecked by build",
                choice.name,
                ", ".join(bundle.planned_backends()),
                f", since {why}" if why else "",
            )
        policy = BatchPolicy.from_manifest(
            batching or manifest.batching, batched=bundle.signature.batched
        )
        device = default_device(platform)
        backend_threads = manifest.backend.threads or threads
        if device != "cpu":
            sys.setswitchinterval(GPU_SWITCH_INTERVAL_S)
        loaded = load_backend(
            choice.name,
            bundle.model_path,
            signature=bundle.signature,
            prepared=bundle.root,
            precision=manifest.backend.precision,
            threads=backend_threads,
            cuda_graphs=manifest.backend.cuda_graphs,
            shares_cpu=threads > 0,
            instances=policy.instances,
            device=device,
            profile=shape_profile(
                bundle.signature, policy.max_batch_size, policy.preferred_batch_sizes
            ),
        )
        has_handler = bundle.handler_path is not None
        samples = json_samples(bundle.samples_dir, bundle.signature, has_handler)
        shared = f"; backend threads: {backend_threads}" if backend_threads else ""
        name = manifest.function.name
        log.info("loaded %s on %s (%s%s)", name, choice.name, choice.reason, shared)
        return cls(loaded, bundle.signature, policy, stats, samples)

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
        backend = self.backend
        batches = warmup_batches(self.signature, sizes, self.samples, backend.profile, backend.name)
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
