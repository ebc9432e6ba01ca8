"""Bundle archives (.tar.gz): written byte for byte the same from the same files, read defensively.

Writing fixes everything a tar or gzip header would take from the machine (order, mtime, owner,
mode, the gzip file name), so the same bundle gives the same archive. Reading refuses, before
anything is written, every member that is not a plain file or folder inside the destination, and
any archive whose headers declare more than the size limits (or than the disk has room for).
"""

from __future__ import annotations

import contextlib
import gzip
import io
import os
import re
import shutil
import tarfile
import tempfile
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO

from edgeserve.errors import BundleError, ConfigError

ARCHIVE_SUFFIXES = (".tar.gz", ".tgz")
_CHUNK = 1 << 20
_DRIVE = re.compile(r"^[A-Za-z]:")  # C:/... is absolute where the archive may be opened
_RATIO_FLOOR = 64 << 20  # small archives of zeros are fine: the ratio cap starts past 64 MiB
_HEADROOM = 64 << 20  # left free on the cache's disk after extracting
LIMIT_ENV = "EDGESERVE_MAX_BUNDLE_MB"
LIMIT_HINT = f"a larger bundle needs {LIMIT_ENV} set to its size in MB"


def is_archive(path: Path) -> bool:
    return path.name.endswith(ARCHIVE_SUFFIXES)


def write_archive(dest: Path, members: Iterable[tuple[str, Path | bytes]]) -> Path:
    """Write `members` (archive name -> file or bytes) as a deterministic .tar.gz, atomically."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    handle, partial = tempfile.mkstemp(prefix=f".{dest.name}-", dir=dest.parent)
    try:
        with (
            os.fdopen(handle, "wb") as raw,
            gzip.GzipFile("", "wb", 6, raw, mtime=0) as zipped,
            tarfile.open(fileobj=zipped, mode="w", format=tarfile.PAX_FORMAT) as tar,
        ):
            for name, content in sorted(members, key=lambda member: member[0]):
                _add(tar, name, content)
        Path(partial).replace(dest)
    except BaseException:
        Path(partial).unlink(missing_ok=True)
        raise
    return dest


def _add(tar: tarfile.TarFile, name: str, content: Path | bytes) -> None:
    info = tarfile.TarInfo(name)
    info.mode, info.mtime, info.uid, info.gid, info.uname, info.gname = 0o644, 0, 0, 0, "", ""
    if isinstance(content, bytes):
        info.size = len(content)
        tar.addfile(info, io.BytesIO(content))
        return
    info.size = content.stat().st_size
    with content.open("rb") as source:
        tar.addfile(info, source)


@dataclass(frozen=True)
class Limits:
    """Caps checked against an archive's headers before a byte is written (a 1 MB archive may
    declare a 1 GiB member: gzip packs zeros about 1000:1)."""

    member_bytes: int = 4 << 30
    total_bytes: int = 8 << 30
    ratio: int = 100  # unpacked / packed; models and IR weights pack about 1.1:1
    members: int = 10_000

    @classmethod
    def from_env(cls) -> Limits:
        """`EDGESERVE_MAX_BUNDLE_MB` lowers or raises the total (and so the member) cap."""
        configured = os.environ.get(LIMIT_ENV)
        if not configured:
            return cls()
        try:
            total = int(configured) << 20
        except ValueError:
            raise ConfigError(f"{LIMIT_ENV}={configured!r}: expected whole MB") from None
        return cls(member_bytes=min(cls.member_bytes, total), total_bytes=total)


class SafeArchive:
    """A bundle archive opened for reading: members are checked (kind, path, sizes) as their
    headers stream by, so an unsafe or oversized one stops the read before anything is written."""

    def __init__(self, path: Path, tar: tarfile.TarFile, members: list[tarfile.TarInfo]) -> None:
        self.path, self._tar, self.members = path, tar, members

    @classmethod
    @contextlib.contextmanager
    def open(cls, path: Path, limits: Limits) -> Iterator[SafeArchive]:
        try:
            with tarfile.open(path, "r:gz") as tar:
                yield cls(path, tar, _checked_members(tar, path, limits))
        except (tarfile.TarError, OSError, EOFError, zlib.error) as exc:
            raise BundleError(f"{path}: not a readable bundle archive ({exc})") from None

    @property
    def files(self) -> list[str]:
        return [member.name for member in self.members if member.isfile()]

    def read(self, name: str, max_bytes: int) -> bytes:
        """One small member's bytes (an index file), refusing one over `max_bytes`."""
        member = next((m for m in self.members if m.isfile() and m.name == name), None)
        if member is None:
            raise BundleError(f"{self.path}: no {name} in the archive")
        if member.size > max_bytes:
            raise BundleError(f"{self.path}: {name} is {member.size} bytes, over {max_bytes}")
        with _open_member(self._tar, member) as source:
            return source.read()

    def extract_to(self, dest: Path) -> None:
        """Write every member under `dest`, once the disk is known to hold them all."""
        needed = sum(member.size for member in self.members)
        free = shutil.disk_usage(dest).free
        if needed + _HEADROOM > free:
            raise BundleError(
                f"{self.path}: unpacks to {needed >> 20} MB but {dest} has {free >> 20} MB free"
            )
        for member in self.members:
            _extract(self._tar, member, dest)


def _checked_members(tar: tarfile.TarFile, path: Path, limits: Limits) -> list[tarfile.TarInfo]:
    """Every member, checked as its header is read; the caps stop a bomb at its first header."""
    packed = max(path.stat().st_size, 1)
    members: list[tarfile.TarInfo] = []
    total = 0
    for member in tar:
        check_member(member, path)
        total += member.size
        problem = _over_limits(member, total, packed, len(members) + 1, limits)
        if problem:
            raise BundleError(f"{path}: {problem}; refusing to extract. Hint: {LIMIT_HINT}")
        members.append(member)
    return members


def _over_limits(
    member: tarfile.TarInfo, total: int, packed: int, count: int, limits: Limits
) -> str | None:
    if member.size > limits.member_bytes:
        return f"member {member.name!r} declares {member.size} bytes, over {limits.member_bytes}"
    if total > limits.total_bytes:
        return f"members declare over {limits.total_bytes} bytes in all"
    if total > _RATIO_FLOOR and total > limits.ratio * packed:
        return f"{packed} packed bytes declare {total} unpacked (over {limits.ratio}:1)"
    if count > limits.members:
        return f"over {limits.members} members"
    return None


def check_member(member: tarfile.TarInfo, archive: Path) -> None:
    """Only plain files and folders with relative paths that stay inside the bundle may pass."""
    path = PurePosixPath(member.name)
    problem = None
    if path.is_absolute() or member.name.startswith(("/", "\\")) or _DRIVE.match(member.name):
        problem = "has an absolute path"
    elif ".." in path.parts or "\\" in member.name:
        problem = "would land outside the bundle"
    elif member.issym() or member.islnk():
        problem = f"is a link (to {member.linkname!r}); bundles hold no links"
    elif not (member.isfile() or member.isdir()):
        problem = "is a device, fifo or other special file"
    if problem:
        raise BundleError(
            f"{archive}: member {member.name!r} {problem}; refusing to extract. "
            "Hint: only open archives made by `edgeserve build --archive`"
        )


def _extract(tar: tarfile.TarFile, member: tarfile.TarInfo, dest: Path) -> None:
    target = dest.joinpath(*PurePosixPath(member.name).parts)
    if member.isdir():
        target.mkdir(parents=True, exist_ok=True)
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    with _open_member(tar, member) as source, target.open("wb") as out:
        shutil.copyfileobj(source, out, _CHUNK)


def _open_member(tar: tarfile.TarFile, member: tarfile.TarInfo) -> IO[bytes]:
    source = tar.extractfile(member)
    if source is None:  # pragma: no cover - check_member let only regular files through
        raise BundleError(f"member {member.name!r} has no data")
    return source
