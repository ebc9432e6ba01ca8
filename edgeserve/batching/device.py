"""The device batches run on: how many workers feed it, and when a batch may start.

On a CPU every instance is a worker that assembles its batch and runs it. A GPU runs one batch
at a time per instance, and assembling a batch (copying every request's rows into the bound
input buffer) takes about as long as running it (ResNet-18, 32 rows of 602 KB: 6.0 ms to
assemble, 5.6 ms to run on an H100). With `stage_ahead` there are two workers per instance:
one assembles the next batch into its own buffers while the other's batch runs, and a batch
waits for a free slot of the device only once it is assembled.

The workers' threads are made before the first batch and each makes the backend's per-thread
state then (`start`'s `each_thread`): on a GPU a thread's first run of a bucket plans cuDNN's
kernels, and such a first run beside another thread's batch failed on an H100 with CUDA's
"operation not permitted when stream is capturing" (benchmarks/RESULTS-gpu.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from typing import TypeVar

T = TypeVar("T")
THREAD_START_S = 60.0


class Device:
    """Run slots of the device, and the workers that feed them."""

    def __init__(self, instances: int, stage_ahead: bool) -> None:
        self.stage_ahead = stage_ahead
        self.workers = instances * 2 if stage_ahead else instances
        self._slots = threading.BoundedSemaphore(instances) if stage_ahead else None
        self._threads: ThreadPoolExecutor | None = None

    async def start(self, each_thread: Callable[[], object] | None = None) -> None:
        """Make the workers' threads; `each_thread` runs once on each, one thread at a time,
        before any batch (a backend's per-thread state, made while nothing else runs)."""
        self._threads = ThreadPoolExecutor(self.workers, thread_name_prefix="edgeserve-batch")
        if each_thread is None:
            return
        everyone = threading.Barrier(self.workers)  # each holds a thread: the pool makes them all
        one_at_a_time = threading.Lock()

        def on_this_thread() -> None:
            everyone.wait(THREAD_START_S)
            with one_at_a_time:
                each_thread()

        await asyncio.gather(*(self.run(on_this_thread) for _ in range(self.workers)))

    async def run(self, work: Callable[..., T], *args: object) -> T:
        """`work(*args)` on one of the workers' threads."""
        return await asyncio.get_running_loop().run_in_executor(self._threads, work, *args)

    def stop(self) -> None:
        if self._threads is not None:
            self._threads.shutdown(wait=False, cancel_futures=True)

    def slot(self) -> AbstractContextManager[int]:
        """Hold one run slot (at once without stage-ahead); gives the nanoseconds waited."""
        return _AT_ONCE if self._slots is None else self._waited(self._slots)

    @staticmethod
    @contextlib.contextmanager
    def _waited(slots: threading.BoundedSemaphore) -> Iterator[int]:
        started = time.perf_counter_ns()
        with slots:
            yield time.perf_counter_ns() - started


_AT_ONCE = contextlib.nullcontext(0)
"""The slot of a device without stage-ahead: no generator made for every batch on a CPU."""
