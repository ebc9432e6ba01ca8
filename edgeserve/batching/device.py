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
from contextlib import AbstractContextManager


class Device:
    """Run slots of the device, and the workers that feed them."""

    def __init__(self, instances: int, stage_ahead: bool) -> None:
        self.stage_ahead = stage_ahead
        self.workers = instances * 2 if stage_ahead else instances
        self._slots = threading.BoundedSemaphore(instances) if stage_ahead else None

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
