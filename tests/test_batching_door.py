"""The door: requests wait in line, bodies unread, for room in the queue (edgeserve/door.py)."""

from __future__ import annotations

import asyncio
import time

import pytest

from edgeserve.batching.door import Door
from edgeserve.errors import Unavailable


class Queue:
    """A queue of `limit` rows that requests fill as they pass the door."""

    def __init__(self, limit: int, rows: int = 0, wait_s: float = 1.0) -> None:
        self.limit = limit
        self.rows = rows
        self.door = Door(lambda: self.limit - self.rows, limit, wait_s)

    async def enter(self, name: str, order: list[str], deadline_s: float = 5.0) -> None:
        await self.door.enter(time.monotonic() + deadline_s)
        order.append(name)
        self.rows += 1
        self.door.queued()

    def free(self, rows: int) -> None:
        self.rows -= rows
        self.door.open()


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_with_room_a_request_walks_straight_in() -> None:
    async def main() -> list[str]:
        queue, order = Queue(limit=2), []
        await queue.enter("a", order)
        await queue.enter("b", order)
        return order

    assert asyncio.run(main()) == ["a", "b"]


def test_waiting_requests_enter_first_come_first_in_as_rows_free_up() -> None:
    async def main() -> list[str]:
        queue, order = Queue(limit=1, rows=1), []
        waiting = [asyncio.create_task(queue.enter(name, order)) for name in "abc"]
        await _settle()
        assert order == [] and queue.door.waiting == 3
        for _ in range(3):
            queue.free(1)
            await _settle()
        await asyncio.gather(*waiting)
        return order

    assert asyncio.run(main()) == ["a", "b", "c"]


def test_a_newcomer_does_not_jump_the_line() -> None:
    async def main() -> list[str]:
        queue, order = Queue(limit=1, rows=1), []
        first = asyncio.create_task(queue.enter("first", order))
        await _settle()
        queue.rows = 0  # room appears, but the door has not been told yet
        late = asyncio.create_task(queue.enter("late", order))
        await _settle()
        queue.free(0)
        await _settle()
        queue.free(1)
        await asyncio.gather(first, late)
        return order

    assert asyncio.run(main()) == ["first", "late"]


def test_no_room_within_the_wait_is_a_503_with_retry_after() -> None:
    async def main() -> Unavailable:
        queue = Queue(limit=1, rows=1, wait_s=0.05)
        with pytest.raises(Unavailable, match="queue full: 1 of 1 rows waiting") as refused:
            await queue.enter("a", [])
        assert queue.door.waiting == 0
        return refused.value

    assert asyncio.run(main()).retry_after_s == 0.05


def test_the_deadline_bounds_the_wait_when_it_comes_first() -> None:
    async def main() -> float:
        queue = Queue(limit=1, rows=1)
        started = time.monotonic()
        with pytest.raises(Unavailable, match=r"no room within 0\.0[0-9] s"):
            await queue.enter("a", [], deadline_s=0.05)
        return time.monotonic() - started

    assert asyncio.run(main()) < 0.5


def test_closing_refuses_everyone_waiting_and_every_newcomer() -> None:
    async def main() -> None:
        queue = Queue(limit=1, rows=1)
        waiting = asyncio.create_task(queue.enter("a", []))
        await _settle()
        queue.door.close("draining")
        with pytest.raises(Unavailable, match="draining"):
            await waiting
        queue.rows = 0
        with pytest.raises(Unavailable, match="draining"):
            await queue.enter("b", [])

    asyncio.run(main())


def test_a_cancelled_waiter_leaves_the_line() -> None:
    async def main() -> list[str]:
        queue, order = Queue(limit=1, rows=1), []
        gone = asyncio.create_task(queue.enter("gone", order))
        stays = asyncio.create_task(queue.enter("stays", order))
        await _settle()
        gone.cancel()
        await _settle()
        assert queue.door.waiting == 1
        queue.free(1)
        await stays
        return order

    assert asyncio.run(main()) == ["stays"]


def test_a_request_let_in_holds_its_row_until_it_queues_or_ends() -> None:
    """A burst at an empty queue: a queue's worth walk in, the next waits in line, bodies
    unread, though no row is queued yet; one that ends without queueing (a bad body) frees its
    row for whoever comes next."""

    async def main() -> None:
        door, done_reading = Door(lambda: 1, 1, wait_s=0.05), asyncio.Event()

        async def let_in_then_fails() -> None:
            await door.enter(time.monotonic() + 5)
            await done_reading.wait()  # reading its body, which turns out bad: never queued

        first = asyncio.create_task(let_in_then_fails())
        await _settle()
        with pytest.raises(Unavailable, match="no room within"):
            await door.enter(time.monotonic() + 5)
        done_reading.set()
        await first
        await door.enter(time.monotonic() + 5)

    asyncio.run(main())


def test_requests_let_in_by_other_doors_take_their_rows_too() -> None:
    """An inference process's door beside fronts that let requests in straight (workers/front.py):
    the rows they took, their bodies not queued yet, leave no room for whoever asks here."""

    async def main() -> None:
        queue, order, elsewhere = Queue(limit=2, wait_s=0.05), [], [1]
        queue.door.let_in_elsewhere = lambda: elsewhere[0]
        await queue.enter("a", order)
        with pytest.raises(Unavailable, match="1 requests let in ahead, no room within"):
            await queue.enter("b", order)
        elsewhere[0] = 0  # that request ended without queueing
        await queue.enter("b", order)
        assert order == ["a", "b"]

    asyncio.run(main())
