"""The jetson target driven as users drive it: the `edgeserve` CLI against real sshd "devices".

Each test replays a defect found that way (issue 14) with the served endpoint polled during
every switch: rollback never picks a release that failed, a killed supervisor leaves no orphan,
errors print as plain text, host key checking cannot be turned off, a profile file is used as
given, a fleet's status survives an offline host, one deploy at a time per device, and a partial
fleet says who stays on the new release. Fixtures come from tests/test_jetson_deploy.py.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from edgeserve.bundle import Bundle
from edgeserve.cli import main
from edgeserve.scaffold import init_function
from tests import test_jetson_deploy as deploy_tests
from tests.sshd import SshFleet
from tests.test_jetson_deploy import Poller, _profile_toml, served_version

# the fixtures of tests/test_jetson_deploy.py: sshd devices, bundles, profiles stopped at the end
bundles, driver = deploy_tests.bundles, deploy_tests.driver
fleet, make_profile = deploy_tests.fleet, deploy_tests.make_profile

pytestmark = pytest.mark.slow


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """Run `edgeserve ARGV` in this process: exit code, stdout, stderr."""
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def succeeds(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """Run `edgeserve ARGV`, which must exit 0 (else its stderr says why): its stdout."""
    code, out, err = cli(capsys, *argv)
    assert code == 0, err
    return out


def profile_file(profile: Any, path: Path, **changes: Any) -> str:
    path.write_text(_profile_toml({**profile.settings, **changes}))
    return str(path)


def test_rollback_only_ever_goes_to_releases_that_went_live(
    make_profile: Any, bundles: dict[str, Bundle], tmp_path: Path, capsys: Any
) -> None:
    """The issue's sequence, on a two-host fleet: 1, 2, broken (fails), rollback, 2, rollback."""
    target = profile_file(make_profile(["dev1", "dev2"]), tmp_path / "jetson.toml")
    deploy = ("deploy", "--target", target)
    succeeds(capsys, deploy[0], str(bundles["1"].root), *deploy[1:])
    with Poller(f"http://127.0.0.1:{_port(target, 'dev1')}") as poller:
        succeeds(capsys, deploy[0], str(bundles["2"].root), *deploy[1:])
        code, _, err = cli(capsys, deploy[0], str(bundles["broken"].root), *deploy[1:])
        assert code == 3 and "broken on purpose [/etc/model.conf]" in err  # printed as is
        assert "canary dev1 failed, rollout stopped; not touched: ['dev2']" in err
        succeeds(capsys, "rollback", "mlp", "--target", target)
        succeeds(capsys, deploy[0], str(bundles["2"].root), *deploy[1:])
        code, out, err = cli(capsys, "rollback", "mlp", "--target", target)
        assert code == 0, err
        assert "rolled back mlp on jetson to" in out
    for host in ("dev1", "dev2"):
        assert served_version(f"http://127.0.0.1:{_port(target, host)}") == "1"
        releases = sorted(p.name for p in (tmp_path / host / "mlp" / "releases").iterdir())
        assert [name.split("-")[0] for name in releases] == ["1", "2"]  # the broken one is gone
        assert (tmp_path / host / "mlp" / "live").read_text().split() == [releases[0]]
    code, _, err = cli(capsys, "rollback", "mlp", "--target", target)
    assert code == 3 and "no live release before 1-" in err
    assert poller.answers and set(poller.answers) <= {"1", "2"}, poller.answers[-5:]


def _port(target: str, host: str) -> int:
    import tomllib

    settings = tomllib.loads(Path(target).read_text())["settings"]
    port: int = settings["overrides"][host]["port"]
    return port


def test_a_killed_supervisor_leaves_no_orphan_and_the_next_deploy_recovers(
    make_profile: Any, bundles: dict[str, Bundle], tmp_path: Path, capsys: Any
) -> None:
    target = profile_file(make_profile(["dev1"]), tmp_path / "jetson.toml")
    succeeds(capsys, "deploy", str(bundles["1"].root), "--target", target)
    run = tmp_path / "dev1" / "mlp" / "run"
    supervisor = int((run / "supervisor.pid").read_text())
    child = json.loads((run / "state.json").read_text())["child"]
    os.kill(supervisor, signal.SIGKILL)
    assert _gone(child, within_s=15), f"child {child} outlived its supervisor"
    code, out, _ = cli(capsys, "status", "mlp", "--target", target)
    report = json.loads(out)["dev1"]
    assert code == 0 and report["health"].startswith("down")
    assert report["service"].startswith(f"dead: the supervisor (pid {supervisor}) was killed")
    code, out, err = cli(capsys, "deploy", str(bundles["2"].root), "--target", target)
    assert code == 0, err
    assert served_version(f"http://127.0.0.1:{_port(target, 'dev1')}") == "2"


def _gone(pid: int, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


SPELLINGS = [
    ["StrictHostKeyChecking=no"],
    ["StrictHostKeyChecking=off"],
    ["stricthostkeychecking=FALSE"],
    ["StrictHostKeyChecking no"],
    ["StrictHostKeyChecking = Off"],
    ['StrictHostKeyChecking="no"'],
    ["StrictHostKeyChecking=accept-new", "UserKnownHostsFile=/dev/null"],
]


def test_every_spelling_that_turns_host_key_checking_off_is_refused(
    make_profile: Any, fleet: SshFleet, bundles: dict[str, Bundle], tmp_path: Path, capsys: Any
) -> None:
    """The device's key changed: every spelling OpenSSH accepts for "don't check" is refused."""
    stranger = tmp_path / "stranger"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(stranger)], check=True)
    known = fleet.root / "known_hosts"
    pinned = known.read_text()
    known.write_text(
        f"[127.0.0.1]:{fleet.ports['dev1']} {stranger.with_suffix('.pub').read_text()}"
    )
    bundle, profile = str(bundles["1"].root), make_profile(["dev1"])
    for options in SPELLINGS:
        target = profile_file(profile, tmp_path / "j.toml", ssh_options=options)
        code, _, err = cli(capsys, "deploy", bundle, "--target", target)
        assert code == 2 and "host key checking is turned off" in err, (options, err)
    config = fleet.config.read_text()
    fleet.config.write_text(
        config.replace("StrictHostKeyChecking yes", "StrictHostKeyChecking off")
    )
    target = profile_file(profile, tmp_path / "j.toml")  # the ssh config file now says "off"
    code, _, err = cli(capsys, "deploy", bundle, "--target", target)
    assert code == 2 and "StrictHostKeyChecking is off" in err, err
    fleet.config.write_text(config)
    code, _, err = cli(capsys, "deploy", bundle, "--target", target)
    assert code == 3 and "Host key verification failed" in err
    assert not (tmp_path / "dev1" / "mlp" / "current").exists()
    known.write_text(pinned)


def test_a_profile_file_is_used_as_given_and_a_fleet_status_reports_every_host(
    make_profile: Any, fleet: SshFleet, tmp_path: Path, capsys: Any
) -> None:
    source = init_function(tmp_path / "fn", name="mlp")
    manifest = source / "function.toml"
    manifest.write_text(manifest.read_text().replace('prefer = ["tensorrt", ', "prefer = ["))
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        dead_port = closed.getsockname()[1]
    fleet.config.write_text(
        fleet.config.read_text() + f"\nHost dead\n    HostName 127.0.0.1\n    Port {dead_port}\n"
    )
    profile = make_profile(["dev1"])
    (tmp_path / "lab").mkdir()
    target = profile_file(profile, tmp_path / "lab" / "orin-lab.toml")
    code, out, err = cli(capsys, "deploy", str(source), "--target", target)
    assert code == 0, err
    assert "deployed mlp 1 to orin-lab at http://dev1:" in out
    text = Path(target).read_text().replace('hosts = ["dev1"]', 'hosts = ["dev1", "dead"]')
    Path(target).write_text(text)
    code, out, err = cli(capsys, "status", str(source), "--target", target)
    report = json.loads(out)
    assert code == 3 and "no status from dead" in err
    assert report["dev1"]["health"] == "ready" and report["dev1"]["service"] == "running"
    assert "host dead: ssh could not connect" in report["dead"]["error"]


def test_concurrent_deploys_to_one_device_run_one_at_a_time(
    make_profile: Any, bundles: dict[str, Bundle], tmp_path: Path, capsys: Any
) -> None:
    """Two users deploy 2 and 3 at once: one waits for the other, both really run, in order."""
    target = profile_file(make_profile(["dev1"]), tmp_path / "jetson.toml")
    succeeds(capsys, "deploy", str(bundles["1"].root), "--target", target)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    base = f"http://127.0.0.1:{_port(target, 'dev1')}"
    with Poller(base) as poller:
        runs = {
            version: subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "edgeserve",
                    "deploy",
                    str(bundles[version].root),
                    "--target",
                    target,
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                env=env,
            )
            for version in "23"
        }
        outputs = {version: run.communicate(timeout=300)[0] for version, run in runs.items()}
        time.sleep(0.5)
    assert all(run.returncode == 0 for run in runs.values()), outputs
    waits = {v: _lock_wait(text) for v, text in outputs.items()}
    first, last = sorted(waits, key=lambda v: waits[v])
    # the second waited for the first, which starts a server: never under half a second
    assert waits[first] < 0.5 <= waits[last], waits
    assert served_version(base) == last
    assert not [a for a in poller.answers if a not in ("1", "2", "3")]
    assert first in poller.answers  # the first one went live too, before the second
    lock = ["flock", str(tmp_path / "dev1" / "deploy.lock"), "sleep", "30"]
    with subprocess.Popen(lock, start_new_session=True) as held:
        time.sleep(0.5)
        impatient = profile_file(make_profile(["dev1"], lock_timeout_s=0), tmp_path / "j0.toml")
        code, _, err = cli(capsys, "deploy", str(bundles["1"].root), "--target", impatient)
        os.killpg(held.pid, signal.SIGKILL)  # `sleep` holds the lock too: the stop at teardown
    assert code == 3 and "another deploy holds" in err and "deploy.lock" in err


def _lock_wait(output: str) -> float:
    found = re.search(r"dev1: lock\s.*?waited\s(\d+\.\d)s", output, re.DOTALL)
    assert found, output
    return float(found.group(1))


def test_a_partial_fleet_counts_every_host_says_who_stays_new_and_stop_stops(
    make_profile: Any, bundles: dict[str, Bundle], tmp_path: Path, capsys: Any
) -> None:
    profile = make_profile(["dev1", "dev2"])
    target = profile_file(profile, tmp_path / "jetson.toml")
    with socket.create_server(("0.0.0.0", _port(target, "dev2"))):  # dev2's port is taken
        code, _, err = cli(capsys, "deploy", str(bundles["1"].root), "--target", target)
    assert code == 3
    assert "1 of 2 hosts failed; dev1 (canary) succeeded and stays on the new release:" in err
    assert "dev2: host dev2: the supervisor of mlp exited" in err
    base = f"http://127.0.0.1:{_port(target, 'dev1')}"
    assert served_version(base) == "1"
    code, out, err = cli(capsys, "stop", "mlp", "--target", target, "--host", "dev1")
    assert code == 0 and "stopped mlp on jetson" in out, err
    code, out, _ = cli(capsys, "status", "mlp", "--target", target, "--host", "dev1")
    assert json.loads(out)["dev1"]["service"] == "stopped"
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", _port(target, "dev1")), timeout=5).close()


SLOW_HANDLER = """\
import time
from pathlib import Path

if Path(__file__).parent.name == "handler":  # slow where it is served: the health step waits
    time.sleep(8)
"""


def test_ctrl_c_during_the_switch_goes_back_to_the_previous_release(
    make_profile: Any, bundles: dict[str, Bundle], tmp_path: Path, capsys: Any
) -> None:
    """SIGINT once `current` points at a release still starting: the CLI puts release 1 back
    and exits 130 saying so (it used to exit 130 silently, `current` left on the new one)."""
    target = profile_file(make_profile(["dev1"]), tmp_path / "jetson.toml")
    succeeds(capsys, "deploy", str(bundles["1"].root), "--target", target)
    source = init_function(tmp_path / "src", name="mlp")
    (source / "handler.py").write_text(SLOW_HANDLER)
    slow = deploy_tests._build(source, tmp_path / "slow", "9")
    current = tmp_path / "dev1" / "mlp" / "current"
    deploying = subprocess.Popen(
        [sys.executable, "-m", "edgeserve", "deploy", str(slow.root), "--target", target],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        # a Ctrl-C reaches it as at a terminal, even where the suite runs in the background
        # (a shell's background job ignores SIGINT, and so would the CLI it starts)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while not os.readlink(current).startswith("releases/9-") and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(1.0)  # into restart / health
    deploying.send_signal(signal.SIGINT)
    _, err = deploying.communicate(timeout=120)

    assert deploying.returncode == 130, err
    assert re.search(r"host dev1: interrupted while switching to 9-\w+\s+rolled back to 1-", err)
    assert os.readlink(current).startswith("releases/1-")
    assert served_version(f"http://127.0.0.1:{_port(target, 'dev1')}") == "1"
    code, out, _ = cli(capsys, "status", "mlp", "--target", target)
    assert (code, json.loads(out)["dev1"]["version"]) == (0, "1")


def test_rollback_and_stop_where_nothing_was_deployed_say_so(
    make_profile: Any, tmp_path: Path, capsys: Any
) -> None:
    """They said "no live release before None" and "stopped" (exit 0) for a device that never
    had the function."""
    target = profile_file(make_profile(["dev1"]), tmp_path / "jetson.toml")
    code, _, err = cli(capsys, "rollback", "mlp", "--target", target)
    assert code == 3
    assert "error: host dev1: mlp is not deployed here; nothing to roll back" in err
    code, _, err = cli(capsys, "stop", "mlp", "--target", target)
    assert code == 3
    assert "mlp is not deployed on ['dev1'] (jetson); nothing to stop" in err


def test_a_lock_whose_owner_cannot_be_written_says_why(
    make_profile: Any, tmp_path: Path, capsys: Any
) -> None:
    """A device whose disk is full took the lock and could not write its owner; that was
    reported as "another deploy holds the lock" (here the owner's path is a folder instead)."""
    target = profile_file(make_profile(["dev1"], lock_timeout_s=0), tmp_path / "jetson.toml")
    (tmp_path / "dev1" / "deploy.lock.owner").mkdir(parents=True)
    code, _, err = cli(capsys, "rollback", "mlp", "--target", target)
    assert code == 3
    assert "another deploy holds" not in err
    said = " ".join(err.split())
    assert "but cannot write" in said and "deploy.lock.owner: Is a directory)" in said
