"""How a KServe v2 body with binary data is framed (Triton's binary tensor extension): its
first Inference-Header-Content-Length bytes are the JSON header, the tensors' raw bytes follow
(their layout: dataplane/raw.py). A wrong header length is named where it goes wrong."""

from __future__ import annotations

from typing import Any

from edgeserve import values
from edgeserve.errors import InvalidInput, echo_header


def json_length(body: bytes, header_length: str | None) -> int:
    """How many of the body's bytes are JSON: all, unless `header_length` says fewer."""
    if header_length is None:
        return len(body)
    digits = header_length.strip()  # a count is digits only: int() also reads "+5" and "1_0"
    length = int(digits) if digits.isascii() and digits.isdigit() else -1
    if length == 0:
        raise InvalidInput(
            "Inference-Header-Content-Length: 0 (a raw binary request) is not supported; "
            "send a JSON header naming the input"
        )
    if not 0 < length <= len(body):
        raise InvalidInput(
            f"Inference-Header-Content-Length: expected a byte count in 1..{len(body)} "
            f"(the body's length), got {echo_header(header_length)}"
        )
    return length


def read_json(data: bytes, where: str) -> Any:
    """The request's JSON: the whole body, or the JSON header before binary data (`where`
    JSON_HEADER), which a wrong Inference-Header-Content-Length cuts short or runs on past."""
    if where != JSON_HEADER:
        return values.from_json(data, where)
    try:
        return values.from_json(data, where)
    except InvalidInput as exc:
        raise InvalidInput(
            f"{exc.message}. Hint: Inference-Header-Content-Length ({len(data)} bytes here) "
            "is the length of the JSON header alone; the inputs' binary data follows it"
        ) from None


JSON_HEADER = "request JSON header (the body's first Inference-Header-Content-Length bytes)"
