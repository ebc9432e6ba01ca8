"""Shared-memory regions that clients on the same machine register, as in Triton's extensions.

A client creates a region (POSIX shared memory, `shm_open` under /dev/shm), registers a window
of it under a name, then names that region (and an offset and byte size inside it) in place of
a tensor's data, for inputs and outputs alike. One registry holds every kind of region under one
namespace, as Triton's shared-memory manager does: `kind` tells system regions from CUDA ones
(another module adds those; a region only has to read and write host bytes).

Inputs are read without a copy: the tensor is a read-only view of the mapping. Unregistering
drops the registry's reference only; a mapping still viewed by a request in flight stays mapped
until that request lets go, so a client that unregisters early can never make the server read
unmapped memory.
"""

from __future__ import annotations

import mmap
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from edgeserve.errors import InvalidInput, ModelNotFound

SHM_ROOT = Path("/dev/shm")  # noqa: S108 - where Linux keeps POSIX shm_open objects


class Region(Protocol):
    """A registered window of shared memory: `byte_size` bytes readable and writable."""

    @property
    def kind(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def byte_size(self) -> int: ...

    def read(self, offset: int, size: int) -> memoryview: ...
    def write(self, offset: int, data: bytes | memoryview) -> None: ...
    def status(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class Slice:
    """Where a tensor lives: `byte_size` bytes at `offset` in region `region`."""

    region: str
    offset: int
    byte_size: int


@dataclass(frozen=True, eq=False)
class SystemRegion:
    """A window [offset, offset + byte_size) of the POSIX shared-memory object `key`."""

    kind = "system"
    name: str
    key: str
    offset: int
    byte_size: int
    _map: mmap.mmap

    @classmethod
    def open(cls, name: str, key: Any, offset: Any, byte_size: Any) -> SystemRegion:
        """Map `key`, refusing (400) a key or window that does not fit it."""
        where = f"system shared memory region `{name}`"
        if not isinstance(key, str) or not key.strip("/") or "/" in key.strip("/"):
            raise InvalidInput(
                f"{where}: `key` must be a shared-memory name like '/input0', got {key!r}"
            )
        start, size = _count(where, "offset", offset), _count(where, "byte_size", byte_size)
        path = SHM_ROOT / key.lstrip("/")
        try:
            fd = os.open(path, os.O_RDWR)
        except OSError as exc:
            raise InvalidInput(f"{where}: cannot open key {key!r}: {exc.strerror}") from None
        try:
            total = os.fstat(fd).st_size
            if size == 0 or start + size > total:
                raise InvalidInput(
                    f"{where}: offset {start} + byte_size {size} must lie within key {key!r} "
                    f"({total} bytes) and byte_size must be > 0"
                )
            mapping = mmap.mmap(fd, total)
        finally:
            os.close(fd)
        return cls(name, key, start, size, mapping)

    def read(self, offset: int, size: int) -> memoryview:
        start = self.offset + offset
        return memoryview(self._map)[start : start + size].toreadonly()

    def write(self, offset: int, data: bytes | memoryview) -> None:
        start = self.offset + offset
        self._map[start : start + len(data)] = data

    def status(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "key": self.key,
            "offset": self.offset,
            "byte_size": self.byte_size,
        }


class Regions:
    """Every region registered with this server, by name (one namespace for all kinds)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._regions: dict[str, Region] = {}

    def register(self, region: Region) -> None:
        with self._lock:
            if region.name in self._regions:
                raise InvalidInput(
                    f"shared memory region `{region.name}` is already registered; "
                    "unregister it first"
                )
            self._regions[region.name] = region

    def unregister(self, kind: str, name: str | None = None) -> None:
        """Forget one region of `kind` (an unknown name is a no-op, as in Triton), or all."""
        with self._lock:
            for region in list(self._of_kind(kind)):
                if name is None or region.name == name:
                    del self._regions[region.name]

    def status(self, kind: str, name: str | None = None) -> list[dict[str, Any]]:
        with self._lock:
            found = [r.status() for r in self._of_kind(kind) if name in (None, r.name)]
        if name is not None and not found:
            raise ModelNotFound(f"no {kind} shared memory region named `{name}` is registered")
        return found

    def read(self, where: str, place: Slice) -> memoryview:
        """The bytes of an input at `place`; 400 when the region or the window is wrong."""
        return self._fitting(where, place).read(place.offset, place.byte_size)

    def write(self, where: str, place: Slice, data: bytes | memoryview) -> None:
        """Write an output's bytes at `place`; 400 when they do not fit its byte size."""
        region = self._fitting(where, place)
        if len(data) > place.byte_size:
            raise InvalidInput(
                f"{where}: needs {len(data)} bytes, but shared_memory_byte_size is "
                f"{place.byte_size}"
            )
        region.write(place.offset, data)

    def check(self, where: str, place: Slice) -> None:
        """Refuse a slice before any work: unknown region, window outside it."""
        self._fitting(where, place)

    def _fitting(self, where: str, place: Slice) -> Region:
        with self._lock:
            region = self._regions.get(place.region)
        if region is None:
            raise InvalidInput(f"{where}: shared memory region `{place.region}` is not registered")
        if place.offset + place.byte_size > region.byte_size:
            raise InvalidInput(
                f"{where}: shared_memory_offset {place.offset} + shared_memory_byte_size "
                f"{place.byte_size} runs past region `{place.region}` ({region.byte_size} bytes)"
            )
        return region

    def _of_kind(self, kind: str) -> Iterator[Region]:
        return (region for region in self._regions.values() if region.kind == kind)


def _count(where: str, field: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidInput(f"{where}: `{field}` must be a non-negative integer, got {value!r}")
    return value
