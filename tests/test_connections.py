"""Connections against a real `edgeserve serve` (uvicorn, httptools) on 127.0.0.1, over raw
sockets. Slow clients: a connection that sends nothing is closed, half a request's headers or
half its body gets a JSON 408, each within its configured bound. Bytes that are not HTTP get a
JSON 400, endless headers a 431. Other clients are served meanwhile. A client that half-closes
is answered; an Upgrade is ignored, a WebSocket handshake refused."""

from __future__ import annotations

import functools
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from edgeserve.builder import build
from edgeserve.http import create_app
from edgeserve.http.timeouts import Timeouts, protocol_class
from edgeserve.runtime import Runtime
from tests import rawhttp
from tests.models import mlp_model, slow_model, write_function
from tests.server import running
from tests.threaded_server import serving

MANIFEST = """
[function]
name = "mlp"
[batching]
max_batch_size = 8
max_queue_delay_ms = 1
[backend]
prefer = ["onnxruntime"]
[resources]
header_timeout_s = 30
idle_timeout_s = 1
"""
HEADER_S, BODY_S = 1.0, 1.5  # given on the command line: flags override the manifest
BODY = orjson.dumps(
    {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 16], "data": [0.5] * 16}]}
)
REQUEST = rawhttp.head("/v2/models/mlp/infer", len(BODY)).replace(b"close", b"keep-alive")


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    source = write_function(tmp_path_factory.mktemp("slow") / "mlp", mlp_model, MANIFEST)
    flags = ("--header-timeout", str(HEADER_S), "--body-timeout", str(BODY_S))
    with running(source, *flags) as (base, _):
        yield base


def read_until_closed(sock: socket.socket) -> tuple[bytes, float]:
    """Everything the server sends until it closes, and how long that took."""
    started = time.monotonic()
    return rawhttp.read_all(sock), time.monotonic() - started


def json_error(response: bytes) -> tuple[int, str]:
    status, headers, body = rawhttp.parse(response)
    assert headers["connection"] == "close"
    return status, orjson.loads(body)["error"]


def assert_timed_out(received: bytes, part: str, bound: float, waited: float | None) -> None:
    """`received` is the 408 for a request whose `part` ("headers", "body") did not arrive
    within `bound` s, answered at that bound when `waited` (s since the bound began) is given."""
    status, error = json_error(received)
    assert status == 408
    assert error.startswith(f"the request's {part} did not arrive within {bound:g} s")
    if waited is not None:
        assert bound - 0.2 < waited < bound + 1.0


def assert_served(url: str) -> None:
    response = httpx.post(f"{url}/v2/models/mlp/infer", content=BODY, timeout=5)
    assert response.status_code == 200, response.text


def test_a_connection_that_sends_nothing_is_closed_at_the_header_bound(url: str) -> None:
    with rawhttp.connect(url) as sock:
        connected = time.monotonic()
        assert_served(url)  # the silent connection holds nothing up
        received, _ = read_until_closed(sock)
        waited = time.monotonic() - connected  # the bound counts from the connection
    assert received == b""  # no request, nothing to answer
    assert HEADER_S - 0.2 < waited < HEADER_S + 1.0


def test_half_the_headers_get_a_408_at_the_header_bound(url: str) -> None:
    with rawhttp.connect(url) as sock:
        sock.sendall(REQUEST[:40])
        assert_served(url)
        received, waited = read_until_closed(sock)
    assert_timed_out(received, "headers", HEADER_S, None)  # the bound began before the send
    assert waited < HEADER_S + 1.0


def test_half_the_body_gets_a_408_at_the_body_bound(url: str) -> None:
    with rawhttp.connect(url) as sock:
        sock.sendall(REQUEST + BODY[:20])
        started = time.monotonic()
        assert_served(url)
        received, _ = read_until_closed(sock)
        waited = time.monotonic() - started
    assert_timed_out(received, "body", BODY_S, waited)


def test_the_header_bound_starts_again_after_each_response(url: str) -> None:
    """On a kept-alive connection the next request's headers are bounded from the end of the
    previous response (the one timer of the connection is not re-made per request)."""
    with rawhttp.connect(url) as sock:
        sock.sendall(REQUEST + BODY)
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        answered = time.monotonic()
        sock.sendall(REQUEST[:40])
        received, _ = read_until_closed(sock)
        waited = time.monotonic() - answered
    assert_timed_out(received, "headers", HEADER_S, waited)


def test_a_body_bound_shorter_than_the_header_bound_holds(tmp_path: Path) -> None:
    """The connection's timer, set for the 30 s header bound, wakes for a 0.5 s body bound."""
    source = write_function(tmp_path / "mlp", mlp_model, MANIFEST)
    with running(source, "--body-timeout", "0.5") as (base, _), rawhttp.connect(base) as sock:
        sock.sendall(REQUEST + BODY[:20])
        received, waited = read_until_closed(sock)
    assert_timed_out(received, "body", 0.5, waited)


def test_a_body_sent_slowly_but_within_the_bound_is_served(url: str) -> None:
    with rawhttp.connect(url) as sock:
        sock.sendall(REQUEST)
        for start in range(0, len(BODY), len(BODY) // 3 + 1):
            time.sleep(0.3)
            sock.sendall(BODY[start : start + len(BODY) // 3 + 1])
        head = sock.recv(65536)
    assert head.startswith(b"HTTP/1.1 200"), head


def test_a_kept_alive_connection_is_closed_when_idle(url: str) -> None:
    with rawhttp.connect(url) as sock:
        sock.sendall(REQUEST + BODY)
        received, waited = read_until_closed(sock)
    assert rawhttp.parse(received)[0] == 200  # answered, then closed after idle_timeout_s = 1
    assert 0.8 < waited < 1.0 + 1.0


def test_the_manifest_gives_the_defaults(tmp_path: Path) -> None:
    """header_timeout_s = 30 in the manifest holds when no flag overrides it."""
    source = write_function(tmp_path / "mlp", mlp_model, MANIFEST)
    with running(source, "--body-timeout", "5") as (base, _), rawhttp.connect(base) as sock:
        sock.sendall(REQUEST[:40])
        sock.settimeout(HEADER_S + 1.0)
        with pytest.raises(TimeoutError):
            sock.recv(1)  # still waiting well past the flag's 1 s of the other server


CHUNKED = REQUEST.replace(b"content-length:", b"transfer-encoding: chunked\r\nx-was:")
NOT_HTTP = "not a valid HTTP/1.1 request"
LINE_END = REQUEST.index(b"\r\n") + 2
WHOLE_BUT_LARGE = (
    REQUEST[:LINE_END] + b"x-pad: " + b"a" * 100_000 + b"\r\n" + REQUEST[LINE_END:] + BODY
)
"""A valid request whose headers pass the cap, sent whole: a single read may hold them all."""


@pytest.mark.parametrize(
    ("what", "sent", "status", "words"),
    [
        ("not HTTP", b"\x00\x01\x02 hello\r\n\r\n", 400, f"{NOT_HTTP}: Invalid method"),
        (
            "bad length",
            REQUEST.replace(b"content-length: ", b"content-length: x"),
            400,
            f"{NOT_HTTP}: Invalid character in Content-Length",
        ),
        ("bad chunk", CHUNKED + b"zz\r\n", 400, f"{NOT_HTTP}: Invalid character in chunk size"),
        (
            "two lengths",
            REQUEST.replace(b"content-length: ", b"content-length: 3\r\ncontent-length: "),
            400,
            f"{NOT_HTTP}: Duplicate Content-Length",
        ),
        (
            "a length and chunks",
            CHUNKED.replace(b"x-was", b"content-length") + b"3\r\nabc\r\n0\r\n\r\n",
            400,
            f"{NOT_HTTP}: Content-Length can't be present with Transfer-Encoding",
        ),
        (
            "HTTP/1.2",
            REQUEST.replace(b"HTTP/1.1", b"HTTP/1.2"),
            400,
            f"{NOT_HTTP}: Invalid HTTP ver",
        ),
        (  # llhttp: "Pause on PRI/Upgrade"
            "an HTTP/2 preface",
            b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
            400,
            f"{NOT_HTTP}: an HTTP/2 preface: HTTP/1.1 here (gRPC: serve --grpc-port)",
        ),
        (  # llhttp: "User callback error"
            "CONNECT",
            b"CONNECT 127.0.0.1:80 HTTP/1.1\r\nhost: t\r\n\r\n",
            400,
            f"{NOT_HTTP}: invalid url b'127.0.0.1:80'",
        ),
        ("header flood", REQUEST[:40] + b"x-pad: " + b"a" * 80_000, 431, "request headers: over"),
        ("whole headers over the cap", WHOLE_BUT_LARGE, 431, "request headers: over 65536"),
    ],
)
def test_bytes_that_are_not_a_request_get_a_json_4xx(
    url: str, what: str, sent: bytes, status: int, words: str
) -> None:
    """With what the parser found wrong (it was "Invalid HTTP request received." for all)."""
    with rawhttp.connect(url) as sock:
        sock.sendall(sent)
        received, waited = read_until_closed(sock)
    got, error = json_error(received)
    assert (got, waited < HEADER_S) == (status, True), what
    assert error.startswith(words), what
    assert_served(url)


@pytest.mark.parametrize("http", ["h11", "httptools"])
def test_both_of_uvicorn_s_http_implementations_keep_the_bounds(tmp_path: Path, http: str) -> None:
    """uvicorn speaks h11 where httptools is not installed: the bounds hold with either."""
    source = write_function(tmp_path / "mlp", mlp_model, MANIFEST)
    timeouts = Timeouts(header_s=0.5, body_s=0.5, idle_s=1, drain_s=1)
    app = create_app(Runtime.load(build(source, tmp_path / "bundle")), timeouts=timeouts)
    cases = [(REQUEST[:40], 408), (REQUEST + BODY[:20], 408), (b"\x00\x01 hi\r\n\r\n", 400)]
    with serving(app, http=protocol_class(timeouts, http)) as url:
        for sent, status in cases:
            with rawhttp.connect(url) as sock:
                sock.sendall(sent)
                received, waited = read_until_closed(sock)
            assert (json_error(received)[0], waited < 1.5) == (status, True), (http, sent[:20])
        assert_served(url)


@pytest.mark.parametrize("http", ["h11", "httptools"])
def test_a_body_refused_before_it_is_read_is_read_on_and_the_answer_reaches_the_client(
    tmp_path: Path, http: str
) -> None:
    """A client that sends its whole body before it reads (tritonclient's HTTP client) reads
    the 413 of a body over the limit, and its connection serves the next request: the rest of
    the body was read as headers, a 431 closed the connection, and the client, still sending,
    got a reset. A keep-alive request waiting for `100 Continue` is answered and closed."""
    limited = MANIFEST.replace("[resources]", "[resources]\nmax_body_mb = 1")
    source = write_function(tmp_path / "mlp", mlp_model, limited)
    timeouts = Timeouts(header_s=5, body_s=5, idle_s=5, drain_s=1)
    app = create_app(Runtime.load(build(source, tmp_path / "bundle")), timeouts=timeouts)
    over = 3 << 20
    with serving(app, http=protocol_class(timeouts, http)) as url:
        with rawhttp.connect(url) as sock:
            sock.sendall(REQUEST.replace(str(len(BODY)).encode(), str(over).encode()))
            sock.sendall(b" " * over)  # a reset here was the bug
            status, headers, body = _one_answer(sock)
            assert status == 413
            assert "over the limit of 1048576 bytes (Content-Length is 3145728)" in str(body)
            assert headers.get("connection") != "close"
            sock.sendall(REQUEST + BODY)  # the same connection
            assert _one_answer(sock)[0] == 200
        head = REQUEST.replace(str(len(BODY)).encode(), str(over).encode())
        with rawhttp.connect(url) as sock:
            sock.sendall(head.replace(b"\r\n\r\n", b"\r\nexpect: 100-continue\r\n\r\n"))
            received, waited = read_until_closed(sock)
        assert (rawhttp.parse(received)[0], waited < 1) == (413, True)


def _one_answer(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """One response read off a kept-alive connection (by its Content-Length)."""
    received = b""
    while b"\r\n\r\n" not in received:
        received += sock.recv(65536)
    status, headers, body = rawhttp.parse(received)
    while len(body) < int(headers["content-length"]):
        body += sock.recv(65536)
    return status, headers, body


def test_a_client_that_leaves_with_pipelined_requests_unanswered_leaves_no_error(
    tmp_path: Path,
) -> None:
    """Three requests pipelined, the connection closed once the first answer began: the
    answers nobody waits for any more are dropped quietly (they were logged as an "Exception in
    ASGI application", a write on a closed transport), and the server serves on."""
    source = write_function(tmp_path / "mlp", mlp_model, MANIFEST)
    ready = b"GET /v2/health/ready HTTP/1.1\r\nhost: t\r\n\r\n"
    with running(source) as (url, server):
        for _ in range(5):
            with rawhttp.connect(url) as sock:
                sock.sendall(ready + REQUEST + BODY + ready)
                assert sock.recv(12).startswith(b"HTTP/1.1 200")
        assert_served(url)
    assert not [line for line in server.output if "Exception in ASGI" in line or "ERROR" in line]


def test_pipelined_requests_are_answered_in_order_a_bad_one_alone(url: str) -> None:
    """HTTP/1.1 pipelining: three requests sent at once on one connection, the middle one not
    JSON; each gets its own answer, in order, and the bad one spoils neither neighbour."""
    bad = b"xyz"
    middle = rawhttp.head("/v2/models/mlp/infer", len(bad)).replace(b"close", b"keep-alive")
    last = rawhttp.head("/v2/models/mlp/infer", len(BODY))  # connection: close
    with rawhttp.connect(url) as sock:
        sock.sendall(REQUEST + BODY + middle + bad + last + BODY)
        received, _ = read_until_closed(sock)
    answers = rawhttp.split(received)
    assert [status for status, _, _ in answers] == [200, 400, 200]
    assert orjson.loads(answers[1][2])["error"].startswith("request body: not valid JSON")
    assert orjson.loads(answers[2][2])["outputs"][0]["name"] == "y"


def proposing(upgrade: str, connection: str = "Upgrade, HTTP2-Settings") -> bytes:
    """REQUEST with BODY, proposing a protocol switch as `curl --http2 -d` does (h2c)."""
    head = REQUEST.replace(b"keep-alive", f"{connection}\r\nupgrade: {upgrade}".encode())
    return head.replace(b"host: t\r\n", b"host: t\r\nhttp2-settings: AAMAAABkAAQCAAAAAAIAAAAA\r\n")


@pytest.mark.parametrize(
    ("upgrade", "connection"),
    [("h2c", "Upgrade, HTTP2-Settings"), ("TLS/1.2", "upgrade"), ("foo", "keep-alive, UPGRADE")],
)
def test_a_request_proposing_an_upgrade_is_served_with_its_body(
    url: str, upgrade: str, connection: str
) -> None:
    """`curl --http2 -d @request.json http://...` proposes h2c: httptools took the body for the
    new protocol's and the app answered 'request body: not valid JSON: Input is a zero-length,
    empty document'. The upgrade is ignored (RFC 9110 7.8), the request served as HTTP/1.1."""
    with rawhttp.connect(url) as sock:
        sock.sendall(proposing(upgrade, connection) + BODY)
        received, _ = read_until_closed(sock)
    status, _, body = rawhttp.parse(received)
    assert status == 200, body
    assert orjson.loads(body)["outputs"][0]["name"] == "y"


WEBSOCKET_REFUSED = (
    "/v2/models/mlp/infer: WebSocket is not served: this function speaks HTTP/1.1 (KServe v2 as "
    "Triton does: POST /v2/models/mlp/infer, GET /v2/models/mlp, /v2/health/ready; POST /invoke; "
    "GET /metrics, /docs). Hint: send a plain HTTP request, without `Upgrade: websocket`"
)


def refused_handshake(url: str) -> tuple[int, str]:
    """A WebSocket client's handshake, refused: the status and the JSON error."""
    ws_url = url.replace("http://", "ws://") + "/v2/models/mlp/infer"
    with pytest.raises(InvalidStatus) as refused, connect(ws_url, open_timeout=10):
        pass
    response = refused.value.response
    return response.status_code, orjson.loads(response.body)["error"]


def test_a_websocket_handshake_gets_a_json_400_naming_what_is_served(url: str) -> None:
    """It got uvicorn's bare 403 with no body (and one without a Sec-WebSocket-Key the
    websockets library's plain-text 400); edgeserve serves no WebSocket."""
    assert refused_handshake(url) == (400, WEBSOCKET_REFUSED)
    handshake = b"GET /v2/models/mlp/infer HTTP/1.1\r\nhost: t\r\nconnection: Upgrade\r\n"
    for sent in (handshake + b"upgrade: websocket\r\n\r\n", handshake[:30]):
        with rawhttp.connect(url) as sock:
            sock.sendall(sent)
            if len(sent) == 30:  # the rest of the headers in a later read
                time.sleep(0.2)
                sock.sendall(handshake[30:] + b"upgrade: WebSocket\r\n\r\n")
            assert json_error(read_until_closed(sock)[0]) == (400, WEBSOCKET_REFUSED)
    assert_served(url)


def test_an_app_under_a_server_that_upgrades_refuses_the_websocket_alike(tmp_path: Path) -> None:
    """create_app under a plain uvicorn, whose websockets library hands the app a WebSocket:
    the same JSON 400, as ASGI's denial response (it was a bare 403)."""
    source = write_function(tmp_path / "mlp", mlp_model, MANIFEST)
    with serving(create_app(Runtime.load(build(source, tmp_path / "bundle")))) as url:
        assert refused_handshake(url) == (400, WEBSOCKET_REFUSED)
        assert_served(url)


@pytest.mark.parametrize("http", ["h11", "httptools"])
def test_both_of_uvicorn_s_http_implementations_ignore_an_upgrade(
    tmp_path: Path, http: str
) -> None:
    source = write_function(tmp_path / "mlp", mlp_model, MANIFEST)
    app = create_app(Runtime.load(build(source, tmp_path / "bundle")))
    protocol = protocol_class(app.timeouts, http)
    with serving(app, http=protocol, ws="none", timeout_keep_alive=1) as url:
        with rawhttp.connect(url) as sock:
            sock.sendall(proposing("h2c") + BODY)
            assert rawhttp.parse(read_until_closed(sock)[0])[0] == 200, http
        assert refused_handshake(url) == (400, WEBSOCKET_REFUSED)


SLOW = """
[function]
name = "slow"
[batching]
max_batch_size = 8
max_queue_delay_ms = 1
[backend]
prefer = ["onnxruntime"]
"""
SLOW_BODY = orjson.dumps(
    {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 1, 1024], "data": [0.5] * 1024}]}
)
SLOW_REQUEST = rawhttp.head("/v2/models/slow/infer", len(SLOW_BODY)).replace(
    b"close", b"keep-alive"
)


@pytest.fixture(scope="module")
def slow_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A function whose every batch computes for 0.4-1 s (tests.models.slow_model)."""
    model = functools.partial(slow_model, depth=160)
    source = write_function(tmp_path_factory.mktemp("queue") / "slow", model, SLOW)
    with running(source) as (base, _):
        yield base


def runs(url: str) -> int:
    stats = httpx.get(f"{url}/v2/models/slow/stats", timeout=5).json()["model_stats"][0]
    return int(stats["inference_count"])


@pytest.mark.parametrize("version", ["1.1", "1.0"])
def test_a_client_that_half_closes_after_its_request_gets_the_answer(
    slow_url: str, version: str
) -> None:
    """`shutdown(SHUT_WR)` once the request is sent (ncat at the end of its input): uvicorn took
    the FIN for a disconnect, and the client read nothing. An HTTP/1.1 client that waits is
    sent a 100 Continue first (the probe for a client that left); none goes to HTTP/1.0."""
    with rawhttp.connect(slow_url) as sock:
        sock.sendall(SLOW_REQUEST.replace(b"HTTP/1.1", f"HTTP/{version}".encode()) + SLOW_BODY)
        sock.shutdown(socket.SHUT_WR)
        received, _ = read_until_closed(sock)  # closed once answered
    interim = b"HTTP/1.1 100 Continue\r\n\r\n" if version == "1.1" else b""
    assert received.startswith(interim + b"HTTP/1.1 200 OK"), received[:80]
    status, _, body = rawhttp.parse(received.removeprefix(interim))
    assert (status, orjson.loads(body)["outputs"][0]["name"]) == (200, "y")


def test_half_closed_pipelined_requests_are_all_answered_then_closed(slow_url: str) -> None:
    ready = b"GET /v2/health/ready HTTP/1.1\r\nhost: t\r\n\r\n"
    with rawhttp.connect(slow_url) as sock:
        sock.sendall(SLOW_REQUEST + SLOW_BODY + SLOW_REQUEST + SLOW_BODY + ready)
        sock.shutdown(socket.SHUT_WR)
        received, _ = read_until_closed(sock)
    answers = rawhttp.split(received.replace(b"HTTP/1.1 100 Continue\r\n\r\n", b""))
    assert [status for status, _, _ in answers] == [200, 200, 200]


def test_a_client_that_closes_while_queued_still_has_its_items_dropped(slow_url: str) -> None:
    """A full close is a FIN too: the probe's reset tells it from a half-close. The second
    request waits behind the first one's batch, and its client leaves meanwhile."""
    time.sleep(0.3)  # the statistics of earlier tests' batches are counted
    before = runs(slow_url)
    with rawhttp.connect(slow_url) as first:
        sent = time.monotonic()
        first.sendall(SLOW_REQUEST + SLOW_BODY)
        time.sleep(0.1)  # the first batch runs, 0.4 s or more
        with rawhttp.connect(slow_url) as second:
            second.sendall(SLOW_REQUEST + SLOW_BODY)
            time.sleep(0.05)  # queued behind it
        assert first.recv(65536).startswith(b"HTTP/1.1 200")
        batch_s = time.monotonic() - sent
    time.sleep(1.5 * batch_s)  # had the second one stayed queued, it ran by now
    assert runs(slow_url) == before + 1


@pytest.mark.parametrize(
    ("sent", "words"),
    [
        (REQUEST[:40], "the request's headers end before their blank line: the client closed"),
        (REQUEST + BODY[:20], "the request's body ends before its length (Content-Length or"),
    ],
    ids=["headers", "body"],
)
def test_a_request_cut_short_by_a_half_close_gets_a_400_at_once(
    url: str, sent: bytes, words: str
) -> None:
    """Nothing more can come: a 400 saying so, not a silent close (headers) or a wait for the
    body bound (408)."""
    with rawhttp.connect(url) as sock:
        sock.sendall(sent)
        sock.shutdown(socket.SHUT_WR)
        received, waited = read_until_closed(sock)
    status, error = json_error(received)
    assert (status, waited < 0.5) == (400, True)
    assert error.startswith(words), error


@pytest.mark.parametrize(
    ("path", "words"),
    [
        ("/v2/models/nope/infer", "Request for unknown model: 'nope' is not found; this server"),
        ("/v2/models/mlp/versions/9/infer", "Request for unknown model: 'mlp' version 9 is not"),
    ],
)
def test_an_infer_to_a_wrong_model_is_refused_before_its_body_is_asked_for(
    url: str, path: str, words: str
) -> None:
    """It was told `100 Continue`, then refused once its body had come (the whole upload, as
    curl sends a large one), or, sending none, held until the body bound."""
    head = rawhttp.head(path, 50 << 20).replace(b"\r\n\r\n", b"\r\nexpect: 100-continue\r\n\r\n")
    with rawhttp.connect(url) as sock:
        sock.sendall(head)
        received, waited = read_until_closed(sock)
    status, _, body = rawhttp.parse(received)
    assert (status, waited < BODY_S) == (404 if "version" in words else 400, True)
    assert orjson.loads(body)["error"].startswith(words)
