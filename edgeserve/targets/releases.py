"""Where releases live on a device, which went live, and which to keep, as pure functions.

    <root>/engines/                         TensorRT engine cache, shared by every release
    <root>/deploy.lock                      held (flock) by the one deploy running on the device
    <root>/<function>/releases/<version>-<hash12>/   one release each:
        bundle/                             the bundle exactly as built (its hashes verified)
        .venv/                              its environment, made on the device
    <root>/<function>/current -> releases/<name>     switched atomically (ln -s tmp + mv -T)
    <root>/<function>/live                  the releases that went live, oldest first
    <root>/<function>/run/                  the service's pid, state and log

`live` is the device's own record, so rollback works from any machine: a release is written
there only once it answered its health check as the live one; a deploy that failed never is,
and its folder is removed. Rollback goes to the entry below the current one and pops the
current one, so rolling back twice goes two releases back, never to a release that failed.

The remote scripts below are fixed strings run as `sh -c SCRIPT sh ARG...`: arguments reach
them only as positional parameters, never pasted into the script.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

SWITCH_SCRIPT = 'ln -sfn "$1" "$2.tmp" && mv -T "$2.tmp" "$2"'
"""Point the link $2 at $1 atomically: rename(2) replaces the old link in one step."""

LIST_SCRIPT = 'mkdir -p "$1" && cd "$1" && ls -1'
"""The release folders on the device."""

READ_SCRIPT = 'cat "$1" 2>/dev/null || true'

RECORD_SCRIPT = 'f=$1 && shift && printf "%s\\n" "$@" > "$f.tmp" && mv "$f.tmp" "$f"'
"""Replace the file $1 with the lines $2... (written aside, then renamed over it)."""

CURRENT_SCRIPT = 'readlink "$1" || true'

PRUNE_SCRIPT = 'cd "$1" && shift && rm -rf -- "$@"'


BUNDLE_DIR = "bundle"


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
    def live(self) -> str:
        return f"{self.fn_dir}/live"

    @property
    def lock(self) -> str:
        return f"{self.root}/deploy.lock"

    @property
    def engines(self) -> str:
        return f"{self.root}/engines"

    def release(self, name: str) -> str:
        return f"{self.releases}/{name}"

    def bundle(self, name: str) -> str:
        """The bundle of a release; beside it, not in it, the venv (a bundle has no extras)."""
        return f"{self.release(name)}/{BUNDLE_DIR}"

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


def lines(text: str) -> list[str]:
    """Names, one a line, as the remote scripts print them (dot-files are not releases)."""
    return [line for line in text.splitlines() if line and not line.startswith(".")]


def live_history(recorded: list[str], current: str | None, existing: list[str]) -> list[str]:
    """The live record as it stands: entries whose folder is gone dropped; a device deployed
    before the record existed starts with its current release (it was live)."""
    history = [name for name in recorded if name in existing]
    if not recorded and current in existing:
        history = [current]
    return history


def went_live(history: list[str], name: str) -> list[str]:
    """The record once `name` answered as the live release."""
    return history if history[-1:] == [name] else [*history, name]


def rollback_target(history: list[str], current: str | None) -> tuple[str | None, list[str]]:
    """The live release before `current`, and the record once it is live again (None: none)."""
    below = list(history)
    while below and below[-1] == current:
        below.pop()
    return (below[-1], below) if below else (None, history)


def keep_set(history: list[str], keep: int, current: str | None) -> set[str]:
    """The releases to keep: current, the newest `keep` live ones, and the one rollback goes to."""
    kept = set(list(dict.fromkeys(reversed(history)))[:keep])
    target, _ = rollback_target(history, current)
    return kept | {name for name in (current, target) if name is not None}


def prunable(existing: list[str], kept: set[str]) -> list[str]:
    """Every release folder not kept: older ones, and those that never went live."""
    return sorted(name for name in existing if name not in kept)


def resolve_root(root: str, home: str) -> str:
    """Expand a leading `~` with the device user's $HOME: rsync and links need absolute paths."""
    if root == "~" or root.startswith("~/"):
        root = home.rstrip("/") + root[1:]
    if not root.startswith("/"):
        raise ValueError(f"install_root must be absolute or start with ~/, got {root!r}")
    return root.rstrip("/") or "/"
