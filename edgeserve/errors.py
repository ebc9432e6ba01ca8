"""The one error tree of edgeserve.

    EdgeserveError                 status 500, exit code 1
    ├── ConfigError                a bad function.toml, target profile or CLI argument (exit 2)
    ├── BundleError                a bundle that is missing, altered or unsafe (exit 2)
    ├── BackendError               no usable backend, or one failed to load or run
    ├── HandlerError               the function's handler broke its contract (500; exit 2)
    ├── InvalidInput               400: what was wrong, where, what was expected
    │   └── InvalidElement         one element, by its place (moved to the request's rows)
    ├── ModelRefused               422: inputs the door let through, on whose values the model
    │                              failed (TopK's k past its axis): the backend's own words
    ├── Unauthorized               401, with WWW-Authenticate: missing or rejected credentials
    ├── Forbidden                  403: allowed to no one calling from where this caller is
    ├── ModelNotFound              404: a version or region not served (an unknown model is
    │                              InvalidInput, 400, as Triton answers)
    ├── RequestTimeout             408: a client too slow to send its request
    ├── PayloadTooLarge            413
    ├── HeadersTooLarge            431
    ├── Unavailable                503, with Retry-After: queue full, not ready, draining
    ├── DeadlineExceeded           504: the item's deadline passed before it could run
    └── DeployError                a deploy step failed (exit 3)
        └── DeployInterrupted      Ctrl-C during a switch, after the device was put back (130)

`http/errors.py` alone turns these into responses and `cli.py` alone into exit codes. What a
message repeats of a client's strings and values goes through `echo`, `echo_repr` and
`echo_json` (or `echo_json_text`).
"""

from __future__ import annotations

import difflib
import itertools
import json
import reprlib
from collections.abc import Iterable

import msgpack


class EdgeserveError(Exception):
    """Base class: carries its HTTP status and CLI exit code."""

    status: int = 500
    exit_code: int = 1

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ConfigError(EdgeserveError):
    exit_code = 2


class BundleError(EdgeserveError):
    exit_code = 2


class BackendError(EdgeserveError):
    status = 500


class HandlerError(EdgeserveError):
    """The function author's bug, not the client's: what the handler returned, what was
    expected. 500 at serve time (with that message: types and tensor names, nothing private;
    `origin`, the handler's file, goes to the log only), refused by build."""

    exit_code = 2

    def __init__(self, message: str, origin: str = "") -> None:
        super().__init__(message)
        self.origin = origin


class InvalidInput(EdgeserveError):
    status = 400


class InvalidElement(InvalidInput):
    """What is wrong with one element of a tensor, whose message names it as `element [...]`
    at `at`: a backend finds it in a batch, so the batcher moves its row to where the request
    had it (`moved`)."""

    def __init__(self, message: str, tensor: str, at: tuple[int, ...]) -> None:
        super().__init__(message)
        self.tensor, self.at = tensor, at

    @classmethod
    def of(cls, tensor: str, at: tuple[int, ...], what: str) -> InvalidElement:
        return cls(f"tensor `{tensor}`: element {list(at)} {what}", tensor, at)

    def moved(self, rows: int) -> InvalidElement:
        """The same error `rows` rows further down the batch axis."""
        at = (self.at[0] + rows, *self.at[1:])
        message = self.message.replace(f"element {list(self.at)}", f"element {list(at)}", 1)
        return InvalidElement(message, self.tensor, at)


class ModelRefused(EdgeserveError):
    """The model could not compute on a request's values, which passed every check at the door
    (datatype, dims, shape profile, index ranges): a TopK whose k, read from an input, exceeds
    its axis; a Reshape to a shape an input gives that the data does not fit. The request is
    well formed and the server has no fault, so it is the client's (422, Unprocessable
    Content: sending it again fails again); the message is the backend's. A batch failing so
    is rerun item by item (batching/batcher.py), so only the request that fails alone gets it.
    """

    status = 422


class Unauthorized(EdgeserveError):
    status = 401

    def __init__(self, message: str, *, invalid: bool = False) -> None:
        super().__init__(message)
        self.invalid = invalid  # a token was sent and refused (RFC 6750's invalid_token)


class Forbidden(EdgeserveError):
    status = 403


class ModelNotFound(EdgeserveError):
    status = 404


class RequestTimeout(EdgeserveError):
    status = 408


class PayloadTooLarge(EdgeserveError):
    status = 413


class HeadersTooLarge(EdgeserveError):
    status = 431


class Unavailable(EdgeserveError):
    status = 503

    def __init__(self, message: str, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class DeadlineExceeded(EdgeserveError):
    status = 504


class DeployError(EdgeserveError):
    exit_code = 3


class DeployInterrupted(DeployError):
    """The user interrupted a deploy while it switched releases; it went back first. 130 is
    the shell's code for SIGINT, as a plain Ctrl-C exits."""

    exit_code = 130


def as_edgeserve_error(exc: Exception, what: str) -> EdgeserveError:
    """`exc` as an error of the tree: one from outside it (a backend's own) becomes a
    BackendError saying that `what` failed and how."""
    if isinstance(exc, EdgeserveError):
        return exc
    return BackendError(f"{what} failed: {type(exc).__name__}: {exc}")


def did_you_mean(found: str, known: Iterable[str]) -> str:
    """`; did you mean `x`?` for the closest of `known` to a misspelling, else nothing."""
    close = difflib.get_close_matches(found, list(known), n=1, cutoff=0.6)
    return f"; did you mean `{close[0]}`?" if close else ""


ECHO_CHARS = 64
"""The most of a client's string an error repeats: enough to tell which one it was, while a
name of 100 KB no longer comes back as 100 KB of message (and of log line)."""


def echo(text: str) -> str:
    """A client's string (a tensor, region or model name) as an error repeats it: whole when
    short, else its first ECHO_CHARS characters, an ellipsis and its length."""
    if len(text) <= ECHO_CHARS:
        return text
    return f"{text[:ECHO_CHARS]}… ({len(text)} characters)"


class _JsonRepr(reprlib.Repr):
    """reprlib's bounded walk written in JSON's words: null, true, "text", {"key": 1}, keys in
    the order sent."""

    def repr_NoneType(self, value: None, level: int) -> str:  # reprlib calls it by type name
        return "null"

    def repr_bool(self, value: bool, level: int) -> str:
        return "true" if value else "false"

    def repr_float(self, value: float, level: int) -> str:
        return json.dumps(value)  # NaN and Infinity as edgeserve reads them

    def repr_str(self, value: str, level: int) -> str:
        text = json.dumps(value[: self.maxstring], ensure_ascii=False)
        return text if len(value) <= self.maxstring else f'{text[:-1]}{self.fillvalue}"'

    def repr_bytes(self, value: bytes, level: int) -> str:
        return f"<{echo_json(value)}>"

    def repr_ExtType(self, value: msgpack.ExtType, level: int) -> str:
        return f"<{echo_json(value)}>"

    def repr_Timestamp(self, value: msgpack.Timestamp, level: int) -> str:
        return f"<{echo_json(value)}>"

    def repr_dict(self, value: dict[object, object], level: int) -> str:
        if not value or level <= 0:
            return f"{{{self.fillvalue if value else ''}}}"
        pieces = [
            f"{self.repr1(key, level - 1)}: {self.repr1(item, level - 1)}"
            for key, item in itertools.islice(value.items(), self.maxdict)
        ]
        return f"{{{', '.join(pieces + [self.fillvalue] * (len(value) > self.maxdict))}}}"


def _bounded(shortened: reprlib.Repr) -> reprlib.Repr:
    shortened.maxlevel, shortened.maxlist, shortened.maxtuple = 2, 6, 6
    shortened.maxdict = shortened.maxset = 4
    shortened.maxstring = shortened.maxother = shortened.maxlong = ECHO_CHARS
    return shortened


_REPR = _bounded(reprlib.Repr())  # Python 3.11 takes no arguments here
_JSON = _bounded(_JsonRepr())


def echo_repr(value: object) -> str:
    """A client's value (anything JSON or msgpack carries) as an error shows it, `repr`-like,
    cut as `echo` cuts a string; a large list is never written out whole to be cut."""
    if isinstance(value, str | bytes):
        if len(value) <= ECHO_CHARS:
            return repr(value)
        unit = "characters" if isinstance(value, str) else "bytes"
        return f"{value[:ECHO_CHARS]!r}… ({len(value)} {unit})"
    return _cut(_REPR.repr(value), value, type(value).__name__)


def echo_header(value: str | list[str]) -> str:
    """A request header's value (or values) as an error repeats it, quoted and cut as
    `echo_repr` does. ASGI hands a header's bytes over read as latin-1, so a client's UTF-8
    (`é`) came back garbled (`Ã©`): the bytes are read back as UTF-8, one that is not
    shown as U+FFFD. A value that is already text beyond latin-1 is shown as it is."""
    if isinstance(value, list):
        return echo_repr([_as_sent(item) for item in value])
    return echo_repr(_as_sent(value))


def _as_sent(value: str) -> str:
    try:
        raw = value.encode("latin-1")
    except UnicodeEncodeError:
        return value
    return value if raw.isascii() else raw.decode("utf-8", "replace")


def echo_json_text(value: object) -> str:
    """A client's JSON value written out as JSON (`[1, {"a": null}]`, where `echo_json` says
    "a list"), cut as `echo_repr` cuts: where the value itself is what was wrong."""
    return _cut(_JSON.repr(value), value, "a list" if isinstance(value, list) else "an object")


def _cut(text: str, value: object, kind: str) -> str:
    """reprlib's text of `value` at most ECHO_CHARS long, with the length of a list or dict
    it left part of out (reprlib marks what it left out with "...")."""
    if len(text) > ECHO_CHARS:
        text = f"{text[:ECHO_CHARS]}…"
    elif "..." not in text:
        return text
    if isinstance(value, list | dict):
        return f"{text} ({kind} of {len(value)})"
    return text


class _Missing:
    """A key a client left out: `mapping.get(key, MISSING)`, so that a message can tell it from
    a null."""

    def __repr__(self) -> str:
        return "MISSING"


MISSING = _Missing()


def echo_json(value: object) -> str:
    """A client's JSON or msgpack value as a message shows it, in JSON's words rather than
    Python's (null, not None or NoneType; an object, not dict; bytes, not b'...'): a scalar as
    `echo_repr` writes it, a list or object by its kind, a key left out (MISSING) as such."""
    if value is None or isinstance(value, bool):
        return "null" if value is None else str(value).lower()
    if isinstance(value, dict | list):
        return "an object" if isinstance(value, dict) else "a list"
    if isinstance(value, bytes | msgpack.ExtType | msgpack.Timestamp):
        return _msgpack_words(value)
    return "nothing (the key is missing)" if value is MISSING else echo_repr(value)


def _msgpack_words(value: bytes | msgpack.ExtType | msgpack.Timestamp) -> str:
    """What msgpack carries and JSON does not, named as msgpack does: bytes (with their text,
    where they are some, for a name sent as bin), an ext by its type code, a timestamp."""
    if isinstance(value, msgpack.ExtType):
        return f"a msgpack ext of type {value.code}"
    if isinstance(value, msgpack.Timestamp):
        return "a msgpack timestamp"
    text = value.decode("utf-8", "replace")
    if text.isprintable() and "\ufffd" not in text:
        return f"bytes (a msgpack bin) of the text {echo_repr(text)}"
    return f"{len(value)} byte{'s' * (len(value) != 1)} (a msgpack bin)"
