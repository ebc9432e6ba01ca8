"""Control messages between a front and the inference process: msgpack, one message after the
other, over one unix stream socket per front (the measured choice: benchmarks/channels.py).

    front -> inference    hello {front, arena_bytes} with the arena's fd (SCM_RIGHTS)
    inference -> front    (HELLO, backend name, shape profile | None)
    front -> inference    (SUBMIT, id, placed inputs, block, deadline, arrived, request)
                          (WAIT, id, deadline)    the board shows a full queue: wait in line
                          (CANCEL, id)            the client hung up: drop its items if queued
    inference -> front    (DONE, id, placed outputs | None | error)   one per SUBMIT or WAIT

`block` is the request's (offset, size) in the front's arena; `deadline` and `arrived` are
time.monotonic() instants, which every process of the machine shares; `request` numbers the
requests of a front whose items share one outcome (batching.ONE_REQUEST), None when alone.

A message is a msgpack array, its kind first, read by msgpack's streaming unpacker (no length
prefix: one read takes as many messages as have arrived). What msgpack has no type for is an
extension with its own encoder and decoder here:

    ARRAY   an inline numeric array          (dtype.str, shape, bytes)
    TEXTS   an inline BYTES array (objects)  (shape, items), each item str or bytes
    ERROR   an error of the one tree         (class name, message, {field: value})
    RANGE   a shapes.ShapeRange              (min, opt, max)

An error keeps its class, message and fields, so a front raises what the inference process
raised and HTTP answers it alike. Decoding makes nothing but these types and checks every field
of the message's kind: anything else (bytes that are not msgpack, an unknown kind, extension
or error class, a field of the wrong type) raises `Malformed`, and the receiver closes the
connection. Nothing in a message is imported or run.
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections import deque
from collections.abc import Callable, Collection
from functools import lru_cache
from typing import Any

import msgpack
import numpy as np

from edgeserve import errors
from edgeserve.shapes import UNBOUNDED, ShapeRange

HELLO, SUBMIT, WAIT, CANCEL, DONE = 0, 1, 2, 3, 4
FROM_FRONT = frozenset({SUBMIT, WAIT, CANCEL})
TO_FRONT = frozenset({HELLO, DONE})
HELLO_BYTES = 4096
READ_BYTES = 2**18
_ARRAY, _TEXTS, _ERROR, _RANGE = 1, 2, 3, 4

_ERROR_FIELDS: dict[type[errors.EdgeserveError], dict[str, tuple[type, ...]]] = {
    errors.EdgeserveError: {},
    errors.ConfigError: {},
    errors.BundleError: {},
    errors.BackendError: {},
    errors.HandlerError: {"origin": (str,)},
    errors.InvalidInput: {},
    errors.InvalidElement: {"tensor": (str,), "at": (tuple,)},
    errors.ModelRefused: {},
    errors.Unauthorized: {"invalid": (bool,)},
    errors.Forbidden: {},
    errors.ModelNotFound: {},
    errors.RequestTimeout: {},
    errors.PayloadTooLarge: {},
    errors.HeadersTooLarge: {},
    errors.Unavailable: {"retry_after_s": (float, int)},
    errors.DeadlineExceeded: {},
    errors.DeployError: {},
    errors.DeployInterrupted: {},
}
"""Every class of the error tree, with the fields it carries beyond its message."""
_ERRORS = {cls.__name__: cls for cls in _ERROR_FIELDS}
_HELLO = {"front": int, "arena_bytes": int}
_TIME = (float, int)  # a time.monotonic() instant


class Malformed(ValueError):
    """A message this protocol does not have: the connection it came on cannot go on."""


def _extension(value: object) -> msgpack.ExtType:
    """The encoders of what msgpack has no type for (its `default`)."""
    if isinstance(value, np.ndarray):
        if value.dtype.hasobject:
            return _ext(_TEXTS, value.shape, [_text(item) for item in value.ravel().tolist()])
        return _ext(_ARRAY, value.dtype.str, value.shape, value.tobytes())
    if isinstance(value, errors.EdgeserveError):
        cls = next(c for c in type(value).__mro__ if c in _ERROR_FIELDS)
        fields = {name: getattr(value, name) for name in _ERROR_FIELDS[cls]}
        return _ext(_ERROR, cls.__name__, value.message, fields)
    if isinstance(value, ShapeRange):  # dims as ints, should a backend's be numpy's
        return _ext(_RANGE, *(tuple(map(int, dims)) for dims in (value.min, value.opt, value.max)))
    raise Malformed(f"cannot send a {type(value).__name__}")


_PACKER = msgpack.Packer(default=_extension, use_bin_type=True)
"""One packer, reused (a new one per message costs 0.8 us): messages are encoded on the
event loop's thread only, and an extension packs its fields with a packer of its own."""


class Sender:
    """The messages leaving on one stream, written together once per turn of the event loop:
    a batch's answers (or a burst of requests) cost one system call and wake the other side
    once, instead of once each. Nothing awaits: the kernel's socket buffer absorbs them."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self._writer = writer
        self._frames: list[bytes] = []

    @property
    def closing(self) -> bool:
        return self._writer.is_closing()

    def send(self, message: tuple[Any, ...]) -> None:
        self.put(encode(message))

    def put(self, frame: bytes) -> None:
        """Queue an encoded message (`encode`): it leaves, in order, with whatever else this
        turn of the event loop queues, once the turn is over."""
        if not self._frames:
            asyncio.get_running_loop().call_soon(self._flush)
        self._frames.append(frame)

    def close(self) -> None:
        self._flush()
        self._writer.close()

    def _flush(self) -> None:
        frames, self._frames = self._frames, []
        if frames and not self._writer.is_closing():
            self._writer.write(frames[0] if len(frames) == 1 else b"".join(frames))


def encode(message: tuple[Any, ...]) -> bytes:
    """One message's bytes, for a sender that must know it can be sent before it commits."""
    return _PACKER.pack(message)


class Receiver:
    """The messages arriving on one stream, in order."""

    def __init__(self, reader: asyncio.StreamReader) -> None:
        self._reader = reader
        self._unpacker = msgpack.Unpacker(
            ext_hook=_decode_extension, use_list=False, raw=False, max_buffer_size=0
        )  # 0: up to 4 GiB waiting (an inline output may be large)
        self._arrived: deque[Any] = deque()  # unpacked, not yet received
        self._failed: Malformed | None = None  # raised once those before it are received

    async def receive(self, kinds: Collection[int]) -> tuple[Any, ...]:
        """The next message, one of `kinds`; IncompleteReadError when the other side has
        gone, Malformed when it sent something else."""
        while not self._arrived:
            if self._failed is not None:
                raise self._failed
            data = await self._reader.read(READ_BYTES)
            if not data:
                raise asyncio.IncompleteReadError(b"", None)
            try:
                self._unpacker.feed(data)
                self._arrived.extend(self._unpacker)  # every message complete so far
            except Malformed as exc:
                self._failed = exc
            except (ValueError, TypeError, msgpack.UnpackException) as exc:
                self._failed = Malformed(f"not msgpack: {type(exc).__name__} {exc}")
        return _checked(self._arrived.popleft(), kinds)


def decode(data: bytes, kinds: Collection[int]) -> tuple[Any, ...]:
    """The one message in `data`, checked against its kind's fields."""
    return _checked(_unpack(data), kinds)


def _checked(message: Any, kinds: Collection[int]) -> tuple[Any, ...]:
    kind = message[0] if isinstance(message, tuple) and message else None
    if type(kind) is not int or kind not in kinds:
        raise Malformed(f"not a message expected here: {_brief(message)}")
    if not _CHECKS[kind](message):
        raise Malformed(f"fields of the wrong number or type: {_brief(message)}")
    return message


def send_hello(sock: socket.socket, hello: dict[str, int], fds: list[int]) -> None:
    """The first message of a connection, on a blocking socket, carrying file descriptors."""
    socket.send_fds(sock, [msgpack.packb(hello)], fds)


def receive_hello(sock: socket.socket, max_fds: int = 1) -> tuple[dict[str, int], list[int]]:
    data, fds, _, _ = socket.recv_fds(sock, HELLO_BYTES, max_fds)
    try:
        if not data:
            raise ConnectionError("closed before its hello")
        hello = _unpack(data)
        wanted = isinstance(hello, dict) and hello.keys() == _HELLO.keys()
        if not wanted or not all(type(hello[key]) is kind for key, kind in _HELLO.items()):
            raise Malformed(f"not a hello: {_brief(hello)}")
        if len(fds) != max_fds:
            raise Malformed(f"a hello with {len(fds)} file descriptors, expected {max_fds}")
    except (ConnectionError, Malformed):
        for fd in fds:  # not kept: closed here
            os.close(fd)
        raise
    return hello, fds


def _unpack(data: bytes) -> Any:
    try:
        return msgpack.unpackb(data, ext_hook=_decode_extension, use_list=False, raw=False)
    except Malformed:
        raise
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise Malformed(f"not msgpack: {type(exc).__name__} {exc}") from None


def _ext(code: int, *fields: Any) -> msgpack.ExtType:
    return msgpack.ExtType(code, msgpack.packb(fields, use_bin_type=True))


def _text(item: object) -> str | bytes:
    if not isinstance(item, str | bytes):
        raise Malformed(f"a BYTES tensor holds a {type(item).__name__}: only str and bytes cross")
    return item


def _decode_extension(code: int, data: bytes) -> Any:
    """The decoders (msgpack's `ext_hook`): each checks what it is given."""
    fields = msgpack.unpackb(data, use_list=False, raw=False)
    if code == _ARRAY and _are(fields, str, _is_dims, bytes):
        dtype, shape, raw = fields
        try:
            return np.frombuffer(raw, _dtype(dtype)).reshape(shape).copy()
        except ValueError as exc:
            raise Malformed(f"array {dtype} {list(shape)}: {exc}") from None
    if code == _TEXTS and _are(fields, _is_dims, tuple):
        shape, items = fields
        if not all(isinstance(item, str | bytes) for item in items):
            raise Malformed("a BYTES array holds something other than str and bytes")
        array = np.empty(len(items), object)
        array[:] = items
        try:
            return array.reshape(shape)
        except ValueError as exc:
            raise Malformed(f"BYTES array {list(shape)}: {exc}") from None
    if code == _ERROR and _are(fields, str, str, dict):
        return _error(*fields)
    if code == _RANGE and _are(fields, _is_range, _is_range, _is_range):
        return ShapeRange(*fields)
    raise Malformed(f"unknown extension {code} or fields of the wrong type")


def _are(fields: Any, *checks: type | Callable[[Any], bool]) -> bool:
    """Whether an extension's `fields` are one for each check: a type (exactly), or a test."""
    return (
        type(fields) is tuple
        and len(fields) == len(checks)
        and all(
            type(value) is check if isinstance(check, type) else check(value)
            for check, value in zip(checks, fields, strict=True)
        )
    )


def _error(name: str, message: str, fields: dict[str, Any]) -> errors.EdgeserveError:
    cls = _ERRORS.get(name)
    if cls is None:
        raise Malformed(f"no error class {name!r} in the tree")
    kinds = _ERROR_FIELDS[cls]
    if fields.keys() != kinds.keys() or not all(
        type(value) in kinds[key] for key, value in fields.items()
    ):
        raise Malformed(f"{name}: fields {sorted(fields)}, expected {sorted(kinds)}")
    return cls(message, **fields)


@lru_cache(maxsize=256)
def _dtype(name: str) -> np.dtype[Any]:
    """A numeric dtype by its `dtype.str` (an object dtype never comes from raw bytes)."""
    try:
        dtype = np.dtype(name)
    except (TypeError, ValueError):
        raise Malformed(f"no dtype {name!r}") from None
    if dtype.hasobject:
        raise Malformed(f"dtype {name!r} holds objects")
    return dtype


def _is_id(value: object) -> bool:
    return type(value) is int and value >= 0


def _is_dims(value: object, low: int = 0) -> bool:
    """A tuple of ints >= `low`."""
    if type(value) is not tuple:
        return False
    for n in value:  # noqa: SIM110 (a loop: all(generator) costs more, on every message)
        if type(n) is not int or n < low:
            return False
    return True


def _is_range(value: object) -> bool:
    """A shape range's dims: -1 is an unbounded one (shapes.UNBOUNDED)."""
    return _is_dims(value, UNBOUNDED)


def _is_placed(value: object) -> bool:
    """Tensors by name, each an arena.Ref (dtype.str of a numeric dtype, shape, offset) or an
    inline array. Written out flat, no helper calls: it runs for every SUBMIT and DONE."""
    if type(value) is not dict:
        return False
    for name, where in value.items():
        if type(name) is not str:
            return False
        if type(where) is not tuple:
            if type(where) is not np.ndarray:
                return False
            continue
        if len(where) != 3:
            return False
        dtype, shape, offset = where
        if type(dtype) is not str or type(shape) is not tuple or type(offset) is not int:
            return False
        if offset < 0:
            return False
        for n in shape:
            if type(n) is not int or n < 0:
                return False
        _dtype(dtype)  # Malformed unless a numeric dtype
    return True


def _is_profile(value: object) -> bool:
    return value is None or (
        type(value) is dict
        and all(type(name) is str and type(r) is ShapeRange for name, r in value.items())
    )


def _is_hello(m: tuple[Any, ...]) -> bool:
    return len(m) == 3 and type(m[1]) is str and _is_profile(m[2])


def _is_submit(m: tuple[Any, ...]) -> bool:
    if len(m) != 7:
        return False
    _, key, placed, block, deadline, arrived, request = m
    return (
        type(key) is int
        and key >= 0
        and _is_placed(placed)
        and _is_dims(block)
        and len(block) == 2
        and type(deadline) in _TIME
        and type(arrived) in _TIME
        and (request is None or _is_id(request))
    )


def _is_wait(m: tuple[Any, ...]) -> bool:
    return len(m) == 3 and _is_id(m[1]) and type(m[2]) in _TIME


def _is_cancel(m: tuple[Any, ...]) -> bool:
    return len(m) == 2 and _is_id(m[1])


def _is_done(m: tuple[Any, ...]) -> bool:
    if len(m) != 3:
        return False
    _, key, result = m
    return (
        type(key) is int
        and key >= 0
        and (_is_placed(result) or result is None or isinstance(result, errors.EdgeserveError))
    )


_CHECKS = {HELLO: _is_hello, SUBMIT: _is_submit, WAIT: _is_wait, CANCEL: _is_cancel, DONE: _is_done}
"""Each kind's fields, checked (one function a kind: a generic walk cost 3 us a message)."""


def _brief(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 200 else text[:200] + "..."
