"""Bundle archives (.tar.gz): written byte for byte the same from the same files, read defensively.

Writing fixes everything a tar or gzip header would take from the machine (order, mtime, owner,
mode, the gzip file name), so the same bundle gives the same archive. Reading refuses, before
anything is written, every member that is not a plain file or folder inside the destination.
"""

from __future__ import annotations

import gzip
import io
import os
import re
import shutil
import tarfile
import tempfile
from collections.abc import Iterable
from pathlib import Path, PurePosixPath

from edgeserve.errors import BundleError

ARCHIVE_SUFFIXES = (".tar.gz", ".tgz")
_CHUNK = 1 << 20
_DRIVE = re.compile(r"^[A-Za-z]:")  # C:/... is absolute where the archive may be opened


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


def extract_archive(archive: Path, dest: Path) -> None:
    """Extract a bundle archive into the folder `dest`, refusing any unsafe member first."""
    try:
        with tarfile.open(archive, "r:gz") as tar:
            members = tar.getmembers()
            for member in members:
                check_member(member, archive)
            for member in members:
                _extract(tar, member, dest)
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise BundleError(f"{archive}: not a readable bundle archive ({exc})") from None


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
    source = tar.extractfile(member)
    if source is None:  # pragma: no cover - check_member let only regular files through
        raise BundleError(f"member {member.name!r} has no data")
    target.parent.mkdir(parents=True, exist_ok=True)
    with source, target.open("wb") as out:
        shutil.copyfileobj(source, out, _CHUNK)
