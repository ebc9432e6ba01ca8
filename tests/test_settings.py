"""Triton's logging and trace extensions through the stock tritonclient (HTTP and gRPC) against
`edgeserve serve --grpc-port 0` on 127.0.0.1: log settings follow the `edgeserve` loggers,
trace settings say tracing is off, and what cannot be honoured is a 400 / INVALID_ARGUMENT
saying why. They answered 501 / UNIMPLEMENTED before.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path

import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from tritonclient.utils import InferenceServerException

from edgeserve.builder import build
from edgeserve.http import create_app
from edgeserve.runtime import Runtime
from tests.server import running
from tests.test_grpc import grpc_url, identity_function
from tests.threaded_server import serving

DEFAULTS = {
    "log_file": "",
    "log_info": True,
    "log_warning": True,
    "log_error": True,
    "log_verbose_level": 0,
    "log_format": "default",
}
Clients = tuple[triton_http.InferenceServerClient, triton_grpc.InferenceServerClient]
NO_TRACING = "edgeserve has no tracing, so only the settings of tracing off are accepted"


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return identity_function(tmp_path_factory)


@contextmanager
def clients_of(source: Path, *args: str) -> Iterator[Clients]:
    """tritonclient's HTTP and gRPC clients of `edgeserve serve SOURCE --grpc-port 0 ARGS`."""
    with running(source, "--grpc-port", "0", *args) as (http_url, server):
        http = triton_http.InferenceServerClient(http_url.removeprefix("http://"))
        with closing(http), closing(triton_grpc.InferenceServerClient(grpc_url(server))) as grpc:
            yield http, grpc


@pytest.fixture(scope="module")
def clients(source: Path) -> Iterator[Clients]:
    with clients_of(source) as both:
        yield both


def grpc_log_settings(client: triton_grpc.InferenceServerClient) -> dict[str, object]:
    settings = client.get_log_settings().settings
    return {
        key: getattr(value, value.WhichOneof("parameter_choice")) for key, value in settings.items()
    }


def test_log_settings_are_the_servers_own_over_both_protocols(clients: Clients) -> None:
    """A change over HTTP is what gRPC reads, and back: one set of loggers, not two answers.
    A kind turned on turns on the less detailed ones; one turned off, the more detailed."""
    http, grpc = clients
    assert http.get_log_settings() == DEFAULTS
    assert grpc_log_settings(grpc) == DEFAULTS
    debug = {**DEFAULTS, "log_verbose_level": 1}
    assert http.update_log_settings({"log_verbose_level": 1}) == debug
    assert grpc_log_settings(grpc) == debug
    errors_only = {**DEFAULTS, "log_info": False, "log_warning": False}
    grpc.update_log_settings({"log_warning": False})  # and so info and verbose: a threshold
    assert http.get_log_settings() == errors_only
    assert http.update_log_settings({"log_warning": True, "log_info": True}) == DEFAULTS


@pytest.mark.parametrize(
    ("settings", "words"),
    [
        ({"log_format": "iso8601"}, '`log_format`: expected one of "default", "ISO8601", got'),
        ({"log_file": "/tmp/x.log"}, '`log_file`: "/tmp/x.log" cannot be honoured'),
        ({"log_verbose_level": 2}, "expected 0 or 1 (edgeserve has one verbose level: DEBUG)"),
        (
            {"log_info": True, "log_warning": False},
            "a kind asked on below one asked off cannot be honoured",
        ),
        ({"log_info": "yes"}, '`log_info`: expected true or false, got "yes"'),
        ({"log_colour": True}, "`log_colour` is not a log setting; expected log_file"),
    ],
)
def test_log_settings_edgeserve_cannot_honour_are_refused(
    clients: Clients, settings: dict[str, object], words: str
) -> None:
    http, grpc = clients
    with pytest.raises(InferenceServerException) as error:
        http.update_log_settings(settings)
    assert error.value.status() == "400"
    assert words in str(error.value.message())
    if not isinstance(settings.get("log_info"), str):  # tritonclient.grpc refuses to send it
        with pytest.raises(InferenceServerException) as refused:
            grpc.update_log_settings(settings)
        assert refused.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert words in str(refused.value.message())
    assert http.get_log_settings() == DEFAULTS


def test_trace_settings_say_tracing_is_off(clients: Clients) -> None:
    http, grpc = clients
    off = {
        "trace_file": "",
        "trace_level": ["OFF"],
        "trace_rate": "1000",
        "trace_count": "-1",
        "log_frequency": "0",
    }  # Triton's defaults, which a client reading trace_rate finds as on Triton
    assert http.get_trace_settings() == off
    assert http.get_trace_settings(model_name="identity") == off
    assert http.update_trace_settings(settings={"trace_level": ["OFF"], "trace_rate": None}) == off
    assert http.update_trace_settings(settings={"trace_rate": "1000", "trace_count": "-1"}) == off
    settings = grpc.get_trace_settings().settings
    assert {key: list(settings[key].value) for key in settings} == {
        key: value if isinstance(value, list) else [value] for key, value in off.items()
    }
    grpc.update_trace_settings(settings={"trace_rate": "1000"})  # as it is: accepted
    for model in ("", "identity"):
        with pytest.raises(InferenceServerException) as error:
            http.update_trace_settings(model or None, {"trace_level": ["TIMESTAMPS"]})
        assert error.value.status() == "400"
        assert NO_TRACING in str(error.value.message())
        with pytest.raises(InferenceServerException) as refused:
            grpc.update_trace_settings(model or None, {"trace_rate": "1"})
        assert refused.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert NO_TRACING in str(refused.value.message())
        assert "/v2/models/stats, gRPC ModelStatistics) and /metrics" in refused.value.message()
    with pytest.raises(InferenceServerException) as unknown:
        http.get_trace_settings(model_name="nope")
    assert "Request for unknown model: 'nope' is not found" in str(unknown.value.message())


def test_a_log_setting_moves_the_edgeserve_loggers(source: Path, tmp_path: Path) -> None:
    """The change is the loggers' own: edgeserve's DEBUG lines are written from then on."""
    logger = logging.getLogger("edgeserve")
    try:
        with serving(create_app(Runtime.load(build(source, tmp_path / "bundle")))) as url:
            client = triton_http.InferenceServerClient(url.removeprefix("http://"))
            with closing(client):
                assert not logging.getLogger("edgeserve.http").isEnabledFor(logging.DEBUG)
                client.update_log_settings({"log_verbose_level": 1})
                assert logging.getLogger("edgeserve.http").isEnabledFor(logging.DEBUG)
                client.update_log_settings({"log_verbose_level": 0, "log_info": False})
                assert not logging.getLogger("edgeserve.batching").isEnabledFor(logging.INFO)
                assert logging.getLogger("edgeserve.batching").isEnabledFor(logging.WARNING)
    finally:
        logger.setLevel(logging.NOTSET)


STAMPED = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ (INFO|WARNING|ERROR|DEBUG):")


def test_log_format_iso8601_puts_the_utc_time_first_from_then_on(source: Path) -> None:
    """Asked over HTTP, read back over gRPC; the server's lines after it start with the time
    (the change's own note first), and "default" takes it off again."""
    with running(source, "--grpc-port", "0", "--log-level", "debug") as (url, server):
        http = triton_http.InferenceServerClient(url.removeprefix("http://"))
        with closing(http), closing(triton_grpc.InferenceServerClient(grpc_url(server))) as grpc:
            assert not any(STAMPED.match(line) for line in server.output)
            iso = {**DEFAULTS, "log_format": "ISO8601", "log_verbose_level": 1}
            assert http.update_log_settings({"log_format": "ISO8601"}) == iso
            assert grpc_log_settings(grpc) == iso
            stamped = _lines_from("level DEBUG, format ISO8601", server.output)
            assert all(STAMPED.match(line) for line in stamped), stamped
            grpc.update_log_settings({"log_format": "default"})
            assert http.get_log_settings()["log_format"] == "default"
            plain = _lines_from("level DEBUG, format default", server.output)
            assert not any(STAMPED.match(line) for line in plain), plain


def test_serve_log_format_stamps_every_process_from_the_start(source: Path) -> None:
    """--log-format ISO8601 with --workers 2: the supervisor's, each front's and each inference
    process's log lines (uvicorn's too) start with the time; the setting reads ISO8601. (The
    supervisor's `serving on` announcement is printed, not logged.)"""
    with running(source, "--workers", "2", "--log-format", "ISO8601") as (url, server):
        settings = triton_http.InferenceServerClient(url.removeprefix("http://"))
        with closing(settings):
            assert settings.get_log_settings()["log_format"] == "ISO8601"
        deadline = time.monotonic() + 10  # ready when one front is; the other may come later
        while "".join(server.output).count("Application startup complete") < 2:
            assert time.monotonic() < deadline, server.output
            time.sleep(0.02)
        unstamped = [line for line in server.output if re.match(r"(INFO|WARNING|ERROR):", line)]
        assert not unstamped
        stamped = [line for line in server.output if STAMPED.match(line)]
        assert sum("Application startup complete" in line for line in stamped) == 2  # fronts
        assert any("v2 ready on onnxruntime" in line for line in stamped)  # an inference process


def test_a_wrong_log_format_in_the_environment_is_refused_before_loading(source: Path) -> None:
    served = subprocess.run(
        [sys.executable, "-m", "edgeserve", "serve", str(source), "--port", "0"],
        env={**os.environ, "EDGESERVE_LOG_FORMAT": "json"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert served.returncode == 2
    assert "EDGESERVE_LOG_FORMAT=json: expected one of default, ISO8601" in served.stderr


def _lines_from(note: str, output: list[str]) -> list[str]:
    """The server's lines from the one that says `note` on (waited for, 10 s at most)."""
    deadline = time.monotonic() + 10
    while not any(note in line for line in output):
        assert time.monotonic() < deadline, f"not written in 10 s: {note!r} in {output}"
        time.sleep(0.02)
    return output[next(at for at, line in enumerate(output) if note in line) :]


def test_with_workers_a_log_change_is_refused_as_reaching_one_front(source: Path) -> None:
    with clients_of(source, "--workers", "2") as (http, grpc):
        assert http.get_log_settings() == DEFAULTS
        assert http.update_log_settings({"log_info": True}) == DEFAULTS  # no change: fine
        with pytest.raises(InferenceServerException) as error:
            http.update_log_settings({"log_verbose_level": 1})
        assert error.value.status() == "400"
        assert "with --workers, each of this server's 2 front processes" in str(
            error.value.message()
        )
        with pytest.raises(InferenceServerException) as refused:
            grpc.update_log_settings({"log_verbose_level": 1})
        assert "a change would reach this front alone" in refused.value.message()
        assert grpc_log_settings(grpc) == DEFAULTS
