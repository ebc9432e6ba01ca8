"""gRPC calls sent frame by frame on a raw HTTP/2 connection whose answers are never read: what
no grpcio client can do (its core reads every answer into memory), and what a stuck or hostile
client does. Enough HTTP/2 (RFC 9113) for that: the preface, HEADERS as HPACK literals, DATA."""

from __future__ import annotations

import socket
import struct

HEADERS, DATA, SETTINGS = 1, 0, 4
END_STREAM, END_HEADERS = 1, 4
MAX_FRAME = 16384  # SETTINGS_MAX_FRAME_SIZE's initial value


def unread_unary_calls(
    host: str, port: int, method: str, message: bytes, count: int
) -> socket.socket:
    """Open `count` unary calls of `method` carrying `message`, on one connection, sending on
    while the server takes them (5 s without progress: stop); the socket, never read."""
    connection = socket.create_connection((host, port))
    connection.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    connection.settimeout(5)
    connection.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + _frame(SETTINGS, 0, 0, b""))
    fields = {
        ":method": "POST",
        ":scheme": "http",
        ":path": method,
        ":authority": f"{host}:{port}",
        "content-type": "application/grpc",
        "te": "trailers",
    }
    block = b"".join(_literal(name, value) for name, value in fields.items())
    body = b"\0" + struct.pack(">I", len(message)) + message  # gRPC's length-prefixed message
    chunks = [body[at : at + MAX_FRAME] for at in range(0, len(body), MAX_FRAME)]
    try:
        for stream in range(1, 2 * count, 2):  # a client's streams are odd
            data = [
                _frame(DATA, END_STREAM if at == len(chunks) - 1 else 0, stream, chunk)
                for at, chunk in enumerate(chunks)
            ]
            connection.sendall(_frame(HEADERS, END_HEADERS, stream, block) + b"".join(data))
    except TimeoutError:
        pass  # the server stopped reading: what it took is what it holds
    return connection


def _frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    return (
        struct.pack(">I", len(payload))[1:]
        + bytes([kind, flags])
        + struct.pack(">I", stream)
        + payload
    )


def _literal(name: str, value: str) -> bytes:
    """A header field as an HPACK literal, not indexed, new name, no Huffman (RFC 7541 6.2.2)."""
    encoded = name.encode(), value.encode()
    assert all(len(part) < 127 for part in encoded)  # a one-byte length
    return b"\0" + b"".join(bytes([len(part)]) + part for part in encoded)
