"""The board's admission lock, between real processes: exclusive while held, and never waited
on past its bound (an event loop must not hang on a holder stopped while holding it)."""

from __future__ import annotations

import subprocess
import sys
import time

from edgeserve.workers.board import LOCK_WAIT_S, Board

HOLD = """
import fcntl, sys, time
fd = int(sys.argv[1])
fcntl.lockf(fd, fcntl.LOCK_EX, 1)
print("held", flush=True)
time.sleep(60)
"""
TRY = """
import fcntl, sys
try:
    fcntl.lockf(int(sys.argv[1]), fcntl.LOCK_EX | fcntl.LOCK_NB, 1)
    print("taken")
except OSError:
    print("busy")
"""


def _run(script: str, board: Board) -> subprocess.Popen[str]:
    command = [sys.executable, "-c", script, str(board.fd)]
    return subprocess.Popen(command, pass_fds=[board.fd], stdout=subprocess.PIPE, text=True)


def test_the_admission_lock_is_exclusive_and_a_stuck_holder_costs_its_bound_only() -> None:
    board = Board.create(fronts=2, instances=1, max_batch_size=4)
    with board.admitting():  # held here: another process cannot take it
        assert _run(TRY, board).communicate(timeout=30)[0].strip() == "busy"
    assert _run(TRY, board).communicate(timeout=30)[0].strip() == "taken"  # given back
    holder = _run(HOLD, board)  # a process that holds it and never lets go
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        started = time.monotonic()
        with board.admitting():
            waited = time.monotonic() - started
        assert LOCK_WAIT_S <= waited < 1.0, waited  # the bound, not the holder's 60 s
    finally:
        holder.kill()
        holder.wait(timeout=10)
    assert _run(TRY, board).communicate(timeout=30)[0].strip() == "taken"  # died with its holder
