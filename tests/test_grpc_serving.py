"""`serve --grpc-port` as a deployment runs it: the bearer token as metadata, mutual TLS, two
front processes on one port, SIGTERM's drain, and the error naming grpcio where it is missing.
"""

from __future__ import annotations

import math
import queue
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import closing, contextmanager, suppress
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as triton
from tritonclient.utils import InferenceServerException

from tests.models import identity_model, slow_model, write_function
from tests.server import Server, running
from tests.test_auth_tls import Pki
from tests.test_cli import _free_port, _run
from tests.test_drain import DRAIN_S, EXIT_MARGIN_S
from tests.test_drain import MANIFEST as DRAIN_MANIFEST
from tests.test_grpc import every_input, grpc_url, identity_function
from tests.test_tritonclient import MANIFEST, RUN_BY_ORT
from tests.test_v2_codec import SAMPLES
from tests.test_workers import fronts

DEADLINE_S = 0.3


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return identity_function(tmp_path_factory)


def test_auth_token_as_metadata(source: Path, tmp_path: Path) -> None:
    token = "t" * 24
    env = {"EDGESERVE_AUTH_TOKEN": token}
    with running(source, "--grpc-port", "0", env=env, client={"headers": {}}) as (_, server):
        client = triton.InferenceServerClient(grpc_url(server))
        try:
            assert client.is_server_ready()  # /v2/health/ready is an open path
            with pytest.raises(InferenceServerException) as refused_call:
                client.get_model_metadata("identity")
            assert refused_call.value.status() == "StatusCode.UNAUTHENTICATED"
            headers = {"authorization": f"Bearer {token}"}
            assert client.get_model_metadata("identity", headers=headers).name == "identity"
            answers: queue.Queue[object] = queue.Queue()
            client.start_stream(callback=lambda result, error: answers.put(error))
            with suppress(InferenceServerException):  # the stream may have closed already
                client.async_stream_infer("identity", every_input())
            assert "needs credentials" in str(answers.get(timeout=30))  # the stream refused
            client.stop_stream()
        finally:
            client.close()


def test_workers_share_one_grpc_port(source: Path) -> None:
    """Both fronts listen on the one port and the kernel spreads connections between them:
    clients, each on a connection of its own (gRPC shares one between channels to the same
    address unless told not to), reach both (up to 64 of them: the second front may start
    listening a moment after the first is ready)."""
    with running(source, "--grpc-port", "0", "--workers", "2") as (http_url, server):
        url = grpc_url(server)
        own = [("grpc.use_local_subchannel_pool", 1)]
        for _ in range(64):
            with closing(triton.InferenceServerClient(url, channel_args=own)) as client:
                result = client.infer("identity", every_input())
            np.testing.assert_array_equal(result.as_numpy("out_INT64"), SAMPLES["INT64"])
            answered = [count for count, _ in fronts(http_url).values()]
            if len(answered) == 2 and min(answered) > 0:
                break
    assert len(answered) == 2 and min(answered) > 0, answered


def test_missing_grpcio_is_named() -> None:
    """Without grpcio the error names the extra to install (hidden from a child process)."""
    code = (
        "import sys; sys.modules['grpc'] = None\n"
        "from edgeserve.grpc import check_installed\n"
        "try:\n    check_installed()\nexcept Exception as exc:\n    print(exc)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "gRPC (--grpc-port, or [resources] grpc_port) needs the grpcio" in done.stdout
    assert "pip install 'edgeserve[grpc]'" in done.stdout, done.stderr


@contextmanager
def slow_served(
    tmp_path: Path, workers: str
) -> Iterator[tuple[Server, triton.InferenceServerClient, list[triton.InferInput], float]]:
    """A slow model served over gRPC (one row at a time, about 0.3 s each), a client, the
    inputs of one call, and how long one call took."""
    slow = write_function(tmp_path / "fn", slow_model, DRAIN_MANIFEST)
    with (
        running(slow, "--grpc-port", "0", "--workers", workers) as (_, server),
        closing(triton.InferenceServerClient(grpc_url(server))) as client,
    ):
        x = triton.InferInput("x", [1, 1, 1024], "FP32")
        x.set_data_from_numpy(np.full((1, 1, 1024), 0.1, np.float32))
        client.infer("slow", [x])  # the first call connects: timed, it made batches look
        started = time.monotonic()  # slower than they run, and too few calls were queued
        client.infer("slow", [x])  # for some to outlast the drain (CI: all were answered)
        yield server, client, [x], time.monotonic() - started


@pytest.mark.parametrize("workers", ["1", "2"])
def test_sigterm_drains_grpc_calls_within_the_bound(tmp_path: Path, workers: str) -> None:
    """Calls queued behind a slow model (one row at a time, about 0.3 s each): those that run
    within the drain bound are answered, the rest UNAVAILABLE at the bound, saying so, and the
    process (with --workers 2, every process) exits right after, as for HTTP (test_drain.py)."""
    with slow_served(tmp_path, workers) as (server, client, x, batch_s):
        answers: queue.Queue[tuple[object, object]] = queue.Queue()
        count = min(100, math.ceil(3 * DRAIN_S / batch_s) + 2)
        for _ in range(count):
            client.async_infer("slow", x, lambda result, error: answers.put((result, error)))
        time.sleep(0.3)  # every call is in and queued
        started = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        got = [answers.get(timeout=DRAIN_S + 10) for _ in range(count)]
        server.process.wait(timeout=DRAIN_S + 10)
        exited_s = time.monotonic() - started
    errors = [error for _, error in got if error is not None]
    assert 0 < len(errors) < count
    for error in errors:
        assert error.status() == "StatusCode.UNAVAILABLE", error
        assert error.message().startswith("the server shut down before the request")
    assert DRAIN_S < exited_s < DRAIN_S + batch_s + EXIT_MARGIN_S, (exited_s, batch_s)
    assert "Traceback" not in "".join(server.output)


def test_mutual_tls_serves_grpc_too(source: Path, tmp_path: Path) -> None:
    """--ssl-* serve gRPC over TLS as well: a client certificate from the CA is needed."""
    pki = Pki(tmp_path)
    tls = pki.mutual_tls_args()
    verify = ssl.create_default_context(cafile=str(pki.ca_file))
    verify.load_cert_chain(*map(str, pki.client))
    with running(source, "--grpc-port", "0", *tls, client={"verify": verify}) as (_, server):
        url = grpc_url(server)
        client_cert, client_key = pki.client
        trusted = triton.InferenceServerClient(
            url,
            ssl=True,
            root_certificates=str(pki.ca_file),
            private_key=str(client_key),
            certificate_chain=str(client_cert),
        )
        anonymous = triton.InferenceServerClient(url, ssl=True, root_certificates=str(pki.ca_file))
        try:
            assert trusted.get_model_metadata("identity").name == "identity"
            with pytest.raises(InferenceServerException) as refused_call:
                anonymous.get_model_metadata("identity", client_timeout=10)
            assert refused_call.value.status() == "StatusCode.UNAVAILABLE"
        finally:
            trusted.close()
            anonymous.close()


def test_the_manifest_grpc_port_serves_grpc_without_the_flag(tmp_path: Path) -> None:
    """[resources] grpc_port = 0 serves gRPC on a free port, printed; no --grpc-port needed."""
    manifest = MANIFEST + "[resources]\ngrpc_port = 0\n"
    folder = write_function(
        tmp_path / "fn", lambda path: identity_model(path, RUN_BY_ORT), manifest
    )
    with (
        running(folder) as (_, server),
        closing(triton.InferenceServerClient(grpc_url(server))) as client,
    ):
        assert client.get_model_metadata("identity").name == "identity"


def test_grpc_on_the_http_port_is_refused_before_the_model_loads(source: Path) -> None:
    port = str(_free_port())
    done = _run("serve", str(source), "--port", port, "--grpc-port", port)
    assert done.returncode == 2
    assert f"gRPC port {port} is the HTTP port too (--port, else [resources] port)" in done.stderr
    assert "Hint: pass another --grpc-port (Triton's is 8001), or 0" in done.stderr
    assert "loaded identity" not in done.stderr + done.stdout


def test_a_manifest_grpc_port_equal_to_its_port_is_refused(tmp_path: Path) -> None:
    manifest = MANIFEST + "[resources]\nport = 8500\ngrpc_port = 8500\n"
    folder = write_function(
        tmp_path / "fn", lambda path: identity_model(path, RUN_BY_ORT), manifest
    )
    done = _run("serve", str(folder))
    assert done.returncode == 2
    assert "field `resources`: grpc_port 8500 is the HTTP port too (`port`)" in done.stderr


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_client_deadline_bounds_its_call_and_drops_its_item(tmp_path: Path, workers: str) -> None:
    """tritonclient's `client_timeout` (a gRPC deadline) on a call queued behind a slow model:
    DEADLINE_EXCEEDED once it passes, and its item dropped before it runs (gRPC cancels the
    call, which withdraws it from the batcher, in the inference process too), as Triton drops
    a request whose timeout passed in its queue."""
    with slow_served(tmp_path, workers) as (_, client, x, batch_s):
        answers: queue.Queue[object] = queue.Queue()
        count = min(100, math.ceil(3 * DEADLINE_S / batch_s) + 2)
        for _ in range(count):
            client.async_infer("slow", x, lambda result, error: answers.put(error))
        started = time.monotonic()
        with pytest.raises(InferenceServerException) as late:
            client.infer("slow", x, client_timeout=DEADLINE_S)
        assert late.value.status() == "StatusCode.DEADLINE_EXCEEDED"
        assert time.monotonic() - started < DEADLINE_S + 0.5
        assert [answers.get(timeout=60) for _ in range(count)] == [None] * count
        stats = client.get_inference_statistics("slow", as_json=True)["model_stats"][0]
    assert int(stats["execution_count"]) == 2 + count  # slow_served's two; the late one never ran
    assert int(stats["inference_stats"]["fail"]["count"]) == 1
