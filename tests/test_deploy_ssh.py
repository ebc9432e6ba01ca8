"""The SSH command layer against a real OpenSSH server on 127.0.0.1 (tests/sshd.py)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from edgeserve.cli import main
from edgeserve.errors import DeployError
from edgeserve.targets.ssh import Remote
from tests.sshd import SshFleet, sshd_missing, start_fleet
from tests.stalling import stalling_server

pytestmark = pytest.mark.skipif(sshd_missing() is not None, reason=str(sshd_missing()))


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[SshFleet]:
    running = start_fleet(tmp_path / "ssh", ["dev1"])
    yield running
    running.stop()


@pytest.fixture
def remote(fleet: SshFleet) -> Iterator[Remote]:
    with Remote("dev1", config_file=fleet.config) as connected:
        yield connected


def test_arguments_reach_the_device_exactly_once_quoted(remote: Remote) -> None:
    tricky = ["a b", "$HOME", "it's", "; rm -rf /", "*"]
    assert remote.run(["printf", "%s\\n", *tricky]) == "\n".join(tricky) + "\n"


def test_sh_scripts_take_positional_arguments(remote: Remote) -> None:
    assert remote.sh('echo "$2-$1"', "one", "two words") == "two words-one\n"


def test_a_failed_command_names_host_command_and_stderr(remote: Remote) -> None:
    with pytest.raises(DeployError) as caught:
        remote.run(["sh", "-c", "echo disk full >&2; exit 3"])
    assert caught.value.message == (
        "host dev1: `sh -c 'echo disk full >&2; exit 3'` failed (exit 3): disk full"
    )
    assert remote.succeeds(["false"]) is False
    assert remote.succeeds(["true"]) is True


def test_an_unknown_host_key_is_refused(fleet: SshFleet) -> None:
    stranger = Remote("dev1", config_file=fleet.config, options=("UserKnownHostsFile=/dev/null",))
    with pytest.raises(DeployError, match=r"(?s)host dev1: ssh could not connect or authenticate: "
                       r".*Host key verification failed"):  # fmt: skip
        stranger.run(["true"])


def test_rsync_copy_sends_changes_and_hard_links_unchanged_files(
    remote: Remote, tmp_path: Path
) -> None:
    source = tmp_path / "bundle"
    (source / "model").mkdir(parents=True)
    (source / "model" / "model.onnx").write_bytes(b"weights" * 1000)
    (source / "handler.py").write_text("v = 1\n")
    assert remote.copy_tree(source, str(tmp_path / "releases" / "1")) == "rsync"
    stamp = (source / "handler.py").stat().st_mtime_ns
    (source / "handler.py").write_text("v = 2\n")  # same size and, as reproducible builds do,
    os.utime(source / "handler.py", ns=(stamp, stamp))  # the same mtime: only content differs
    first = tmp_path / "releases" / "1"
    remote.copy_tree(source, str(tmp_path / "releases" / "2"), str(first))
    second = tmp_path / "releases" / "2"
    assert (second / "handler.py").read_text() == "v = 2\n"
    assert (first / "handler.py").read_text() == "v = 1\n"
    assert (second / "model" / "model.onnx").stat().st_ino == (
        first / "model/model.onnx"
    ).stat().st_ino


def test_tar_copy_when_rsync_is_missing(remote: Remote, tmp_path: Path) -> None:
    source = tmp_path / "bundle"
    (source / "a").mkdir(parents=True)
    (source / "a" / "b.txt").write_text("hello")
    remote.has_rsync = False  # what the probe answers on a device without rsync
    assert remote.copy_tree(source, str(tmp_path / "dest")) == "tar"
    assert (tmp_path / "dest" / "a" / "b.txt").read_text() == "hello"


def test_a_device_that_greets_and_stalls_fails_in_bounded_time(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`edgeserve stop` against an sshd that sends its banner, then nothing more: ssh's
    ConnectTimeout covers the banner only, so the key exchange used to be waited for forever."""
    with stalling_server(b"SSH-2.0-OpenSSH_9.2\r\n") as port:
        config = tmp_path / "ssh_config"
        config.write_text(
            f"Host dev1\n  HostName 127.0.0.1\n  Port {port}\n  StrictHostKeyChecking yes\n"
            f"  UserKnownHostsFile {tmp_path / 'known_hosts'}\n"
        )
        profile = tmp_path / "jetson.toml"
        profile.write_text(
            f'driver = "jetson"\n[settings]\nhosts = ["dev1"]\nssh_config = "{config}"\n'
            "connect_timeout_s = 1\n"
        )
        started = time.monotonic()
        code = main(["stop", "fn", "--target", str(profile)])
    assert (code, time.monotonic() - started < 10) == (3, True)
    assert "host dev1: no SSH session within 3 s" in capsys.readouterr().err
