"""CORS on the answers the protocol layer writes itself (http/timeouts.py): a slow client's 408,
headers over the cap (431), bytes that are not HTTP (400), a request cut by a FIN (400). Each
carries the CORS headers when the request's Origin arrived whole and is allowed, so a page reads
the error rather than an opaque CORS failure; none when the Origin never arrived or is not
allowed. Raw sockets against a real server."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from edgeserve.builder import build
from edgeserve.http import create_app
from edgeserve.http.timeouts import Timeouts, protocol_class
from edgeserve.runtime import Runtime
from tests import rawhttp
from tests.models import mlp_model, write_function
from tests.server import running
from tests.threaded_server import serving

PAGE = "http://page.test:8000"
MANIFEST = f"""
[function]
name = "mlp"
[backend]
prefer = ["onnxruntime"]
[cors]
origins = ["{PAGE}"]
"""
BODY = orjson.dumps(
    {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 16], "data": [0.5] * 16}]}
)
PLAIN = rawhttp.head("/v2/models/mlp/infer", len(BODY))
FROM_PAGE = PLAIN.replace(b"host: t\r\n", f"host: t\r\norigin: {PAGE}\r\n".encode())
FROM_OTHER = PLAIN.replace(b"host: t\r\n", b"host: t\r\norigin: http://elsewhere.test\r\n")
ORIGIN_END = FROM_PAGE.index(PAGE.encode()) + len(PAGE) + 2  # the Origin line, whole
PAD = b"x-pad: " + b"a" * 80_000


def malformed(request: bytes) -> bytes:
    """`request` with a line no HTTP parser takes, after its Origin line."""
    return request.replace(b"connection:", b"no colon here\r\nconnection:")


ALLOWED = {
    "access-control-allow-origin": PAGE,
    "access-control-expose-headers": "Inference-Header-Content-Length, Retry-After, "
    "WWW-Authenticate",
    "vary": "Origin",
}


@pytest.fixture(scope="module", params=["1", "2"], ids=["one process", "front processes"])
def url(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[str]:
    source = write_function(tmp_path_factory.mktemp("cors") / "mlp", mlp_model, MANIFEST)
    bounds = ("--header-timeout", "0.5", "--body-timeout", "0.5")
    with running(source, *bounds, "--workers", request.param) as (base, _):
        yield base


def answer(url: str, sent: bytes, half_close: bool = False) -> tuple[int, dict[str, str]]:
    """The status and CORS headers (with Vary) of the server's answer to `sent`."""
    with rawhttp.connect(url) as sock:
        sock.sendall(sent)
        if half_close:
            sock.shutdown(socket.SHUT_WR)
        status, headers, body = rawhttp.parse(rawhttp.read_all(sock))
    assert "error" in orjson.loads(body)
    cors = {k: v for k, v in headers.items() if k.startswith("access-control-") or k == "vary"}
    return status, cors


ALLOWED_CASES = [
    ("half the body", FROM_PAGE + BODY[:20], False, 408),
    ("headers stopped after the Origin line", FROM_PAGE[: ORIGIN_END + 5], False, 408),
    ("headers over the cap after the Origin line", FROM_PAGE[:ORIGIN_END] + PAD, False, 431),
    ("a header line without a colon", malformed(FROM_PAGE), False, 400),
    ("a FIN within the body", FROM_PAGE + BODY[:20], True, 400),
    ("a FIN within the headers", FROM_PAGE[: ORIGIN_END + 5], True, 400),
]
UNKNOWN_CASES = [
    ("the Origin line cut short", FROM_PAGE[: ORIGIN_END - 4], 408),
    ("the request line unfinished", FROM_PAGE[:20], 408),
    ("another origin's half body", FROM_OTHER + BODY[:20], 408),
    ("another origin's malformed header", malformed(FROM_OTHER), 400),
    ("no Origin at all", PLAIN + BODY[:20], 408),
]


@pytest.mark.parametrize(
    ("what", "sent", "half_close", "status"), ALLOWED_CASES, ids=[c[0] for c in ALLOWED_CASES]
)
def test_an_allowed_origin_reads_the_protocol_s_errors(
    url: str, what: str, sent: bytes, half_close: bool, status: int
) -> None:
    assert answer(url, sent, half_close) == (status, ALLOWED), what


@pytest.mark.parametrize(
    ("what", "sent", "status"), UNKNOWN_CASES, ids=[c[0] for c in UNKNOWN_CASES]
)
def test_an_origin_unknown_or_not_allowed_gets_no_cors_header(
    url: str, what: str, sent: bytes, status: int
) -> None:
    assert answer(url, sent) == (status, {}), what


def test_h11_answers_carry_them_too(tmp_path: Path) -> None:
    """uvicorn speaks h11 where httptools is not installed: its answers carry them alike."""
    source = write_function(tmp_path / "mlp", mlp_model, MANIFEST)
    timeouts = Timeouts(header_s=0.5, body_s=0.5, idle_s=1, drain_s=1)
    app = create_app(Runtime.load(build(source, tmp_path / "bundle")), timeouts=timeouts)
    with serving(app, http=protocol_class(timeouts, "h11", app.cors)) as base:
        for what, sent, half_close, status in ALLOWED_CASES:
            assert answer(base, sent, half_close) == (status, ALLOWED), what
        assert answer(base, FROM_PAGE[:20]) == (408, {})


def test_a_preflight_refused_shows_its_utf8_origin_as_sent(url: str) -> None:
    """The Origin header is read as latin-1, which showed `päge` as `pÃ¤ge` in the 403."""
    asked = "OPTIONS /invoke HTTP/1.1\r\nhost: t\r\norigin: http://päge.test\r\n"
    asked += "access-control-request-method: POST\r\nconnection: close\r\n\r\n"
    with rawhttp.connect(url) as sock:
        sock.sendall(asked.encode())
        status, _, body = rawhttp.parse(rawhttp.read_all(sock))
    assert status == 403
    assert orjson.loads(body)["error"].startswith(
        "CORS: origin 'http://päge.test' may not call this function from a browser"
    )
