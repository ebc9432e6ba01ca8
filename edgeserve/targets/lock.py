"""One deploy at a time per device: a lock file on the device, held with flock(1) over ssh.

The lock is held by a remote `flock` whose command waits on its stdin, and that stdin is a pipe
from this process: closing it (or this process dying, or the connection dropping, which makes
sshd end the session) releases the lock, so a crashed deploy never leaves the device locked.
Who holds it is written beside it, so the one who waits is told whom it waits for.
"""

from __future__ import annotations

import getpass
import os
import select
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager

from edgeserve.errors import DeployError
from edgeserve.targets.ssh import Remote

OWNER_UNWRITABLE = 75
"""The holder's exit status when it took the lock but could not write its owner (a full disk):
flock's own 1 means the wait ran out, and was all it could say before."""
HOLD_SCRIPT = (
    'exec flock -w "$2" "$1" sh -c \'{ printf "%s\\n" "$0" > "$1.owner"; } || exit '
    f'{OWNER_UNWRITABLE}; echo locked && cat >/dev/null; rm -f "$1.owner"\' "$3" "$1"'
)
"""Take the lock $1 within $2 s, write the owner $3 beside it, say so, hold until EOF."""
OWNER_SCRIPT = 'cat "$1.owner" 2>/dev/null || echo unknown'
MARGIN_S = 30.0
"""Beyond the lock's own wait: the ssh round trips around it."""


def owner(action: str) -> str:
    """Who holds the lock, as shown to those who wait for it."""
    when = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    return (
        f"{action} by {getpass.getuser()}@{socket.gethostname()} (pid {os.getpid()}) since {when}"
    )


@contextmanager
def device_lock(remote: Remote, path: str, wait_s: float, action: str) -> Iterator[None]:
    """Hold the device's lock file `path` for the block; DeployError if not had in `wait_s`."""
    argv = remote.command_argv(["sh", "-c", HOLD_SCRIPT, "sh", path, f"{wait_s:g}", owner(action)])
    holder = subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        _await_locked(remote, holder, path, wait_s)
        yield
    finally:
        _release(holder)


def _await_locked(
    remote: Remote, holder: subprocess.Popen[bytes], path: str, wait_s: float
) -> None:
    if holder.stdout is None:  # Popen(stdout=PIPE) always sets it; for the type checker
        raise RuntimeError("flock: no pipe")
    ready, _, _ = select.select([holder.stdout], [], [], wait_s + MARGIN_S)
    if ready and holder.stdout.readline().strip() == b"locked":
        return
    stderr = _release(holder)
    if holder.returncode == OWNER_UNWRITABLE:  # sh names itself by $0, the owner: cut that off
        why = stderr.decode(errors="replace").strip().rsplit(": ", 2)[-2:]
        raise DeployError(
            f"host {remote.host}: took the lock {path} but cannot write {path}.owner beside it "
            f"({': '.join(why)}). Hint: is the device's disk full? (`df` on it)"
        )
    if holder.returncode not in (0, 1, None):
        raise remote.failure(["flock", path], holder.returncode, stderr)
    raise DeployError(
        f"host {remote.host}: another deploy holds {path} ({remote.sh(OWNER_SCRIPT, path).strip()}"
        f"), still after {wait_s:g} s; Hint: wait for it, or raise lock_timeout_s in the profile"
    )


def _release(holder: subprocess.Popen[bytes]) -> bytes:
    """End the holder (its stdin closed: it lets go); what it wrote to stderr."""
    if holder.stdin is not None and not holder.stdin.closed:
        holder.stdin.close()
    try:
        holder.wait(timeout=MARGIN_S)
    except subprocess.TimeoutExpired:
        holder.kill()
        holder.wait()
    stderr = holder.stderr.read() if holder.stderr and not holder.stderr.closed else b""
    for stream in (holder.stdout, holder.stderr):
        if stream is not None:
            stream.close()
    return stderr
