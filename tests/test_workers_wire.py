"""The control messages between a front and the inference process (workers/wire.py): every kind
crosses unchanged, every error of the tree keeps its class, status, message and fields, and
what is not a message of the protocol is refused without being run."""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import pickle
import socket
from pathlib import Path
from typing import Any

import httpx
import msgpack
import numpy as np
import pytest

from edgeserve import errors
from edgeserve.shapes import ShapeRange
from edgeserve.workers import wire
from edgeserve.workers.arena import Arena
from edgeserve.workers.child import ChildConfig
from tests.server import running
from tests.test_workers import children, function, infer_body

DEADLINE, ARRIVED = 1234.5, 1234.25


def crossed(message: tuple[Any, ...], kinds: frozenset[int]) -> tuple[Any, ...]:
    """`message` encoded, then decoded as its receiver does."""
    return wire.decode(wire.encode(message), kinds)


def texts() -> np.ndarray:
    array = np.empty((2, 2), object)
    array[:] = [["a", b"\x00b"], ["ü", b""]]
    return array


MESSAGES = {
    "hello": (wire.HELLO, "onnxruntime", {"x": ShapeRange((1, 3), (8, 3), (32, -1))}),
    "hello without a profile": (wire.HELLO, "openvino", None),
    "hello, numpy's dims": (
        wire.HELLO,
        "tensorrt",
        {"x": ShapeRange(*[tuple(np.array(dims, np.int64)) for dims in ((1, 3), (8, 3), (8, 3))])},
    ),
    "submit in the arena": (
        wire.SUBMIT,
        7,
        {"x": ("<f4", (1, 16), 128), "mask": ("|b1", (1, 16), 192)},
        (128, 128),
        DEADLINE,
        ARRIVED,
        None,
    ),
    "submit inline, of a request": (
        wire.SUBMIT,
        8,
        {"x": np.arange(6, dtype=">i8").reshape(2, 3), "text": texts()},
        (0, 0),
        DEADLINE,
        ARRIVED,
        3,
    ),
    "wait": (wire.WAIT, 9, DEADLINE),
    "cancel": (wire.CANCEL, 7),
    "done with outputs": (wire.DONE, 7, {"y": ("<f2", (1, 4), 128), "z": np.array(2.5)}),
    "done with nothing": (wire.DONE, 9, None),
    "done with an error": (wire.DONE, 8, errors.Unavailable("queue full", 0.25)),
}


def assert_same(got: Any, sent: Any) -> None:
    assert type(got) is type(sent), (got, sent)
    if isinstance(sent, np.ndarray):
        assert (got.dtype, got.shape) == (sent.dtype, sent.shape)
        assert got.tolist() == sent.tolist()
        assert got.flags.writeable
    elif isinstance(sent, errors.EdgeserveError):
        assert (got.status, got.message, vars(got)) == (sent.status, sent.message, vars(sent))
    elif isinstance(sent, dict):
        assert got.keys() == sent.keys()
        for key in sent:
            assert_same(got[key], sent[key])
    elif isinstance(sent, tuple):
        assert len(got) == len(sent)
        for one, other in zip(got, sent, strict=True):
            assert_same(one, other)
    else:
        assert got == sent


@pytest.mark.parametrize("name", MESSAGES)
def test_every_kind_of_message_crosses_unchanged(name: str) -> None:
    message = MESSAGES[name]
    kinds = wire.FROM_FRONT if message[0] in wire.FROM_FRONT else wire.TO_FRONT
    assert_same(crossed(message, kinds), message)


def tree() -> list[type[errors.EdgeserveError]]:
    """Every error class errors.py defines."""
    return [
        cls
        for _, cls in inspect.getmembers(errors, inspect.isclass)
        if issubclass(cls, errors.EdgeserveError) and cls.__module__ == errors.__name__
    ]


SAMPLE_FIELDS = {
    "origin": "handler.py:3",
    "invalid": True,
    "retry_after_s": 2.5,
    "tensor": "ids",
    "at": (1, 2),
}


@pytest.mark.parametrize("cls", tree(), ids=lambda cls: cls.__name__)
def test_every_error_of_the_tree_keeps_its_class_status_message_and_fields(
    cls: type[errors.EdgeserveError],
) -> None:
    """A class added to errors.py without its entry in the wire's table fails here, and so
    does a field it carries that the wire would drop."""
    names = [name for name in inspect.signature(cls).parameters if name != "message"]
    error = cls("what went wrong, where", **{name: SAMPLE_FIELDS[name] for name in names})
    (_, _, got) = crossed((wire.DONE, 1, error), wire.TO_FRONT)
    assert type(got) is cls
    assert (got.status, got.exit_code, str(got)) == (cls.status, cls.exit_code, str(error))
    assert vars(got) == vars(error)


def test_an_error_of_a_class_outside_the_tree_crosses_as_its_nearest_class() -> None:
    class Refused(errors.InvalidInput):
        pass

    (_, _, got) = crossed((wire.DONE, 1, Refused("token 99")), wire.TO_FRONT)
    assert (type(got), got.status, got.message) == (errors.InvalidInput, 400, "token 99")


def test_messages_cross_a_unix_socket_under_asyncio() -> None:
    """Several messages in one read, one message over several reads (a large inline array),
    then the end of the stream."""
    large = (wire.DONE, 3, {"y": np.arange(2**20, dtype=np.float32)})

    async def exchange() -> list[tuple[Any, ...]]:
        one, other = socket.socketpair()
        _, writer = await asyncio.open_unix_connection(sock=one)
        reader, _ = await asyncio.open_unix_connection(sock=other)
        receiver = wire.Receiver(reader)
        sender = wire.Sender(writer)
        for message in (MESSAGES["wait"], MESSAGES["cancel"], large):
            sender.send(message)
        got = [await receiver.receive(wire.FROM_FRONT) for _ in range(2)]
        got.append(await receiver.receive(wire.TO_FRONT))
        sender.close()
        with pytest.raises(asyncio.IncompleteReadError):
            await receiver.receive(wire.FROM_FRONT)
        return got

    wait, cancel, done = asyncio.run(exchange())
    assert (wait, cancel) == (MESSAGES["wait"], MESSAGES["cancel"])
    assert_same(done, large)


def test_a_malformed_stream_is_refused_where_it_goes_wrong() -> None:
    """The good message before the bad bytes is still read; then the stream is refused."""

    async def read(data: bytes, count: int) -> list[tuple[Any, ...]]:
        reader = asyncio.StreamReader()
        reader.feed_data(data)
        receiver = wire.Receiver(reader)
        return [await receiver.receive(wire.FROM_FRONT) for _ in range(count)]

    cancel = wire.encode(MESSAGES["cancel"])
    assert asyncio.run(read(cancel + b"\xc1", 1)) == [MESSAGES["cancel"]]
    with pytest.raises(wire.Malformed, match="not msgpack"):
        asyncio.run(read(cancel + b"\xc1", 2))
    with pytest.raises(wire.Malformed, match="not a message expected here"):
        asyncio.run(read(cancel + wire.encode(MESSAGES["done with nothing"]), 2))


def pack(*fields: Any) -> bytes:
    return msgpack.packb(fields, use_bin_type=True)


def ext(code: int, *fields: Any) -> msgpack.ExtType:
    return msgpack.ExtType(code, pack(*fields))


MALFORMED = {
    "not msgpack": b"\xc1\xc1",
    "trailing bytes": pack(wire.CANCEL, 1) + b"\x00",
    "not an array": msgpack.packb({"kind": wire.CANCEL}),
    "empty": pack(),
    "unknown kind": pack(9, 1),
    "a kind of the other direction": pack(wire.DONE, 1, None),
    "a bool for a number": pack(wire.CANCEL, True),
    "a negative id": pack(wire.CANCEL, -1),
    "a field too many": pack(wire.CANCEL, 1, 2),
    "a field missing": pack(wire.WAIT, 1),
    "a string for a deadline": pack(wire.WAIT, 1, "soon"),
    "an unknown extension": pack(wire.SUBMIT, 1, {"x": ext(99, 1)}, (0, 0), 1.0, 1.0, None),
    "a ref of objects": pack(wire.SUBMIT, 1, {"x": ("|O", (1,), 0)}, (0, 0), 1.0, 1.0, None),
    "a ref of no dtype": pack(wire.SUBMIT, 1, {"x": ("<q9", (1,), 0)}, (0, 0), 1.0, 1.0, None),
    "a negative offset": pack(wire.SUBMIT, 1, {"x": ("<f4", (1,), -64)}, (0, 0), 1.0, 1.0, None),
    "an array shorter than its shape": pack(
        wire.SUBMIT, 1, {"x": ext(1, "<f4", (2, 2), b"\x00" * 8)}, (0, 0), 1.0, 1.0, None
    ),
    "texts holding a number": pack(
        wire.SUBMIT, 1, {"x": ext(2, (2,), ("a", 3))}, (0, 0), 1.0, 1.0, None
    ),
    "a pickle inside an array": pack(
        wire.SUBMIT, 1, {"x": ext(1, "|O", (1,), pickle.dumps([1]))}, (0, 0), 1.0, 1.0, None
    ),
}
MALFORMED_ANSWERS = {
    "an error class outside the tree": pack(wire.DONE, 1, ext(3, "SystemExit", "bye", {})),
    "an error with a field it lacks": pack(wire.DONE, 1, ext(3, "InvalidInput", "x", {"a": 1})),
    "an error with a field of the wrong type": pack(
        wire.DONE, 1, ext(3, "Unavailable", "full", {"retry_after_s": "soon"})
    ),
    "a profile of strings": pack(wire.HELLO, "onnxruntime", {"x": ext(4, ("a",), (1,), (1,))}),
}


@pytest.mark.parametrize("name", MALFORMED)
def test_a_malformed_message_from_a_front_is_refused(name: str) -> None:
    with pytest.raises(wire.Malformed):
        wire.decode(MALFORMED[name], wire.FROM_FRONT)


@pytest.mark.parametrize("name", MALFORMED_ANSWERS)
def test_a_malformed_answer_from_the_inference_process_is_refused(name: str) -> None:
    with pytest.raises(wire.Malformed):
        wire.decode(MALFORMED_ANSWERS[name], wire.TO_FRONT)


class _Planted:
    """Unpickling this would create a file: proof that nothing in a message is run."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.touch, (self.path,))


def test_a_pickle_is_refused_and_never_run(tmp_path: Path) -> None:
    planted = tmp_path / "planted"
    payload = pickle.dumps((wire.CANCEL, _Planted(planted)))
    for kinds in (wire.FROM_FRONT, wire.TO_FRONT):
        with pytest.raises(wire.Malformed):
            wire.decode(payload, kinds)
    assert not planted.exists()


def test_what_cannot_cross_is_said_when_sending() -> None:
    objects = np.array([{"not": "text"}], object)
    with pytest.raises(wire.Malformed, match="holds a dict"):
        wire.encode((wire.DONE, 1, {"y": objects}))
    with pytest.raises(wire.Malformed, match="cannot send a set"):
        wire.encode((wire.DONE, 1, {"y": {1}}))


def test_a_hello_carries_its_fields_and_descriptor_and_nothing_else() -> None:
    one, other = socket.socketpair()
    with one, other:
        wire.send_hello(one, {"front": 2, "arena_bytes": 4096}, [one.fileno()])
        hello, fds = wire.receive_hello(other)
        assert hello == {"front": 2, "arena_bytes": 4096}
        assert len(fds) == 1
        socket.send_fds(one, [msgpack.packb({"front": 2, "arena_bytes": 1, "x": 0})], [fds[0]])
        with pytest.raises(wire.Malformed, match="not a hello"):
            wire.receive_hello(other)
        socket.send_fds(one, [pickle.dumps({"front": 2, "arena_bytes": 1})], [fds[0]])
        with pytest.raises(wire.Malformed):
            wire.receive_hello(other)
        os.close(fds[0])


def test_the_inference_process_refuses_a_malformed_stream_runs_nothing_and_serves_on(
    tmp_path: Path,
) -> None:
    """A connection to a real inference process (as a front makes one: hello and arena), then
    a pickle that would create a file: the process logs the refusal, closes that connection
    alone, and the server goes on answering."""
    planted = tmp_path / "planted"
    with running(function(tmp_path / "mlp"), "--workers", "2") as (url, server):
        (pid,) = children(server)["inference"]
        config = ChildConfig(
            **json.loads(Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[-2])
        )
        arena = Arena.create(4096)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(30)
            sock.connect(config.socket_path(0))
            wire.send_hello(sock, {"front": 1, "arena_bytes": 4096}, [arena.fd])
            hello = sock.recv(4096)
            assert wire.decode(hello, wire.TO_FRONT)[0] == wire.HELLO
            sock.sendall(pickle.dumps((wire.CANCEL, _Planted(planted))))
            assert sock.recv(4096) == b""  # closed on us
        arena.close()
        body = infer_body(np.full((1, 16), 0.5, np.float32))
        assert httpx.post(f"{url}/v2/models/mlp/infer", json=body).status_code == 200
    assert not planted.exists()
    refusal = "ERROR: front 1 sent not a message expected here: {}: dropping it"
    assert refusal in "".join(server.output)  # a pickle's first byte is an empty msgpack map
