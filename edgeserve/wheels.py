"""Install binary wheels for another machine's Python into a folder (pip's `--platform`).

Both the Lambda zip and the OCI image are made this way: pip resolves wheels for the target's
Python version and manylinux tags, whatever the build machine runs, and nothing compiles.
"""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from edgeserve.errors import DeployError

log = logging.getLogger("edgeserve.wheels")
STEPS = ("Collecting", "Downloading", "Processing", "Installing")
"""pip's lines worth a progress display (the CLI shows them live on a terminal)."""


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
    with `find_links`, from that folder only (no index). Failure: DeployError + `hint`.
    Each download is logged (INFO, `edgeserve.wheels`) as pip reaches it."""
    if not requirements:
        return
    source = ["--no-index", "--find-links", find_links] if find_links else []
    command = [
        sys.executable, "-m", "pip", "install", "--progress-bar", "off",
        "--disable-pip-version-check",
        "--no-compile", "--target", str(into),
        *(option for tag in platforms for option in ("--platform", tag)),
        "--implementation", "cp", "--python-version", python_version,
        "--only-binary=:all:", *source, *requirements,
    ]  # fmt: skip
    code, output = _run_logged(command)
    if code != 0:
        errors = [line for line in output if line.startswith("ERROR")]
        raise DeployError(
            f"pip could not get {list(requirements)} as {platforms[-1]} to {platforms[0]} "
            f"wheels for Python {python_version}: {' '.join(errors) or ''.join(output)[-800:]}\n"
            f"Hint: {hint}"
        )


def _run_logged(command: list[str]) -> tuple[int, list[str]]:
    """Run pip, logging its steps as they come; its exit code and every line it printed."""
    output = []
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    ) as process:
        assert process.stdout is not None  # stdout=PIPE above
        for line in process.stdout:
            output.append(line)
            if line.lstrip().startswith(STEPS):
                log.info("pip: %s", line.strip())
    return process.returncode, output
