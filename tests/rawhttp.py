"""HTTP/1.1 over plain sockets, for tests that need control a client library hides: a request
sent whole before anything is read, half a request, or nothing at all."""

from __future__ import annotations

import socket


def connect(url: str) -> socket.socket:
    """A TCP connection to `http://HOST:PORT`."""
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=30)


def head(path: str, length: int, content_type: str = "application/json") -> bytes:
    """A POST's request line and headers, announcing `length` body bytes; the server closes
    the connection after answering."""
    return (
        f"POST {path} HTTP/1.1\r\nhost: t\r\nconnection: close\r\ncontent-type: {content_type}"
        f"\r\ncontent-length: {length}\r\n\r\n"
    ).encode("latin-1")


def send(url: str, path: str, body: bytes) -> socket.socket:
    """A POST sent whole on its own connection, not yet answered."""
    sock = connect(url)
    sock.sendall(head(path, len(body)) + body)
    return sock


def read_all(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    received = b""
    while chunk := sock.recv(65536):
        received += chunk
    return received


def parse(response: bytes) -> tuple[int, dict[str, str], bytes]:
    """Status, headers (names in lower case) and body of one response."""
    top, _, body = response.partition(b"\r\n\r\n")
    lines = top.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(": ")
        headers[name.lower()] = value
    return int(lines[0].split()[1]), headers, body


def split(received: bytes) -> list[tuple[int, dict[str, str], bytes]]:
    """Several responses read off one connection, one after the other (by Content-Length)."""
    responses = []
    while received:
        status, headers, rest = parse(received)
        length = int(headers.get("content-length", len(rest)))
        responses.append((status, headers, rest[:length]))
        received = rest[length:]
    return responses


def answer(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """The response to what was sent on `sock`, read until the server closes; `sock` closed."""
    with sock:
        return parse(read_all(sock))
