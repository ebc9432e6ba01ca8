"""Shared-memory regions that clients on the same machine register, as in Triton's extensions.

A client creates a region (POSIX shared memory, `shm_open` under /dev/shm), registers a window
of it under a name, then names that region (and an offset and byte size inside it) in place of
a tensor's data, for inputs and outputs alike. One registry holds every kind of region under one
namespace, as Triton's shared-memory manager does: `kind` tells system regions from CUDA ones
(`cudamemory`; a region only has to read and write host bytes).

A system region is never mapped into the server: its owner may shrink the object at any time,
and touching a mapping past the object's end kills the process (SIGBUS) where Python cannot
catch it. An input is copied out with one `pread` instead (about a memcpy), and an output
written with `pwrite`; a shrunk object reads short, which is a 400.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import threading
import uuid
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from edgeserve.cudamemory import open_cuda_region
from edgeserve.errors import InvalidInput, ModelNotFound, echo, echo_json, echo_repr
from edgeserve.transport import HTTP, Transport

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
    """A window [offset, offset + byte_size) of the POSIX shared-memory object `key`.

    The object stays open but is not mapped: its owner may shrink it after registering, and no
    check of its size before touching a mapping can rule out a shrink right after the check
    (a client toggling the size killed the server that way). So inputs are read with `pread`
    into the server's own memory, one copy (benchmarks/shm_read.py: 84 us for 1 MiB, 0.66 ms
    for a 6 MiB frame on the 2-core machine, where a mapped view cost nothing), and a short
    read is a 400. Outputs are written with `pwrite` once the object is seen to hold them; a
    shrink racing that check makes `pwrite` grow the object back, which harms no one."""

    kind = "system"
    name: str
    key: str
    offset: int
    byte_size: int
    _fd: int

    @classmethod
    def open(cls, name: str, key: Any, offset: Any, byte_size: Any) -> SystemRegion:
        """Open `key`, refusing (400) a key or window that does not fit it."""
        where = f"system shared memory region `{echo(name)}`"
        if not isinstance(key, str) or not key.strip("/") or "/" in key.strip("/") or "\0" in key:
            raise InvalidInput(
                f"{where}: `key` must be a shared-memory name like '/input0', got {echo_json(key)}"
            )
        start, size = _count(where, "offset", offset), _count(where, "byte_size", byte_size)
        path = SHM_ROOT / key.lstrip("/")
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)  # a symlink could lead anywhere
        except OSError as exc:
            raise InvalidInput(
                f"{where}: cannot open key {echo_repr(key)}: {exc.strerror}"
            ) from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise InvalidInput(f"{where}: key {echo_repr(key)} is not a shared-memory object")
            total = info.st_size
            if size == 0 or start + size > total:
                raise InvalidInput(
                    f"{where}: offset {start} + byte_size {size} must lie within key "
                    f"{echo_repr(key)} ({total} bytes) and byte_size must be > 0"
                )
        except BaseException:
            os.close(fd)
            raise
        region = cls(name, key, start, size, fd)
        weakref.finalize(region, os.close, fd)
        return region

    def read(self, offset: int, size: int) -> memoryview:
        start = self.offset + offset
        view = np.empty(size, np.uint8).data  # not zeroed: pread fills it all
        done = 0
        while done < size:
            got = os.preadv(self._fd, [view[done:]], start + done)
            if got == 0:
                raise self._shrunk(start, size)
            done += got
        return view.toreadonly()

    def write(self, offset: int, data: bytes | memoryview) -> None:
        view = memoryview(data).cast("B")
        start = self._within(offset, len(view))
        done = 0
        while done < len(view):
            done += os.pwrite(self._fd, view[done:], start + done)

    def _within(self, offset: int, size: int) -> int:
        """Where [offset, offset + size) of the window starts in the object, once the object
        is seen to still hold it."""
        start = self.offset + offset
        if start + size > os.fstat(self._fd).st_size:
            raise self._shrunk(start, size)
        return start

    def _shrunk(self, start: int, size: int) -> InvalidInput:
        total = os.fstat(self._fd).st_size
        return InvalidInput(
            f"system shared memory region `{echo(self.name)}`: key {echo_repr(self.key)} is now "
            f"{total} bytes, too small for bytes {start}..{start + size} of it (shrunk since it "
            "was registered?); register it again"
        )

    def status(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "key": self.key,
            "offset": self.offset,
            "byte_size": self.byte_size,
        }


Opener = Callable[[str, Mapping[str, Any], Transport], Region]
"""Maps a region from its name and register request (400 on a bad one, in the words of the
transport it came by)."""


def open_system_region(name: str, body: Mapping[str, Any], transport: Transport = HTTP) -> Region:
    """A system region from Triton's register request {"key", "offset", "byte_size"} (its
    messages read alike on every transport)."""
    missing = sorted({"key", "byte_size"} - set(body))
    if missing:
        raise InvalidInput(
            f"system shared memory region `{echo(name)}`: the register request lacks {missing}; "
            'expected {"key": "/name", "offset": 0, "byte_size": N}'
        )
    return SystemRegion.open(name, body["key"], body.get("offset", 0), body["byte_size"])


OPENERS: dict[str, Opener] = {"system": open_system_region, "cuda": open_cuda_region}


class Regions:
    """Every region registered with this server, by name (one namespace for all kinds).

    A registration is its kind and request body. With `store` (a folder every process of one
    server shares: the front processes of `workers`), registrations live there as one file
    each, so a region registered through one front serves requests that reach another; each
    process maps a region on first use and maps it again when the registration changed.
    """

    def __init__(self, openers: Mapping[str, Opener] = OPENERS, store: Path | None = None) -> None:
        self._openers = openers
        self._book: _Book = _Folder(store) if store is not None else _Memory()
        self._lock = threading.Lock()
        self._mapped: dict[str, tuple[_Entry, Region]] = {}

    def register(
        self, kind: str, name: str, body: Mapping[str, Any], transport: Transport = HTTP
    ) -> None:
        entry = _Entry(kind, dict(body))
        region = self._openers[kind](name, entry.body, transport)  # refused before booking
        self._book.add(name, entry)
        with self._lock:
            self._mapped[name] = (entry, region)
        self._let_go()

    def unregister(self, kind: str, name: str | None = None) -> None:
        """Forget one region of `kind` (an unknown name is a no-op, as in Triton), or all."""
        for found, entry in self._book.entries().items():
            if entry.kind == kind and name in (None, found):
                self._book.remove(found)
        self._let_go()

    def _let_go(self) -> None:
        """Close what this process opened for registrations that are gone or changed (through
        any front): each holds its object open, and a client registering and unregistering
        names of its own ran the server out of file descriptors."""
        booked = self._book.entries()
        with self._lock:
            for name, (entry, _) in list(self._mapped.items()):
                if booked.get(name) != entry:
                    del self._mapped[name]

    def status(self, kind: str, name: str | None = None) -> list[dict[str, Any]]:
        names = [n for n, e in self._book.entries().items() if e.kind == kind and name in (None, n)]
        found = [region.status() for region in map(self._region, names) if region is not None]
        if name is not None and not found:
            raise ModelNotFound(
                f"no {kind} shared memory region named `{echo(name)}` is registered"
            )
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
        region = self._region(place.region)
        if region is None:
            raise InvalidInput(
                f"{where}: shared memory region `{echo(place.region)}` is not registered"
            )
        if place.offset + place.byte_size > region.byte_size:
            raise InvalidInput(
                f"{where}: shared_memory_offset {place.offset} + shared_memory_byte_size "
                f"{place.byte_size} runs past region `{echo(place.region)}` "
                f"({region.byte_size} bytes)"
            )
        return region

    def _region(self, name: str) -> Region | None:
        """The region booked under `name`, mapped in this process (again, if it changed)."""
        entry = self._book.get(name)
        with self._lock:
            mapped = self._mapped.pop(name, None) if entry is None else self._mapped.get(name)
        if entry is None:
            return None
        if mapped is not None and mapped[0] == entry:
            return mapped[1]
        try:
            region = self._openers[entry.kind](name, entry.body, HTTP)  # refused: as unbooked
        except InvalidInput:  # its object went away since: as good as unregistered
            return None
        with self._lock:
            self._mapped[name] = (entry, region)
        return region


@dataclass(frozen=True)
class _Entry:
    kind: str
    body: dict[str, Any]


class _Book(Protocol):
    def add(self, name: str, entry: _Entry) -> None: ...
    def remove(self, name: str) -> None: ...
    def get(self, name: str) -> _Entry | None: ...
    def entries(self) -> dict[str, _Entry]: ...


class _Memory:
    """Registrations of one process."""

    def __init__(self) -> None:
        self._entries: dict[str, _Entry] = {}
        self._lock = threading.Lock()

    def add(self, name: str, entry: _Entry) -> None:
        with self._lock:
            if name in self._entries:
                raise _taken(name)
            self._entries[name] = entry

    def remove(self, name: str) -> None:
        with self._lock:
            self._entries.pop(name, None)

    def get(self, name: str) -> _Entry | None:
        return self._entries.get(name)

    def entries(self) -> dict[str, _Entry]:
        with self._lock:
            return dict(self._entries)


class _Folder:
    """Registrations shared by processes: one JSON file per name, created exclusively (the
    file system decides who registered a name first)."""

    def __init__(self, root: Path) -> None:
        self._root = root
        root.mkdir(parents=True, exist_ok=True)

    def add(self, name: str, entry: _Entry) -> None:
        """Written aside, then linked into place: a reader never sees half a file."""
        staged = self._root / f".{uuid.uuid4().hex}"
        staged.write_text(json.dumps({"name": name, "kind": entry.kind, "body": entry.body}))
        try:
            os.link(staged, self._path(name))
        except FileExistsError:
            raise _taken(name) from None
        finally:
            staged.unlink()

    def remove(self, name: str) -> None:
        self._path(name).unlink(missing_ok=True)

    def get(self, name: str) -> _Entry | None:
        return self._read(self._path(name))[1]

    def entries(self) -> dict[str, _Entry]:
        found = (self._read(path) for path in sorted(self._root.glob("*.json")))
        return {name: entry for name, entry in found if entry is not None}

    def _path(self, name: str) -> Path:
        """A name's file: a digest, since a name of any length is valid (its hex, used until
        names over 125 bytes failed with "File name too long", is not)."""
        digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()
        return self._root / f"{digest}.json"

    @staticmethod
    def _read(path: Path) -> tuple[str, _Entry | None]:
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            return "", None
        return data["name"], _Entry(data["kind"], data["body"])


def _taken(name: str) -> InvalidInput:
    return InvalidInput(
        f"shared memory region `{echo(name)}` is already registered; unregister it first"
    )


def _count(where: str, field: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidInput(
            f"{where}: `{field}` must be a non-negative integer, got {echo_json(value)}"
        )
    return value
