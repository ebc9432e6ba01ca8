"""The device batches run on: how many workers feed it, and when a batch may start.

On a CPU every instance is a worker that assembles its batch and runs it. A GPU runs one batch
at a time per instance, and assembling a batch (copying every request's rows into the bound
input buffer) takes about as long as running it (ResNet-18, 32 rows of 602 KB: 6.0 ms to
assemble, 5.6 ms to run on an H100). With `stage_ahead` there are two workers per instance:
one assembles the next batch into its own buffers while the other's batch runs, and a batch
waits for a free slot of the device only once it is assembled.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator


class Device:
    """Run slots of the device, and the workers that feed them."""

    def __init__(self, instances: int, stage_ahead: bool) -> None:
        self.stage_ahead = stage_ahead
        self.workers = instances * 2 if stage_ahead else instances
        self._slots = threading.BoundedSemaphore(instances) if stage_ahead else None

    @contextlib.contextmanager
    def slot(self) -> Iterator[int]:
        """Hold one run slot (at once without stage-ahead); yields the nanoseconds waited."""
        if self._slots is None:
            yield 0
            return
        started = time.perf_counter_ns()
        with self._slots:
            yield time.perf_counter_ns() - started
