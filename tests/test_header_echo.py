"""Header values an error repeats are shown as the client sent them: ASGI hands their bytes over
read as latin-1, so UTF-8 (a full-width digit typed into Inference-Header-Content-Length, an
accented coding) came back garbled. Raw bytes on a socket to a real server."""

from __future__ import annotations

from collections.abc import Iterator

import orjson
import pytest

from tests import rawhttp
from tests.models import mlp_model, write_function
from tests.server import running

BODY = orjson.dumps(
    {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 16], "data": [0.5] * 16}]}
)
FIVE = "\uff15"  # a full-width 5, as an input method types it
MANIFEST = '[function]\nname = "mlp"\n[backend]\nprefer = ["onnxruntime"]\n'


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    source = write_function(tmp_path_factory.mktemp("echo") / "mlp", mlp_model, MANIFEST)
    with running(source) as (base, _):
        yield base


def error(url: str, *headers: bytes) -> tuple[int, str]:
    """The status and error of a v2 infer request with `headers` (raw lines) added."""
    head = rawhttp.head("/v2/models/mlp/infer", len(BODY))
    sent = head[:-2] + b"".join(line + b"\r\n" for line in headers) + b"\r\n"
    with rawhttp.connect(url) as sock:
        sock.sendall(sent + BODY)
        status, _, body = rawhttp.parse(rawhttp.read_all(sock))
    return status, orjson.loads(body)["error"]


@pytest.mark.parametrize(
    ("headers", "words"),
    [
        (
            [f"inference-header-content-length: {FIVE}"],
            f"Inference-Header-Content-Length: expected a byte count in 1..{len(BODY)} (the "
            f"body's length), got '{FIVE}'",
        ),
        (["content-encoding: gzïp"], "Content-Encoding 'gzïp' is not supported"),
        (["content-encoding: GZÏP"], "Content-Encoding 'GZÏP' is not supported"),
        (
            [f"inference-header-content-length: {FIVE}"] * 2,
            f"header inference-header-content-length: given 2 times ['{FIVE}', '{FIVE}']; "
            "expected once",
        ),
    ],
)
def test_a_utf8_header_is_echoed_as_sent(url: str, headers: list[str], words: str) -> None:
    status, message = error(url, *(line.encode() for line in headers))
    assert status == 400
    assert words in message


def test_bytes_that_are_not_utf8_are_shown_replaced(url: str) -> None:
    assert error(url, b"content-encoding: gz\xffp") == (
        400,
        "Content-Encoding 'gz\ufffdp' is not supported; expected gzip, deflate or identity",
    )
