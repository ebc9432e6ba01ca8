"""Where releases live on a device, and which to keep, as pure functions.

    <root>/engines/                         TensorRT engine cache, shared by every release
    <root>/<function>/releases/<version>-<hash12>/   one bundle each, newest by mtime
    <root>/<function>/current -> releases/<name>     switched atomically (ln -s tmp + mv -T)
    <root>/<function>/run/                  the service's pid, state and log

The remote scripts below are fixed strings run as `sh -c SCRIPT sh ARG...`: arguments reach
them only as positional parameters, never pasted into the script.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

SWITCH_SCRIPT = 'ln -sfn "$1" "$2.tmp" && mv -T "$2.tmp" "$2"'
"""Point the link $2 at $1 atomically: rename(2) replaces the old link in one step."""

LIST_SCRIPT = 'mkdir -p "$1" && cd "$1" && ls -1t'
"""Release names, newest first (a release's mtime is touched when it is deployed)."""

CURRENT_SCRIPT = 'readlink "$1" || true'

PRUNE_SCRIPT = 'cd "$1" && shift && rm -rf -- "$@"'


@dataclass(frozen=True)
class Layout:
    """The paths of one function under an install root (an absolute path on the device)."""

    root: str
    function: str

    @property
    def fn_dir(self) -> str:
        return f"{self.root}/{self.function}"

    @property
    def releases(self) -> str:
        return f"{self.fn_dir}/releases"

    @property
    def current(self) -> str:
        return f"{self.fn_dir}/current"

    @property
    def engines(self) -> str:
        return f"{self.root}/engines"

    def release(self, name: str) -> str:
        return f"{self.releases}/{name}"

    def run_file(self, name: str) -> str:
        return f"{self.fn_dir}/run/{name}"


def release_name(version: str, content_hash: str) -> str:
    """`<version>-<hash12>`: readable, and distinct for every distinct bundle."""
    safe_version = re.sub(r"[^A-Za-z0-9._+]", "_", version) or "0"
    return f"{safe_version}-{content_hash[:12]}"


def link_target(name: str) -> str:
    """What `current` points at: relative, so the install root can move as a whole."""
    return f"releases/{name}"


def name_of(link: str) -> str | None:
    """The release a `current` link (as readlink prints it) points at, or None."""
    link = link.strip().rstrip("/")
    return link.rsplit("/", 1)[-1] if link else None


def newest_first(listing: str) -> list[str]:
    return [line for line in listing.splitlines() if line and not line.startswith(".")]


def previous_release(names: list[str], current: str | None) -> str | None:
    """The release deployed before `current` (names newest first), if any."""
    if current not in names:
        return names[0] if names else None
    older = names[names.index(current) + 1 :]
    return older[0] if older else None


def prunable(names: list[str], keep: int, protect: set[str]) -> list[str]:
    """Releases beyond the newest `keep`, never one in `protect` (current, the one before it)."""
    return [name for name in names[keep:] if name not in protect]


def resolve_root(root: str, home: str) -> str:
    """Expand a leading `~` with the device user's $HOME: rsync and links need absolute paths."""
    if root == "~" or root.startswith("~/"):
        root = home.rstrip("/") + root[1:]
    if not root.startswith("/"):
        raise ValueError(f"install_root must be absolute or start with ~/, got {root!r}")
    return root.rstrip("/") or "/"
