"""The `systemd` and `docker` service managers for real, driven through the CLI.

systemd: a container whose PID 1 is systemd, reached over its own sshd. docker: podman's
docker-compatible CLI (a `docker` shim on the device's PATH) running an image with edgeserve.

The device (tests/systemd_device.py) is Debian bookworm with systemd, sshd and python3; the
deploy makes each release's venv there and pip-installs edgeserve and the bundle's pins from a
mounted wheelhouse (as an offline Jetson would from its mirror). A client polls the function
during every event and the gaps it saw are printed (run with -s) and written in docs/jetson.md.
"""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from edgeserve.bundle import Bundle
from edgeserve.cli import main
from tests import test_jetson_deploy as deploy_tests
from tests.sshd import DEVICE_PATH, sshd_missing, start_fleet
from tests.systemd_device import (
    DOCKER_SHIM,
    PIP_CONF,
    SystemdDevice,
    device_wheelhouse,
    serving_image,
    start_device,
    systemd_device_missing,
)
from tests.test_jetson_deploy import Poller, _profile_toml

pytestmark = [
    pytest.mark.skipif(systemd_device_missing() is not None, reason=str(systemd_device_missing())),
    pytest.mark.skipif(sshd_missing() is not None, reason=str(sshd_missing())),
    pytest.mark.slow,
]

bundles = deploy_tests.bundles
UNIT = "edgeserve-mlp.service"
RECOVER_S = 120.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture(scope="module")
def wheelhouse(bundles: dict[str, Bundle], tmp_path_factory: pytest.TempPathFactory) -> Path:
    requirements = bundles["1"].root / "requirements" / "jetson.txt"
    return device_wheelhouse(requirements, tmp_path_factory.mktemp("wheels"))


@pytest.fixture
def device(tmp_path: Path, wheelhouse: Path) -> Iterator[SystemdDevice]:
    (tmp_path / "pip.conf").write_text(PIP_CONF)
    mounts = {wheelhouse: "/wheels", tmp_path / "pip.conf": "/etc/pip.conf"}
    running = start_device(tmp_path / "device", free_port(), mounts)
    yield running
    running.stop()


class GapMeter(Poller):
    """The poller of tests/test_jetson_deploy.py, with the gaps it saw."""

    def await_answer(self, after: float) -> None:
        """Wait until an answer arrives later than `after` (the function is back)."""
        deadline = time.monotonic() + RECOVER_S
        while time.monotonic() < deadline:
            if any(t > after and v is not None for t, v in self.timed):
                return
            time.sleep(0.1)
        raise AssertionError(f"no answer within {RECOVER_S} s after the event")

    def longest_gap_s(self) -> float:
        """The longest stretch with no answer: from the last answer before a failure to the
        first answer after it."""
        gap, last_ok = 0.0, None
        for moment, version in self.timed:
            if version is not None:
                if last_ok is not None:
                    gap = max(gap, moment - last_ok)
                last_ok = moment
        failed = [t for t, v in self.timed if v is None]
        return gap if failed else 0.0

    @property
    def failures(self) -> int:
        return sum(1 for _, version in self.timed if version is None)


def _await_restart(device: SystemdDevice, old_pid: str) -> float:
    """Wait until systemd has restarted the unit once (a new main process); return when."""
    deadline = time.monotonic() + RECOVER_S
    while time.monotonic() < deadline:
        shown = device.exec("systemctl", "show", "-p", "NRestarts", "-p", "MainPID", UNIT)
        fields = dict(line.split("=", 1) for line in shown.split())
        if fields["NRestarts"] == "1" and fields["MainPID"] not in ("0", old_pid):
            return time.monotonic()
        time.sleep(0.2)
    raise AssertionError(f"systemd did not restart {UNIT} within {RECOVER_S} s")


def cli(capsys: Any, *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out + err


def test_systemd_deploys_restarts_a_crash_and_switches_with_no_gap(
    device: SystemdDevice, bundles: dict[str, Bundle], tmp_path: Path, capsys: Any
) -> None:
    port = free_port()
    settings = {
        "hosts": ["device"], "ssh_config": str(device.ssh_config), "service": "systemd",
        "install_root": "/opt/edgeserve", "port": port, "allow_arch": ["x86_64"],
        "min_free_mb": 0, "health_timeout_s": 120, "overrides": {},
    }  # fmt: skip
    target = tmp_path / "jetson.toml"
    target.write_text(_profile_toml(settings))
    base = f"http://127.0.0.1:{port}"
    # This container's systemd misses the cgroup's "empty" event of a killed supervisor's unit
    # and restarts it only once TimeoutStopSec has passed (docs/jetson.md): 5 s here, not 40.
    drop_in = f"/etc/systemd/system/{UNIT}.d"
    device.exec("sh", "-c", f"mkdir -p {drop_in} && printf '[Service]\\nTimeoutStopSec=5\\n' "
                f"> {drop_in}/test.conf")  # fmt: skip
    code, text = cli(capsys, "deploy", str(bundles["1"].root), "--target", str(target))
    assert code == 0, text
    assert "install" in text and deploy_tests.served_version(base) == "1"
    assert device.exec("systemctl", "is-active", UNIT).strip() == "active"
    assert device.exec("systemctl", "show", "-p", "TimeoutStopUSec", UNIT).strip().endswith("5s")
    gaps = {}

    with GapMeter(base) as meter:  # the supervisor (systemd's main process) is killed
        main_pid = device.exec("systemctl", "show", "-p", "MainPID", "--value", UNIT).strip()
        device.exec("kill", "-9", main_pid)
        restarted = _await_restart(device, main_pid)
        meter.await_answer(restarted)
    gaps["supervisor killed, systemd restarts the unit"] = meter.longest_gap_s()
    assert meter.failures > 0  # a cold start is not free (the reload below is)

    with GapMeter(base) as meter:  # systemctl restart: a cold start, what a switch used to be
        device.exec("systemctl", "restart", UNIT)  # returns once the old one has stopped
        meter.await_answer(time.monotonic())
    gaps["systemctl restart (cold; the switch before issue 14)"] = meter.longest_gap_s()

    with GapMeter(base) as meter:  # the switch: deploy 2 while the client polls
        code, text = cli(capsys, "deploy", str(bundles["2"].root), "--target", str(target))
        time.sleep(0.5)
    assert code == 0, text
    gaps["deploy 1 -> 2 (systemctl reload: hand-over)"] = meter.longest_gap_s()
    log = device.exec("tail", "-n", "30", "/opt/edgeserve/mlp/run/service.log")
    assert meter.failures == 0, ([a for a in meter.answers if a.startswith("failed")][:3], log)
    versions = [v for _, v in meter.timed]
    assert versions[0] == "1" and versions[-1] == "2" and set(versions) == {"1", "2"}

    code, text = cli(capsys, "status", "mlp", "--target", str(target))
    assert code == 0 and '"service": "running"' in text and '"health": "ready"' in text
    with capsys.disabled():  # the figures docs/jetson.md quotes (pytest -s shows them)
        for event, gap in gaps.items():
            print(f"gap: {event}: {gap:.2f} s")
    assert gaps["deploy 1 -> 2 (systemctl reload: hand-over)"] < 0.5
    code, text = cli(capsys, "stop", "mlp", "--target", str(target))
    assert code == 0, text
    assert device.exec("sh", "-c", f"systemctl is-active {UNIT} || true").strip() == "inactive"


@pytest.fixture
def docker_fleet(tmp_path: Path) -> Iterator[Any]:
    """A loopback sshd device whose `docker` is podman's docker-compatible CLI (a shim)."""
    shims = tmp_path / "shims"
    shims.mkdir()
    (shims / "docker").write_text(DOCKER_SHIM)
    (shims / "docker").chmod(0o755)
    running = start_fleet(tmp_path / "ssh", ["dev1"], path=f"{shims}:{DEVICE_PATH}")
    yield running
    running.stop()


def test_docker_deploys_switches_and_stops_through_a_docker_cli(
    docker_fleet: Any, wheelhouse: Path, bundles: dict[str, Bundle], tmp_path: Path, capsys: Any
) -> None:
    """The docker manager replaces the container on a switch: the gap is measured, not zero."""
    image = serving_image(wheelhouse, tmp_path)
    port = free_port()
    settings = {
        "hosts": ["dev1"], "ssh_config": str(docker_fleet.config), "service": "docker",
        "image": image, "docker_runtime": "runc", "python": deploy_tests.DEVICE_PYTHON,
        "install_root": str(tmp_path / "dev1"), "port": port, "allow_arch": ["x86_64"],
        "min_free_mb": 0, "health_timeout_s": 120, "overrides": {},
    }  # fmt: skip
    target = tmp_path / "jetson.toml"
    target.write_text(_profile_toml(settings))
    base = f"http://127.0.0.1:{port}"
    try:
        code, text = cli(capsys, "deploy", str(bundles["1"].root), "--target", str(target))
        assert code == 0, text
        assert deploy_tests.served_version(base) == "1"
        with GapMeter(base) as meter:
            code, text = cli(capsys, "deploy", str(bundles["2"].root), "--target", str(target))
            time.sleep(0.5)
        assert code == 0, text
        versions = [v for _, v in meter.timed if v is not None]
        assert versions[0] == "1" and versions[-1] == "2"
        with capsys.disabled():
            print(f"gap: docker, deploy 1 -> 2 (container replaced): {meter.longest_gap_s():.2f} s")
        code, text = cli(capsys, "status", "mlp", "--target", str(target))
        assert code == 0 and '"service": "running"' in text, text
    finally:
        code, text = cli(capsys, "stop", "mlp", "--target", str(target))
    assert code == 0, text
    code, text = cli(capsys, "status", "mlp", "--target", str(target))
    assert '"service": "exited"' in text or '"service": "stopped"' in text, text
    subprocess.run(["podman", "rm", "-f", "edgeserve-mlp"], capture_output=True)
