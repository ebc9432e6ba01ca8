"""Form uploads to `/invoke` (`curl -F file=@page.png`, a browser form): multipart/form-data.

The form stands for its one file: the handler gets that file's bytes under the file's own media
type, as if it had been sent alone. A form of one field and no file stands for that field.

The body is split on its boundary with `bytes.find`, in one pass: Python's `email` parser, which
reads line by line, took 19 s and 1 GB for 30 MB of newlines. Only the parts' headers, a few
lines each, go through `email`. A body that does not end with its closing delimiter (cut off),
a nested multipart part, several files, or a part whose Content-Transfer-Encoding does not
decode (or is not one of RFC 2045's) are refused, naming the part.
"""

from __future__ import annotations

import base64
import binascii
import email.parser
import email.policy
import json
import quopri
from email.message import Message

from edgeserve.errors import InvalidInput, echo

FORM_TYPE = "multipart/form-data"
MAX_PART_HEADER = 64 * 1024
"""Bytes of headers one part may have (a few lines in practice)."""
NAMES_SHOWN = 10
MAX_PARTS = 100
"""Parts a form may have: it carries one file, perhaps beside a few fields. Each part's headers
cost ~0.25 ms to parse: 50,000 empty fields (3 MB) held a thread, and the GIL, for 12 s."""


def form_file(body: bytes, content_type: str) -> tuple[bytes, str]:
    """The one file of a multipart/form-data `body` (its Content-Type header given) and its
    media type; InvalidInput for anything else."""
    header = _headers(f"Content-Type: {content_type}\r\n".encode("latin-1", "replace"))
    delimiter = header.get_param("boundary")
    if not isinstance(delimiter, str) or not delimiter:
        raise _refused("no boundary in its Content-Type")
    if not delimiter.isascii():  # read back from the header, its bytes are no longer as sent
        raise _refused(
            "its boundary holds bytes that are not ASCII; expected 1 to 70 ASCII characters "
            "(RFC 2046)"
        )
    parts = [
        _part(raw, n)
        for n, raw in enumerate(_split(body, b"--" + delimiter.encode("latin-1", "replace")), 1)
    ]
    files = [part for part in parts if part[0].get_filename()] or parts
    if len(files) != 1:
        names = [headers.get_param("name", header="content-disposition") for headers, _ in parts]
        shown = f"{[echo(n) if isinstance(n, str) else n for n in names[:NAMES_SHOWN]]}" + (
            f" and {len(names) - NAMES_SHOWN} more" if len(names) > NAMES_SHOWN else ""
        )
        raise _refused(
            f"{len(files)} files (fields {shown}); expected one. Hint: send the file alone as "
            "the body: curl --data-binary @FILE -H 'Content-Type: TYPE'"
        )
    headers, data = files[0]
    return data, headers.get_content_type()


def _split(body: bytes, delimiter: bytes) -> list[bytes]:
    """The parts between the delimiters (RFC 2046: each after a line break, the last one
    followed by `--`)."""
    start = 0 if body.startswith(delimiter) else body.find(b"\r\n" + delimiter)
    if start < 0:
        raise _refused("its boundary is not in the body")
    start = body.index(delimiter, start) + len(delimiter)
    parts = []
    while not body.startswith(b"--", start):
        line_end = body.find(b"\r\n", start)
        if line_end < 0 and body.find(b"\n", start) >= 0:
            raise _refused("its lines end with a bare LF; multipart needs CRLF (RFC 2046)")
        if line_end < 0:
            raise _refused("the body ends inside a boundary line (cut off?)")
        if body[start:line_end].strip(b" \t"):
            raise _refused("a boundary line holds more than the boundary")
        end = body.find(b"\r\n" + delimiter, line_end)
        if end < 0:
            raise _refused("a part has no closing boundary (a body cut off?)")
        parts.append(body[line_end + 2 : end])
        start = end + 2 + len(delimiter)
        if len(parts) > MAX_PARTS:
            raise _refused(
                f"more than {MAX_PARTS} parts; expected one file (and perhaps a few fields). "
                "Hint: send the file alone as the body: curl --data-binary @FILE -H "
                "'Content-Type: TYPE'"
            )
    if not parts:
        raise _refused("no parts")
    return parts


def _part(raw: bytes, number: int) -> tuple[Message, bytes]:
    """A part's headers and its content, its Content-Transfer-Encoding undone."""
    if raw.startswith(b"\r\n"):  # no headers at all
        head, data = b"", raw[2:]
    else:
        split = raw.find(b"\r\n\r\n", 0, MAX_PART_HEADER)
        if split < 0:
            raise _refused(f"a part's headers do not end within {MAX_PART_HEADER} bytes")
        head, data = raw[: split + 2], raw[split + 4 :]
    headers = _headers(head)
    if headers.get_content_maintype() == "multipart":
        raise _refused("a part is itself multipart; expected a file")
    encoding = str(headers.get("content-transfer-encoding", "")).strip().lower()
    return headers, _decoded(data, encoding, _named(headers, number))


_IDENTITY = frozenset({"", "7bit", "8bit", "binary"})
"""Content-Transfer-Encodings that leave the bytes as they are (RFC 2045)."""


def _decoded(data: bytes, encoding: str, part: str) -> bytes:
    """A part's bytes with its Content-Transfer-Encoding undone. RFC 7578 deprecates the header
    in forms, but some clients still send base64: its lines may break anywhere (RFC 2045 wraps
    them at 76), and anything else outside the alphabet is refused, not skipped (as Python's
    lenient decoder does: `@@@@` + a file decoded to the file)."""
    if encoding in _IDENTITY:
        return data
    if encoding == "quoted-printable":  # any bytes decode: `=` and two hex digits, or as is
        return quopri.decodestring(data)
    if encoding != "base64":
        raise _refused(
            f"{part}: Content-Transfer-Encoding `{echo(encoding)}` is not supported; expected "
            "base64, "
            "quoted-printable, 7bit, 8bit or binary (or none)"
        )
    try:
        return base64.b64decode(data.translate(None, b" \t\r\n"), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise _refused(
            f"{part}: its base64 does not decode: {exc}; expected the letters A-Z a-z, digits, "
            "`+` and `/`, then `=` padding to a multiple of 4 characters (line breaks anywhere)"
        ) from None


def _named(headers: Message, number: int) -> str:
    """`part 2 (field "file", file "page.png")`: which part, as a client can find it."""
    field = headers.get_param("name", header="content-disposition")
    names = [f"field {json.dumps(echo(field))}"] if isinstance(field, str) else []
    filename = headers.get_filename()
    names += [f"file {json.dumps(echo(filename))}"] if filename else []
    return f"part {number}" + (f" ({', '.join(names)})" if names else "")


def _headers(block: bytes) -> Message:
    return email.parser.BytesHeaderParser(policy=email.policy.HTTP).parsebytes(block + b"\r\n")


def _refused(why: str) -> InvalidInput:
    return InvalidInput(f"request body: multipart/form-data: {why}")
