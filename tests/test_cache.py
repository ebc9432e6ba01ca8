"""The bundle cache's pruning rule as a pure function: least recently used go first."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgeserve.cache import Bounds, Entry, plan_prune

MB = 2**20
ENTRIES = [Entry(Path(f"/c/{name}"), size * MB, used) for name, size, used in
           [("a", 10, 1.0), ("b", 10, 4.0), ("c", 30, 3.0), ("d", 10, 2.0)]]  # fmt: skip


@pytest.mark.parametrize(
    ("bounds", "keep", "removed"),
    [
        (Bounds(4, 1000), None, []),
        (Bounds(2, 1000), None, ["a", "d"]),  # least recently used first
        (Bounds(10, 45), None, ["a", "d"]),  # b + c = 40 MB fit, adding d would not
        (Bounds(10, 5), None, ["a", "d", "c", "b"]),
        (Bounds(1, 1000), Path("/c/a"), ["d", "c", "b"]),  # the entry just made always stays
        (Bounds(0, 1000), None, ["a", "d", "c", "b"]),
    ],
)
def test_plan_prune(bounds: Bounds, keep: Path | None, removed: list[str]) -> None:
    assert [entry.name for entry in plan_prune(ENTRIES, bounds, keep)] == removed
