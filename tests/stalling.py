"""A TCP server on 127.0.0.1 that accepts and then stalls: says nothing, or one greeting line."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def stalling_server(greeting: bytes = b"") -> Iterator[int]:
    """Accept every connection, send `greeting`, never answer again; yields the port."""
    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                connection, _ = listener.accept()
            except OSError:  # closed: the test is over
                return
            connection.sendall(greeting)
            held.append(connection)

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield listener.getsockname()[1]
    finally:
        listener.close()
        for connection in held:
            connection.close()
