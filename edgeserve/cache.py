"""The bundle cache: what `serve`, `bench` and `deploy` build from a source folder (or extract
from an archive) lives under `$EDGESERVE_CACHE_DIR/bundles` (default ~/.cache/edgeserve/bundles),
one folder per content, so an unchanged source opens at once.

Every edit of a source makes a new entry, so the cache is bounded: after each new entry, the
least recently used ones beyond `EDGESERVE_CACHE_MAX_BUNDLES` (default 16) or beyond
`EDGESERVE_CACHE_MAX_MB` in all (default 4096) are removed; the entry just made always stays.
`edgeserve cache list` shows the entries, `edgeserve cache prune` trims them by hand.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from edgeserve.errors import ConfigError

DEFAULT_MAX_BUNDLES = 16
DEFAULT_MAX_MB = 4096.0


@dataclass(frozen=True)
class Entry:
    """One cached bundle; `last_used` is when it was last built or opened (epoch seconds)."""

    path: Path
    size_bytes: int
    last_used: float

    @property
    def name(self) -> str:
        return self.path.name


@dataclass(frozen=True)
class Bounds:
    max_bundles: int = DEFAULT_MAX_BUNDLES
    max_mb: float = DEFAULT_MAX_MB

    @classmethod
    def from_env(cls) -> Bounds:
        return cls(
            int(_env_number("EDGESERVE_CACHE_MAX_BUNDLES", DEFAULT_MAX_BUNDLES)),
            _env_number("EDGESERVE_CACHE_MAX_MB", DEFAULT_MAX_MB),
        )


def cache_root() -> Path:
    """Where built and extracted bundles are kept: $EDGESERVE_CACHE_DIR or ~/.cache/edgeserve."""
    configured = os.environ.get("EDGESERVE_CACHE_DIR")
    return Path(configured) if configured else Path.home() / ".cache" / "edgeserve"


def bundles_dir() -> Path:
    return cache_root() / "bundles"


def entries() -> list[Entry]:
    """The cached bundles, most recently used first (scratch folders of a build in progress
    start with a dot and are not listed)."""
    folder = bundles_dir()
    if not folder.is_dir():
        return []
    found = [
        Entry(path, _size(path), path.stat().st_mtime)
        for path in folder.iterdir()
        if not path.name.startswith(".") and path.is_dir()
    ]
    return sorted(found, key=lambda entry: entry.last_used, reverse=True)


def touch(bundle_root: Path) -> None:
    """Mark a cached bundle as just used (its folder's mtime is the LRU clock)."""
    now = time.time()
    os.utime(bundle_root, (now, now))


def plan_prune(found: Sequence[Entry], bounds: Bounds, keep: Path | None = None) -> list[Entry]:
    """The entries to remove, least recently used first, so that the rest fit `bounds` (pure)."""
    count, total, full = 0, 0, False
    doomed = []
    for entry in sorted(found, key=lambda e: (e.path != keep, -e.last_used)):
        count, total = count + 1, total + entry.size_bytes
        full = full or count > bounds.max_bundles or total > bounds.max_mb * 2**20
        if full and entry.path != keep:
            doomed.append(entry)
    return doomed[::-1]


def prune(bounds: Bounds | None = None, keep: Path | None = None) -> list[Entry]:
    """Remove what does not fit `bounds` (default: the environment's); what was removed."""
    doomed = plan_prune(entries(), bounds or Bounds.from_env(), keep)
    for entry in doomed:
        shutil.rmtree(entry.path, ignore_errors=True)
    return doomed


def _size(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


def _env_number(name: str, default: float) -> float:
    text = os.environ.get(name)
    if text is None:
        return default
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if value < 0:
        raise ConfigError(f"${name}={text!r}: expected a number >= 0")
    return value


def ago(when: float) -> str:
    """How long ago a time.time() was, as `cache list` shows it: "3 min ago"."""
    seconds = max(0.0, time.time() - when)
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f} {unit} ago"
    return f"{seconds:.0f} s ago"
