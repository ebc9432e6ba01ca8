"""How a connection's requests are read beyond uvicorn's defaults, in the HTTP protocol itself.

An `Upgrade` is ignored, as RFC 9110 (7.8) lets a server that stays on HTTP/1.1 do: edgeserve
serves no other protocol, and httptools (llhttp) takes `Connection: upgrade` with an `Upgrade`
header for the end of HTTP on the connection, so the request's body and whatever follows it
were the new protocol's, dropped: `curl --http2 -d @request.json` (which proposes h2c) reached
the app with an empty body. The `upgrade` option of a request's Connection header is struck out
before the parser reads it, so the request is plain HTTP/1.1 to either parser, and uvicorn
hands nothing to a WebSocket library; a WebSocket handshake reaches the app as an HTTP request
with its `Upgrade: websocket` header, answered there (app.py).
"""

from __future__ import annotations

import logging
import re

logger = logging.getLogger("edgeserve.http")

_CONNECTION_UPGRADE = re.compile(rb"(?im)^(connection[ \t]*:[^\r\n]*?)\bupgrade\b")


def without_upgrade(data: bytes) -> bytes:
    """`data`, the start of a request (its headers, perhaps more), with the `upgrade` option of
    its Connection header struck out; the same object when it has none (nearly every request:
    one search of the headers' bytes in lower case)."""
    end = data.find(b"\r\n\r\n")
    head = data if end < 0 else data[:end]
    if b"upgrade" not in head.lower():
        return data
    return _CONNECTION_UPGRADE.sub(rb"\1", head) + data[len(head) :]


class IgnoredUpgrade:
    """Mixed into a uvicorn protocol class: an Upgrade whose headers came split over several
    reads (not struck out) is still ignored by uvicorn, which logged it as a warning, with
    advice to install a WebSocket library; the app answers it (app.py)."""

    def _unsupported_upgrade_warning(self) -> None:
        logger.debug("an Upgrade request served as HTTP/1.1")
