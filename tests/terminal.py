"""Run a command as a user at a terminal does: on a pseudo-terminal, output as they see it."""

from __future__ import annotations

import contextlib
import os
import pty
import re
import subprocess
from collections.abc import Sequence


def in_terminal(command: Sequence[str], timeout_s: float = 120) -> tuple[int, str]:
    """Run `command` with stdout and stderr on a pty; its exit code and everything it wrote."""
    env = {**os.environ, "COLUMNS": "120", "TERM": "xterm"}
    main_fd, child_fd = pty.openpty()
    process = subprocess.Popen(command, stdout=child_fd, stderr=child_fd, env=env)
    os.close(child_fd)
    chunks = []
    with contextlib.suppress(OSError):  # EIO once the child has exited and closed the pty
        while chunk := os.read(main_fd, 4096):
            chunks.append(chunk)
    os.close(main_fd)
    return process.wait(timeout=timeout_s), b"".join(chunks).decode("utf-8", "replace")


def plain(text: str) -> str:
    """`text` without its colour and cursor escape codes: the words a user reads."""
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text)
