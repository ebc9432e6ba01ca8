"""Control messages between a front and the inference process: pickled tuples, length-prefixed,
over one unix stream socket per front (the measured choice: benchmarks/channels.py).

    front -> inference    hello {front, arena_bytes} with the arena's fd (SCM_RIGHTS)
    inference -> front    (HELLO, backend name, shape profile)
    front -> inference    (SUBMIT, id, placed inputs, block, deadline, arrived)
                          (WAIT, id, deadline)    the board shows a full queue: wait in line
                          (CANCEL, id)            the client hung up: drop its items if queued
    inference -> front    (DONE, id, placed outputs | None | error)   one per SUBMIT or WAIT

`block` is the request's (offset, size) in the front's arena; `deadline` and `arrived` are
time.monotonic() instants, which every process of the machine shares. Errors travel pickled
(an EdgeserveError keeps its class, message and retry_after_s). Pickle is safe here: the
socket lives in the supervisor's private directory (mode 0700), so only the server's own
processes can connect to it.
"""

from __future__ import annotations

import asyncio
import pickle
import socket
import struct
from typing import Any

HELLO, SUBMIT, WAIT, CANCEL, DONE = 0, 1, 2, 3, 4
HELLO_BYTES = 4096
_LENGTH = struct.Struct("<I")


def send(writer: asyncio.StreamWriter, message: tuple[Any, ...]) -> None:
    """Queue one message on the stream (no await: the kernel's socket buffer absorbs it)."""
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    writer.write(_LENGTH.pack(len(data)) + data)


async def receive(reader: asyncio.StreamReader) -> tuple[Any, ...]:
    """The next message; IncompleteReadError when the other side has gone."""
    (length,) = _LENGTH.unpack(await reader.readexactly(_LENGTH.size))
    message: tuple[Any, ...] = pickle.loads(await reader.readexactly(length))  # noqa: S301
    return message


def send_hello(sock: socket.socket, hello: dict[str, Any], fds: list[int]) -> None:
    """The first message of a connection, on a blocking socket, carrying file descriptors."""
    socket.send_fds(sock, [pickle.dumps(hello)], fds)


def receive_hello(sock: socket.socket, max_fds: int = 1) -> tuple[dict[str, Any], list[int]]:
    data, fds, _, _ = socket.recv_fds(sock, HELLO_BYTES, max_fds)
    if not data:
        raise ConnectionError("closed before its hello")
    hello: dict[str, Any] = pickle.loads(data)  # noqa: S301
    return hello, fds
