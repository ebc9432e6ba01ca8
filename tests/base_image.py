"""The base image the container tests build on, made here: no image registry is reachable.

A Debian bookworm root filesystem with python3 (`debootstrap --variant=minbase`), trimmed of
docs, locales and apt state, imported with `podman import`. The tarball is cached under
~/.cache/edgeserve-test/ (or $EDGESERVE_TEST_CACHE) so a fresh podman store re-imports it in
seconds; the first build takes about 80 s of network and CPU.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

BASE_IMAGE = "localhost/edgeserve-test/debian-python3:bookworm"
SUITE = "bookworm"
TRIM = (
    "usr/share/doc",
    "usr/share/man",
    "usr/share/info",
    "usr/share/locale",
    "var/lib/apt/lists",
    "var/cache/apt",
    "var/cache/debconf",
    "var/log",
)


def cache_dir() -> Path:
    root = os.environ.get("EDGESERVE_TEST_CACHE") or Path.home() / ".cache" / "edgeserve-test"
    return Path(root)


def ensure_base_image() -> str:
    """The base image's name; imported from the cached tarball, built first when absent."""
    if _podman("image", "exists", BASE_IMAGE).returncode == 0:
        return BASE_IMAGE
    tarball = cache_dir() / f"debian-{SUITE}-python3.tar"
    if not tarball.is_file():
        _debootstrap_tarball(tarball)
    with tarball.open("rb") as stream:
        subprocess.run(
            ["podman", "import", "-", BASE_IMAGE], stdin=stream, check=True, capture_output=True
        )
    return BASE_IMAGE


def _debootstrap_tarball(tarball: Path) -> None:
    tarball.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="rootfs-", dir=tarball.parent) as scratch:
        root = Path(scratch) / "root"
        subprocess.run(
            ["debootstrap", "--variant=minbase", "--include=python3", SUITE, str(root)],
            check=True,
            capture_output=True,
        )
        for part in TRIM:
            shutil.rmtree(root / part, ignore_errors=True)
        partial = tarball.with_suffix(".partial")
        subprocess.run(["tar", "-C", str(root), "-cf", str(partial), "."], check=True)
        partial.rename(tarball)


def _podman(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["podman", *args], capture_output=True, check=False)


if __name__ == "__main__":
    print(ensure_base_image())
