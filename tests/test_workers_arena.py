"""A front's arena: blocks allocated and freed, tensors written once and read in place."""

from __future__ import annotations

import numpy as np
import pytest

from edgeserve.workers.arena import ALIGN, Arena, Blocks, block_size


@pytest.fixture
def arena() -> Arena:
    return Arena.create(4 * ALIGN * 16)


def test_blocks_are_first_fit_aligned_and_merge_back_when_freed() -> None:
    blocks = Blocks(8 * ALIGN)
    first, second, third = (blocks.allocate(size) for size in (1, ALIGN + 1, ALIGN))
    assert (first, second, third) == (0, ALIGN, 3 * ALIGN)
    blocks.free(second, ALIGN + 1)
    assert blocks.allocate(2 * ALIGN) == ALIGN  # the freed hole is reused first
    blocks.free(ALIGN, 2 * ALIGN)
    blocks.free(0, 1)
    blocks.free(3 * ALIGN, ALIGN)
    assert blocks.free_bytes == 8 * ALIGN
    assert blocks.allocate(8 * ALIGN) == 0  # every neighbour merged into one range


def test_a_full_arena_says_so_instead_of_overlapping() -> None:
    blocks = Blocks(2 * ALIGN)
    assert blocks.allocate(2 * ALIGN) == 0
    assert blocks.allocate(1) is None


def test_tensors_written_once_read_back_in_place(arena: Arena) -> None:
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    ids = np.array([[1, 2]], dtype=np.int64)
    size = block_size({"x": x, "ids": ids})
    placed = arena.place({"x": x, "ids": ids}, ALIGN, size)
    assert all(isinstance(where, tuple) for where in placed.values())  # in the arena, not inline
    seen = Arena(arena.fd, arena.size).tensors(placed)  # another mapping of the same memory
    np.testing.assert_array_equal(seen["x"], x)
    np.testing.assert_array_equal(seen["ids"], ids)
    seen["x"][0, 0, 0] = 99.0  # a view over shared memory, not a copy
    assert arena.tensors(placed)["x"][0, 0, 0] == 99.0


def test_what_does_not_fit_or_holds_objects_travels_inline(arena: Arena) -> None:
    big = np.ones((4, 64), dtype=np.float32)
    words = np.array([b"a", b"bc"], dtype=object)
    placed = arena.place({"big": big, "words": words}, 0, ALIGN)
    assert isinstance(placed["big"], np.ndarray) and isinstance(placed["words"], np.ndarray)
    copied = arena.copied(placed)
    np.testing.assert_array_equal(copied["big"], big)
    assert list(copied["words"]) == [b"a", b"bc"]
    assert block_size({"words": words}) == 0
