"""Install binary wheels for another machine's Python into a folder (pip's `--platform`).

Both the Lambda zip and the OCI image are made this way: pip resolves wheels for the target's
Python version and manylinux tags, whatever the build machine runs, and nothing compiles.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from edgeserve.errors import DeployError


def install_wheels(
    requirements: Sequence[str],
    into: Path,
    *,
    platforms: Sequence[str],
    python_version: str,
    find_links: str | None = None,
    hint: str,
) -> None:
    """pip install `requirements` as binary wheels for `platforms` and `python_version`;
    with `find_links`, from that folder only (no index). Failure: DeployError + `hint`."""
    if not requirements:
        return
    source = ["--no-index", "--find-links", find_links] if find_links else []
    command = [
        sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
        "--no-compile", "--target", str(into),
        *(option for tag in platforms for option in ("--platform", tag)),
        "--implementation", "cp", "--python-version", python_version,
        "--only-binary=:all:", *source, *requirements,
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        errors = [line for line in done.stderr.splitlines() if line.startswith("ERROR")]
        raise DeployError(
            f"pip could not get {list(requirements)} as {platforms[-1]} to {platforms[0]} "
            f"wheels for Python {python_version}: {' '.join(errors) or done.stderr[-800:]}\n"
            f"Hint: {hint}"
        )
