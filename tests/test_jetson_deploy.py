"""`deploy --target jetson` end to end: real sshd "devices" on 127.0.0.1, the `process` service.

The device python is this checkout's venv (the profile's `python` setting), so no release
installs packages; `allow_arch = ["x86_64"]` lets this machine stand in for an aarch64 Jetson.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnxruntime as ort
import pytest
from rich.console import Console

from edgeserve.builder import build
from edgeserve.bundle import Bundle
from edgeserve.errors import DeployError
from edgeserve.profiles import TargetProfile
from edgeserve.scaffold import init_function
from edgeserve.targets.jetson import JetsonDriver
from tests.sshd import SshFleet, sshd_missing, start_fleet

pytestmark = [
    pytest.mark.skipif(sshd_missing() is not None, reason=str(sshd_missing())),
    pytest.mark.slow,
]

DEVICE_PYTHON = str(Path(__file__).resolve().parents[1] / ".venv" / "bin" / "python")
POLL_LIMIT_S = 120.0
# Broken where it is served (a bundle keeps it in handler/), not at build time: `edgeserve build`
# imports the handler and would refuse a bundle whose handler does not import.
BROKEN_HANDLER = """\
from pathlib import Path

if Path(__file__).parent.name == "handler":
    raise RuntimeError("this handler is broken on purpose [/etc/model.conf]")
"""


def _build(source: Path, out: Path, version: str) -> Bundle:
    manifest = source / "function.toml"
    text = manifest.read_text()
    manifest.write_text(text.replace('version = "1"', f'version = "{version}"', 1))
    try:
        return build(source, out, targets=("jetson",), backend="onnxruntime")
    finally:
        manifest.write_text(text)


@pytest.fixture(scope="module")
def bundles(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Bundle]:
    root = tmp_path_factory.mktemp("bundles")
    source = init_function(root / "src", name="mlp")
    made = {version: _build(source, root / f"v{version}", version) for version in "123"}
    made["tensorrt"] = build(source, root / "trt", targets=("jetson",), backend="tensorrt")
    (source / "handler.py").write_text(BROKEN_HANDLER)
    made["broken"] = _build(source, root / "broken", "4")
    return made


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[SshFleet]:
    running = start_fleet(tmp_path / "ssh", ["dev1", "dev2"])
    yield running
    running.stop()


@pytest.fixture
def driver() -> JetsonDriver:
    return JetsonDriver(Console(file=io.StringIO(), width=120))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture
def make_profile(fleet: SshFleet, tmp_path: Path, driver: JetsonDriver) -> Iterator[Any]:
    """Profiles over the fleet, each host its own install root and port; stopped at the end."""
    made: list[TargetProfile] = []

    def make(hosts: list[str], **settings: Any) -> TargetProfile:
        overrides = {h: {"install_root": str(tmp_path / h), "port": free_port()} for h in hosts}
        values = {
            "hosts": hosts, "ssh_config": str(fleet.config), "service": "process",
            "python": DEVICE_PYTHON, "allow_arch": ["x86_64"], "health_timeout_s": 60,
            "min_free_mb": 0, "overrides": overrides, **settings,
        }  # fmt: skip
        made.append(TargetProfile("jetson", "jetson", "", values, tmp_path / "jetson.toml"))
        return made[-1]

    yield make
    for profile in made:
        with contextlib.suppress(DeployError):  # a profile never deployed: nothing to stop
            driver.stop("mlp", profile)
    _await_no_supervisors(tmp_path)


def _await_no_supervisors(tmp_path: Path) -> None:
    """The supervisors started here must be gone; any left is ended by its pid (and fails)."""
    deadline = time.monotonic() + 40
    pid_files = list(tmp_path.glob("dev*/mlp/run/supervisor.pid"))
    while pid_files and time.monotonic() < deadline:
        time.sleep(0.2)
        pid_files = [path for path in pid_files if path.exists()]
    for path in pid_files:
        os.kill(int(path.read_text()), signal.SIGKILL)
    assert not pid_files, f"supervisors still running: {pid_files}"


def url(profile: TargetProfile, host: str) -> str:
    return f"http://127.0.0.1:{profile.settings['overrides'][host]['port']}"


def served_version(base: str) -> str:
    response = httpx.get(f"{base}/v2/models/mlp", timeout=10)
    response.raise_for_status()
    version: str = response.json()["versions"][0]
    return version


class Poller:
    """A client asking for the model's version over fresh connections until told to stop."""

    def __init__(self, base: str) -> None:
        self.base, self.answers, self.stopped = base, [], threading.Event()
        self.timed: list[tuple[float, str | None]] = []
        """(time.monotonic(), version or None when the request failed), for measuring gaps."""
        self.thread = threading.Thread(target=self._poll, daemon=True)

    def __enter__(self) -> Poller:
        self.thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stopped.set()
        self.thread.join(timeout=15)

    def _poll(self) -> None:
        deadline = time.monotonic() + POLL_LIMIT_S
        while not self.stopped.is_set() and time.monotonic() < deadline:
            try:
                version: str | None = served_version(self.base)
                self.answers.append(str(version))
            except httpx.HTTPError as exc:
                version = None
                self.answers.append(f"failed: {exc!r}")
            self.timed.append((time.monotonic(), version))
            time.sleep(0.02)


def test_deploy_serves_then_switches_with_no_gap_then_rolls_back(
    driver: JetsonDriver, make_profile: Any, bundles: dict[str, Bundle], tmp_path: Path
) -> None:
    profile = make_profile(["dev1"])
    base = url(profile, "dev1")
    first = driver.deploy(bundles["1"], profile)
    assert (first.version, first.previous_version) == ("1", None)
    x = np.random.default_rng(0).normal(size=(2, 16)).astype(np.float32)
    body = {
        "inputs": [{"name": "x", "shape": [2, 16], "datatype": "FP32", "data": x.ravel().tolist()}]
    }
    answer = httpx.post(f"{base}/v2/models/mlp/infer", json=body, timeout=10).json()
    expected = ort.InferenceSession(str(bundles["1"].model_path)).run(None, {"x": x})[0]
    got = np.array(answer["outputs"][0]["data"], dtype=np.float32).reshape(expected.shape)
    # a Jetson bundle plans TensorRT and ONNX Runtime: on this x86 "device", ONNX Runtime
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)

    with Poller(base) as poller:
        second = driver.deploy(bundles["2"], profile)
        time.sleep(0.5)
    assert second.previous_version == first.details["hosts"]["dev1"]["release"]
    assert poller.answers[0] == "1" and poller.answers[-1] == "2"
    assert set(poller.answers) == {"1", "2"}, [a for a in poller.answers if a not in ("1", "2")]

    status = driver.status("mlp", profile)["dev1"]
    assert (status["version"], status["health"], status["serving"]) == ("2", "ready", ["2"])
    rolled = driver.rollback("mlp", profile)
    assert rolled.details["hosts"]["dev1"]["release"] == first.details["hosts"]["dev1"]["release"]
    assert served_version(base) == "1"
    current = tmp_path / "dev1" / "mlp" / "current"
    assert os.readlink(current) == f"releases/{first.details['hosts']['dev1']['release']}"


def test_a_release_failing_its_health_check_rolls_back_and_the_old_one_keeps_answering(
    driver: JetsonDriver, make_profile: Any, bundles: dict[str, Bundle], tmp_path: Path
) -> None:
    profile = make_profile(["dev1"])
    good = driver.deploy(bundles["1"], profile).details["hosts"]["dev1"]["release"]
    with Poller(url(profile, "dev1")) as poller, pytest.raises(DeployError) as caught:
        driver.deploy(bundles["broken"], profile)
    message = caught.value.message
    assert "exited with" in message and "broken on purpose" in message
    assert message.endswith(f"rolled back to {good}")
    assert poller.answers and set(poller.answers) == {"1"}
    assert os.readlink(tmp_path / "dev1" / "mlp" / "current") == f"releases/{good}"
    assert driver.status("mlp", profile)["dev1"]["health"] == "ready"


def test_a_fleet_deploys_canary_first_and_a_failing_canary_stops_the_rollout(
    driver: JetsonDriver, make_profile: Any, bundles: dict[str, Bundle], tmp_path: Path
) -> None:
    profile = make_profile(["dev1", "dev2"])
    result = driver.deploy(bundles["1"], profile)
    assert list(result.details["hosts"]) == ["dev1", "dev2"]
    assert [served_version(url(profile, host)) for host in ("dev1", "dev2")] == ["1", "1"]
    with pytest.raises(
        DeployError, match=r"canary dev1 failed, rollout stopped; not touched: \['dev2'\]"
    ):
        driver.deploy(bundles["broken"], profile)
    assert len(list((tmp_path / "dev2" / "mlp" / "releases").iterdir())) == 1
    assert [served_version(url(profile, host)) for host in ("dev1", "dev2")] == ["1", "1"]


def test_old_releases_are_pruned_to_keep_releases(
    driver: JetsonDriver, make_profile: Any, bundles: dict[str, Bundle], tmp_path: Path
) -> None:
    profile = make_profile(["dev1"], keep_releases=1)
    names = [driver.deploy(bundles[v], profile).details["hosts"]["dev1"]["release"] for v in "123"]
    kept = sorted(path.name for path in (tmp_path / "dev1" / "mlp" / "releases").iterdir())
    assert kept == sorted(names[1:])  # the newest, and the one before it for a rollback


def test_preflight_refuses_a_device_of_another_arch(
    driver: JetsonDriver, make_profile: Any, bundles: dict[str, Bundle], tmp_path: Path
) -> None:
    profile = make_profile(["dev1"], allow_arch=["aarch64"])
    with pytest.raises(DeployError, match=r"host dev1: preflight failed: arch x86_64 is not one"):
        driver.deploy(bundles["1"], profile)
    assert not (tmp_path / "dev1" / "mlp" / "releases").exists() or not any(
        (tmp_path / "dev1" / "mlp" / "releases").iterdir()
    )


def test_a_supervisor_that_cannot_bind_its_port_fails_fast_with_its_log(
    driver: JetsonDriver, make_profile: Any, bundles: dict[str, Bundle]
) -> None:
    profile = make_profile(["dev1"], health_timeout_s=600)
    port = profile.settings["overrides"]["dev1"]["port"]
    with socket.create_server(("0.0.0.0", port)):
        started = time.monotonic()
        with pytest.raises(DeployError) as caught:
            driver.deploy(bundles["1"], profile)
    assert time.monotonic() - started < 60  # not the 600 s health deadline
    message = caught.value.message
    assert "host dev1: the supervisor of mlp exited" in message
    assert "Address already in use" in message
    assert f"port {port} is held by pid {os.getpid()}: " in message  # no wait for a stranger
    assert message.endswith("(no previous release to go back to)")


def test_cli_deploys_a_source_folder_and_reports_status(
    make_profile: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from edgeserve.cli import main

    source = init_function(tmp_path / "fn", name="mlp")
    manifest = source / "function.toml"
    manifest.write_text(manifest.read_text().replace('prefer = ["tensorrt", ', "prefer = ["))
    profile = make_profile(["dev1", "dev2"])
    (tmp_path / "jetson.toml").write_text(_profile_toml(profile.settings))
    target = str(tmp_path / "jetson.toml")
    assert main(["deploy", str(source), "--target", target, "--host", "dev2"]) == 0
    assert "deployed mlp 1 to jetson at http://dev2:" in capsys.readouterr().out
    assert main(["status", str(source), "--target", target, "--host", "dev2"]) == 0
    assert '"health": "ready"' in capsys.readouterr().out
    assert not (tmp_path / "dev1" / "mlp").exists()
    assert main(["status", "mlp", "--target", target, "--host", "orin-9"]) == 2
    assert "unknown host(s) ['orin-9']" in capsys.readouterr().err


def _profile_toml(settings: dict[str, Any]) -> str:
    """A profile file with these settings (strings and lists of strings, numbers, one table)."""

    def value(item: Any) -> str:
        if isinstance(item, list):
            return "[" + ", ".join(value(part) for part in item) + "]"
        return json.dumps(item) if isinstance(item, str) else str(item)

    lines = ['driver = "jetson"', "[settings]"]
    lines += [f"{k} = {value(v)}" for k, v in settings.items() if k != "overrides"]
    for host, override in settings["overrides"].items():
        lines += [
            f"[settings.overrides.{host}]",
            *(f"{k} = {value(v)}" for k, v in override.items()),
        ]
    return "\n".join(lines) + "\n"


def test_the_engine_is_built_on_the_device_before_the_switch(
    driver: JetsonDriver, make_profile: Any, bundles: dict[str, Bundle], tmp_path: Path
) -> None:
    """This "device" has no TensorRT: the engine step fails there, visibly, before the switch."""
    profile = make_profile(["dev1"])
    good = driver.deploy(bundles["1"], profile).details["hosts"]["dev1"]["release"]
    with pytest.raises(DeployError) as caught:
        driver.deploy(bundles["tensorrt"], profile)
    message = caught.value.message
    engines = tmp_path / "dev1" / "engines"
    assert message.startswith(f"host dev1: `env EDGESERVE_ENGINE_CACHE={engines} {DEVICE_PYTHON} ")
    assert "-m edgeserve engine build " in message and "tensorrt" in message.split("failed")[-1]
    assert os.readlink(tmp_path / "dev1" / "mlp" / "current") == f"releases/{good}"
    assert served_version(url(profile, "dev1")) == "1"
