"""Clients as users run them, on what they send that the other tests do not: perf_analyzer's
default random data on a model with a BOOL input, tritonclient's sequence parameters (ignored,
as Triton ignores them without a sequence batcher), and a burst of connections while the fronts
are busy. One `edgeserve serve --grpc-port 0 --workers 2` of the Identity model of every
datatype serves them, and a slow model with a short queue the burst of requests far over it.
"""

from __future__ import annotations

import asyncio
import os
import queue
import resource
import signal
import socket
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http

from tests.models import slow_model, write_function
from tests.server import Server, running
from tests.test_grpc import every_input, grpc_url, identity_function
from tests.test_perf_analyzer import run_perf_analyzer
from tests.test_tritonclient import RUN_BY_ORT
from tests.test_tritonclient import every_input as http_inputs
from tests.test_v2_codec import SAMPLES
from tests.test_workers import children

QUEUE_ROWS = 8
OVER_THE_QUEUE = 100
BURST = 1000
"""Connections in the burst: more than the channels of two fronts held here (their kernel
buffers; 888 of a burst of 3,000 were closed while the fronts served pipelined requests)."""


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Server]]:
    source = identity_function(tmp_path_factory)
    with running(source, "--grpc-port", "0", "--workers", "2") as (url, server):
        yield url, server


@pytest.fixture(scope="module")
def urls(served: tuple[str, Server]) -> tuple[str, str]:
    """(HTTP base URL, gRPC address) of the server."""
    return served[0], grpc_url(served[1])


@pytest.mark.parametrize("protocol", [("-i", "http"), ("-i", "grpc", "--streaming")])
def test_perf_analyzer_random_data_fills_bool_tensors(
    urls: tuple[str, str], protocol: tuple[str, ...]
) -> None:
    """perf_analyzer's default data is random bytes in every tensor, BOOL included: each run
    failed at once on "BOOL data: byte 0 is 103", where Triton runs it."""
    url = urls[1] if "grpc" in protocol else urls[0]
    output = run_perf_analyzer(url, *protocol, model="identity")
    assert "Throughput:" in output


def test_bool_bytes_other_than_0_reach_the_model_as_1(urls: tuple[str, str]) -> None:
    """A BOOL tensor's binary bytes of 2 and 255 are true, and the model sees 1 for them, as it
    does for `True` (numpy viewed them as bools holding 2 and 255)."""
    sent = b"\x00\x02\xff\x01\x00\x07"
    inputs = [_json_input(datatype) for datatype in RUN_BY_ORT if datatype != "BOOL"]
    bools = {"name": "in_BOOL", "datatype": "BOOL", "shape": [2, 3]}
    inputs.append(bools | {"parameters": {"binary_data_size": len(sent)}})
    outputs = [{"name": "out_BOOL", "parameters": {"binary_data": True}}]
    header = orjson.dumps({"inputs": inputs, "outputs": outputs})
    answer = httpx.post(
        f"{urls[0]}/v2/models/identity/infer",
        content=header + sent,
        headers={"Inference-Header-Content-Length": str(len(header))},
    )
    assert answer.status_code == 200, answer.text
    length = int(answer.headers["Inference-Header-Content-Length"])
    assert answer.content[length:] == b"\x00\x01\x01\x01\x00\x01"


def _json_input(datatype: str) -> dict[str, object]:
    data = SAMPLES[datatype]
    values = [item.decode() for item in data.flat] if datatype == "BYTES" else data.tolist()
    return {
        "name": f"in_{datatype}",
        "datatype": datatype,
        "shape": list(data.shape),
        "data": values,
    }


@pytest.mark.parametrize(
    "sequence", [{"sequence_id": 7}, {"sequence_id": "s", "sequence_end": True}]
)
def test_a_sequences_parameters_are_ignored_as_triton_ignores_them_without_a_sequence_batcher(
    urls: tuple[str, str], sequence: dict[str, object]
) -> None:
    """tritonclient's sequence_id and its start and end flags only mean something to a
    sequence batcher, which edgeserve does not have; Triton's dynamic batcher ignores them.
    Such a request is answered as any other, over both protocols."""
    with closing(triton_http.InferenceServerClient(urls[0].removeprefix("http://"))) as http:
        answer = http.infer("identity", http_inputs(True), **sequence)  # type: ignore[arg-type]
        assert (answer.as_numpy("out_FP32") == SAMPLES["FP32"]).all()
    with closing(triton_grpc.InferenceServerClient(urls[1])) as grpc:
        answer = grpc.infer("identity", every_input(), **sequence)  # type: ignore[arg-type]
        assert (answer.as_numpy("out_FP32") == SAMPLES["FP32"]).all()


def test_a_burst_of_connections_while_the_fronts_are_busy_is_answered(
    served: tuple[str, Server],
) -> None:
    """The supervisor hands each connection to a front over a channel that holds a few
    (net.unix.max_dgram_qlen: 10 by default): while both fronts' event loops were busy, a burst
    of connections past that was closed unanswered ("no front could take a connection"). Both
    fronts are stopped here for the burst, then go on; every connection gets its answer."""
    url, server = served
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 2 * BURST:  # 1024 by default on many systems
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4 * BURST), hard))
    host, port = url.removeprefix("http://").split(":")
    fronts = children(server)["front"]
    for pid in fronts:
        os.kill(pid, signal.SIGSTOP)
    try:
        clients = [socket.create_connection((host, int(port)), timeout=30) for _ in range(BURST)]
        for client in clients:
            client.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: burst\r\n\r\n")
        time.sleep(0.5)  # the supervisor accepts them meanwhile
    finally:
        for pid in fronts:
            os.kill(pid, signal.SIGCONT)
    answers = []
    for client in clients:
        with client:
            answers.append(client.recv(64).split(b"\r\n")[0])
    assert answers == [b"HTTP/1.1 200 OK"] * BURST


def test_a_stream_says_each_answer_is_its_request_s_last_when_asked(urls: tuple[str, str]) -> None:
    """tritonclient's `enable_empty_final_response` asks every answer on a stream to say whether
    it is its request's last (`triton_final_response`), which clients of decoupled models wait
    for; Triton's answer to a request of a model like this one says true. It was never said."""
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    with closing(triton_grpc.InferenceServerClient(urls[1])) as client:
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        for asked in (True, False):
            client.async_stream_infer("identity", every_input(), enable_empty_final_response=asked)
            result, error = answers.get(timeout=30)
            assert error is None, error
            final = result.get_response().parameters.get("triton_final_response")
            assert (final.bool_param if final is not None else None) is (True if asked else None)
        client.stop_stream()


QUEUED = f"""
[function]
name = "slow"
[batching]
max_batch_size = 4
max_queue_size = {QUEUE_ROWS}
[backend]
prefer = ["onnxruntime"]
threads = 1
"""


BODY_1024 = orjson.dumps(
    {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 1, 1024], "data": [0.1] * 1024}]}
)


ONE_QUEUE = {"EDGESERVE_DEVICE": "cpu", "EDGESERVE_CORES": "2"}
"""On any host as on CI's 2 cores: one inference process on the CPU, so one queue of QUEUE_ROWS
(a 16-core host ran eight, whose queues held a whole burst)."""


async def _burst(url: str) -> list[httpx.Response]:
    """OVER_THE_QUEUE requests of one row each, all sent at once (one connection each)."""
    limits = httpx.Limits(max_connections=OVER_THE_QUEUE)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client:
        send = [
            client.post("/v2/models/slow/infer", content=BODY_1024) for _ in range(OVER_THE_QUEUE)
        ]
        return await asyncio.gather(*send)


def _refused_once_read(url: str) -> int:
    """Requests refused after their bodies were read: the failures the queue counts."""
    stats = httpx.get(f"{url}/v2/models/slow/stats").json()["model_stats"][0]
    return int(stats["inference_stats"]["fail"]["count"])


@pytest.mark.parametrize("workers", ["1", "2"], ids=["one-process", "fronts"])
def test_a_burst_far_over_the_queue_is_refused_at_the_door_bodies_unread(
    tmp_path: Path, workers: str
) -> None:
    """Requests arriving together at an empty queue all walked through the door (it counted
    only rows already queued), read and decoded their bodies, and all but a queue's worth were
    refused then: 503s that cost the work the door is there to save, counted as failed requests
    (192 of a burst of 200; with fronts, 188 of 200). Now each one let in holds its row until it
    queues, on the board where every front and inference process sees it; the others wait in
    line, bodies unread, and are let in or refused there. The model takes far longer than the
    door's wait for a burst's rows on any CPU (at least 0.1 s a row), so some are refused."""
    source = write_function(tmp_path / "fn", lambda path: slow_model(path, depth=20), QUEUED)
    with running(source, "--workers", workers, env=ONE_QUEUE) as (url, _):
        answers = asyncio.run(_burst(url))
        refused_once_read = _refused_once_read(url)
    statuses = Counter(answer.status_code for answer in answers)
    assert set(statuses) == {200, 503} and statuses[200] >= QUEUE_ROWS, statuses
    assert all(answer.headers["Retry-After"] for answer in answers if answer.status_code == 503)
    assert refused_once_read == 0


def test_bursts_at_a_queue_that_drains_fast_let_no_front_past_the_door(tmp_path: Path) -> None:
    """Two ways past the door across fronts, both found by bursts like these (45 of 100 and
    up to 14 of 100 refused once read): an inference process counted a grant of its door only
    a turn after the wait had ended, so the WAITs that ran in that turn all walked in; and a
    front took the queue's last rows while grants for them were still on their way to other
    fronts, or at the same instant as another front or an inference process's door. With a
    model that frees rows as fast as they come, the door opens and shuts many times a burst:
    none gets in without a row."""
    source = write_function(tmp_path / "fn", lambda path: slow_model(path, depth=4), QUEUED)
    with running(source, "--workers", "2", env=ONE_QUEUE) as (url, _):
        for _ in range(3):
            statuses = Counter(answer.status_code for answer in asyncio.run(_burst(url)))
            assert set(statuses) <= {200, 503} and statuses[200] >= QUEUE_ROWS, statuses
        assert _refused_once_read(url) == 0


def test_requests_that_end_unqueued_give_their_place_at_the_door_back(tmp_path: Path) -> None:
    """With fronts, a request let in holds a place that every process counts until its body
    queues: one that never queues (a body that is not JSON) gives it back as it ends, or a
    queue's worth of them in one front would keep the door shut for every front."""
    source = write_function(tmp_path / "fn", lambda path: slow_model(path, depth=1), QUEUED)
    with running(source, "--workers", "2", env={"EDGESERVE_DEVICE": "cpu"}) as (url, _):
        infer = f"{url}/v2/models/slow/infer"
        for _ in range(3 * QUEUE_ROWS):  # new connections: both fronts get some
            assert httpx.post(infer, content=b"{no json").status_code == 400
        answers = [httpx.post(infer, content=BODY_1024, timeout=30) for _ in range(4)]
    assert [answer.status_code for answer in answers] == [200] * 4, answers[-1].text
