"""A request's deadline, and which limit set it: a 504 says what ran out, so its reader knows
what to raise.

Two limits bound a request, both counted from its arrival at the server: the function's own,
[batching] timeout_ms (which the model config reports as Triton's queue policy,
default_timeout_microseconds), and the request's `timeout` parameter (microseconds, Triton's),
which may shorten it for that request, never lengthen it. The nearer one is the deadline. A
batch that waits for company longer than the limit (max_queue_delay_ms) is said to be the cause.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, NamedTuple

from edgeserve.errors import DeadlineExceeded

if TYPE_CHECKING:
    from edgeserve.manifest import BatchingSection


class Deadline(NamedTuple):
    """When a request reached the server and when it must be answered (time.monotonic())."""

    arrived: float
    deadline: float
    asked_s: float | None = None  # the request's `timeout` when it set the deadline

    @classmethod
    def of(cls, arrived: float | None, limit_s: float, asked_s: float | None) -> Deadline:
        """The deadline of a request that arrived at `arrived` (None: now), under the function's
        `limit_s` and the request's own `asked_s` (None: it asked for none)."""
        arrived = time.monotonic() if arrived is None else arrived
        if asked_s is None or asked_s >= limit_s:
            return cls(arrived, arrived + limit_s)
        return cls(arrived, arrived + asked_s, asked_s)

    def passed(self, error: DeadlineExceeded, batching: BatchingSection) -> DeadlineExceeded:
        """`error` (the batcher's: when it passed) with the limit that ran out and what to do."""
        if self.asked_s is not None:
            limit_ms = self.asked_s * 1e3
            which = (
                f"the request's own timeout ran out: parameters.timeout = "
                f"{round(self.asked_s * 1e6)} µs ({limit_ms:g} ms from its arrival). Hint: ask "
                f"for more (the function allows up to [batching] timeout_ms = "
                f"{batching.timeout_ms:g}), or leave parameters.timeout out"
            )
        else:
            limit_ms = batching.timeout_ms
            which = (
                f"the function's request timeout ran out: [batching] timeout_ms = {limit_ms:g} "
                "in function.toml (Triton's default_timeout_microseconds), from the request's "
                "arrival. Hint: raise it, or send fewer requests at once"
            )
        if batching.max_queue_delay_ms >= limit_ms:
            which += (
                f"; a batch waits for company up to [batching] max_queue_delay_ms = "
                f"{batching.max_queue_delay_ms:g}, as long as that limit or longer: lower it"
            )
        return DeadlineExceeded(f"{error.message}: {which}")
