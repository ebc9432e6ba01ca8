"""The raw HTTP/1.1 load generator against a real uvicorn server on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Iterator

import pytest

from edgeserve.bench import loadgen
from edgeserve.bench.loadgen import (
    Connection,
    Request,
    Target,
    closed_loop,
    encode_request,
    open_loop,
)
from tests.bench_app import create_app, running


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    with running(create_app()) as port:
        yield port


def _get(path: str, port: int) -> bytes:
    return encode_request(f"127.0.0.1:{port}", path, {}, b"")


def _infer(port: int) -> Request:
    tensor = {"name": "x", "datatype": "FP32", "shape": [2, 4], "data": [0.0] * 8}
    body = json.dumps({"inputs": [tensor]}).encode()
    headers = {"Content-Type": "application/json"}
    return Request(encode_request(f"127.0.0.1:{port}", "/v2/models/tiny/infer", headers, body), 2)


def test_encode_request_is_plain_http11() -> None:
    raw = encode_request("h:1", "/p", {"A": "b"}, b"xyz")
    assert raw == b"POST /p HTTP/1.1\r\nHost: h:1\r\nContent-Length: 3\r\nA: b\r\n\r\nxyz"
    assert encode_request("h:1", "/p", {}, b"").startswith(b"GET /p HTTP/1.1\r\n")


def test_exchange_reads_each_framing_on_one_connection(port: int) -> None:
    async def main() -> list[int]:
        connection = await Connection.open("127.0.0.1", port)
        statuses = [
            await connection.exchange(_get(path, port))
            for path in ("/chunked", "/v2/models/tiny", "/status/503", "/status/204", "/chunked")
        ]
        statuses.append(await connection.exchange(_infer(port).raw))
        await connection.close()
        return statuses

    assert asyncio.run(main()) == [200, 200, 503, 204, 200, 200]


def test_closed_loop_keeps_concurrency_requests_in_flight(port: int) -> None:
    target = Target("127.0.0.1", port, [_infer(port)])

    async def main() -> None:
        stop = asyncio.Event()
        asyncio.get_running_loop().call_later(0.5, stop.set)
        await closed_loop(target, 3, stop)

    asyncio.run(main())
    records = target.records
    assert len(records) > 30
    assert all(r.ok and r.items == 2 and r.sent <= r.ended for r in records)
    events = sorted([(r.sent, 1) for r in records] + [(r.ended, -1) for r in records])
    in_flight, peak = 0, 0
    for _, step in events:
        in_flight += step
        peak = max(peak, in_flight)
    assert peak == 3


def test_the_stop_wait_bounds_the_drain_not_the_load(
    port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(loadgen, "STOP_WAIT_S", 0.1)
    target = Target("127.0.0.1", port, [_infer(port)])

    async def main() -> float:
        stop = asyncio.Event()
        asyncio.get_running_loop().call_later(0.5, stop.set)
        start = time.monotonic()
        await closed_loop(target, 2, stop)
        return start

    start = asyncio.run(main())
    assert max(r.ended for r in target.records) - start > 0.45


def test_open_loop_sends_on_schedule_whatever_the_answers(port: int) -> None:
    target = Target("127.0.0.1", port, [_infer(port)])

    async def main() -> float:
        stop = asyncio.Event()
        start = time.monotonic()
        asyncio.get_running_loop().call_later(1.0, stop.set)
        await open_loop(target, 150.0, stop, seed=1)
        return start

    start = asyncio.run(main())
    records = target.records
    assert 150 - 4 * 150**0.5 < len(records) < 150 + 4 * 150**0.5  # Poisson count within 4 sigma
    assert all(r.ok for r in records)
    scheduled = sorted(r.scheduled - start for r in records)
    assert scheduled[0] > 0 and scheduled[-1] < 1.0
    assert all(r.sent >= r.scheduled for r in records)


def test_a_dead_server_yields_failed_records_not_exceptions() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = sock.getsockname()[1]  # bound, never listening: connections are refused
        target = Target("127.0.0.1", dead, [Request(b"GET / HTTP/1.1\r\n\r\n", 1)])

        async def main() -> None:
            stop = asyncio.Event()
            asyncio.get_running_loop().call_later(0.1, stop.set)
            await closed_loop(target, 2, stop)

        asyncio.run(main())
    assert target.records
    assert not any(r.ok for r in target.records)


def test_a_keep_alive_connection_closed_by_the_server_is_reopened() -> None:
    with running(create_app(), timeout_keep_alive=1) as port:
        target = Target("127.0.0.1", port, [_infer(port)])

        async def main() -> None:
            connection = await target.send(None, 0, time.monotonic())
            await asyncio.sleep(1.5)  # uvicorn closes the idle connection after 1 s
            await target.send(connection, 1, time.monotonic())

        asyncio.run(main())
    assert [r.ok for r in target.records] == [True, True]
