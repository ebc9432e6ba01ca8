"""`deploy --target jetson` of a function serving gRPC too: real sshd "devices" on 127.0.0.1
(test_jetson_deploy.py's fleet), the `process` service. The supervisor starts every release
with the function's gRPC port; a second deploy switches gRPC clients to the new release, and
the health check and `status` keep reading HTTP."""

from __future__ import annotations

import threading
import time
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
import tritonclient.grpc as triton
from tritonclient.utils import InferenceServerException

from edgeserve.builder import build
from edgeserve.scaffold import init_function
from edgeserve.targets.jetson import JetsonDriver
from tests import test_jetson_deploy as deploy_tests
from tests.sshd import sshd_missing
from tests.test_jetson_deploy import POLL_LIMIT_S, free_port, served_version, url

pytestmark = [
    pytest.mark.skipif(sshd_missing() is not None, reason=str(sshd_missing())),
    pytest.mark.slow,
]

fleet, driver, make_profile = deploy_tests.fleet, deploy_tests.driver, deploy_tests.make_profile


SETTLE_S = 5.0
"""How long the release switched away from may still take new gRPC connections: its SIGTERM's
way to its event loop, which closes the port at once."""


SHUTDOWN_RACE = "failed: [StatusCode.CANCELLED] CANCELLED"
"""What a call gets when it reached the old release's connection in the instant its gRPC server
began to shut down: gRPC's core kills calls that arrived but that the application had not yet
asked for (Server::ShutdownAndNotify), as it does under Triton's server; one in CI's runs of
this test (a poll every 20 ms across the switch). Any other failure, or two, fails the test."""


def grpc_version(address: str) -> str:
    with closing(triton.InferenceServerClient(address)) as client:
        version: str = client.get_model_metadata("mlp").versions[0]
        return version


def settled_version(address: str, wanted: str) -> str:
    """The version a new gRPC connection reaches once the switch has settled: until the release
    switched away from has taken its SIGTERM, it still listens on the shared port (SO_REUSEPORT)
    and answers what reaches it (it drains; nothing is lost), so a connection made in that
    window may land on it."""
    deadline = time.monotonic() + SETTLE_S
    version = grpc_version(address)
    while version != wanted and time.monotonic() < deadline:
        time.sleep(0.05)
        version = grpc_version(address)
    return version


class GrpcPoller(threading.Thread):
    """One gRPC channel asking for the model's version until told to stop: what a client
    holding a connection sees across a switch."""

    def __init__(self, address: str) -> None:
        super().__init__(daemon=True)
        self.client = triton.InferenceServerClient(address)
        self.answers: list[str] = []
        self.stopped = threading.Event()

    def run(self) -> None:
        deadline = time.monotonic() + POLL_LIMIT_S
        while not self.stopped.is_set() and time.monotonic() < deadline:
            try:
                self.answers.append(self.client.get_model_metadata("mlp").versions[0])
            except InferenceServerException as exc:
                self.answers.append(f"failed: {exc}")
            time.sleep(0.02)

    def stop(self) -> list[str]:
        self.stopped.set()
        self.join(timeout=15)
        self.client.close()
        return self.answers


def test_the_function_grpc_port_is_served_and_switched_with_the_release(
    driver: JetsonDriver, make_profile: Any, tmp_path: Path
) -> None:
    grpc_port = free_port()
    source = init_function(tmp_path / "src", name="mlp")
    manifest = source / "function.toml"
    text = manifest.read_text() + f"\n[resources]\ngrpc_port = {grpc_port}\n"
    bundles = []
    for version in "12":
        manifest.write_text(text.replace('version = "1"', f'version = "{version}"', 1))
        out = tmp_path / f"v{version}"
        bundles.append(build(source, out, targets=("jetson",), backend="onnxruntime"))
    profile = make_profile(["dev1"])
    address = f"127.0.0.1:{grpc_port}"
    driver.deploy(bundles[0], profile)
    assert grpc_version(address) == "1"
    poller = GrpcPoller(address)
    poller.start()
    driver.deploy(bundles[1], profile)
    time.sleep(0.5)
    answers = poller.stop()
    assert answers[0] == "1" and answers[-1] == "2", answers
    assert settled_version(address, "2") == "2"
    status = driver.status("mlp", profile)["dev1"]
    assert (status["version"], status["health"]) == ("2", "ready")
    assert served_version(url(profile, "dev1")) == "2"
    driver.rollback("mlp", profile)  # the live release's gRPC port read back from the device
    assert settled_version(address, "1") == "1"
    failed = [answer for answer in answers if answer not in ("1", "2")]
    assert failed in ([], [SHUTDOWN_RACE]), failed
