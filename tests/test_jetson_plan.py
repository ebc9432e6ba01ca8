"""The pure parts of the jetson driver: release layout, preflight, service commands, settings."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from edgeserve.errors import ConfigError, DeployError
from edgeserve.targets import releases as rel
from edgeserve.targets.fleet import rollout
from edgeserve.targets.jetson_settings import JetsonSettings
from edgeserve.targets.preflight import Device, parse_facts, parse_free_mb, problems
from edgeserve.targets.services import (
    LIVENESS_SCRIPT,
    ServiceSpec,
    check_image_l4t,
    docker_run_argv,
    render_unit,
)
from edgeserve.targets.ssh import host_key_problem

LAYOUT = rel.Layout("/home/nvidia/edgeserve", "ocr")


def spec(**changes: object) -> ServiceSpec:
    fields: dict[str, object] = {
        "target": "jetson",
        "layout": LAYOUT,
        "bind": "0.0.0.0",
        "port": 8080,
        "python": sys.executable,
        "user": "root",
        "memory_mb": 2048,
        "start_timeout_s": 300.0,
        "image": "nvcr.io/nvidia/l4t-jetpack:r36.4.0",
    }
    return ServiceSpec(**{**fields, **changes})  # type: ignore[arg-type]


def test_layout_paths() -> None:
    assert (LAYOUT.fn_dir, LAYOUT.releases, LAYOUT.current, LAYOUT.engines) == (
        "/home/nvidia/edgeserve/ocr",
        "/home/nvidia/edgeserve/ocr/releases",
        "/home/nvidia/edgeserve/ocr/current",
        "/home/nvidia/edgeserve/engines",
    )
    assert LAYOUT.run_file("state.json") == "/home/nvidia/edgeserve/ocr/run/state.json"


@pytest.mark.parametrize(
    ("version", "expected"),
    [
        ("1.2.0", "1.2.0-0123456789ab"),
        ("2024/06 rc", "2024_06_rc-0123456789ab"),
        ("", "0-0123456789ab"),
    ],
)
def test_release_name_is_version_and_hash12(version: str, expected: str) -> None:
    assert rel.release_name(version, "0123456789abcdef" * 4) == expected


def test_name_of_reads_readlink_output() -> None:
    assert rel.name_of("releases/1-abc\n") == "1-abc"
    assert rel.name_of("/opt/es/ocr/releases/2-def/") == "2-def"
    assert rel.name_of("\n") is None


def test_the_live_record_drops_what_is_gone_and_starts_from_a_legacy_current() -> None:
    assert rel.lines("3-c\n\n1-a\n.tmp\n") == ["3-c", "1-a"]
    assert rel.live_history(["1-a", "2-b", "3-c"], "3-c", ["3-c", "1-a"]) == ["1-a", "3-c"]
    assert rel.live_history([], "2-b", ["1-a", "2-b"]) == ["2-b"]
    assert rel.live_history([], None, ["1-a"]) == []


def test_rollback_goes_below_current_and_pops_it() -> None:
    """The issue's sequence: 1.0.2 failed (never recorded); rollback twice never reaches it."""
    history = rel.went_live(rel.went_live([], "1.0.0"), "1.0.1")
    assert rel.went_live(history, "1.0.1") == ["1.0.0", "1.0.1"]
    target, below = rel.rollback_target(history, "1.0.1")
    assert (target, below) == ("1.0.0", ["1.0.0"])
    again = rel.went_live(below, "1.0.1")
    assert rel.rollback_target(again, "1.0.1") == ("1.0.0", ["1.0.0"])
    assert rel.rollback_target(["1.0.0"], "1.0.0") == (None, ["1.0.0"])
    assert rel.rollback_target(["a", "b", "a"], "a") == ("b", ["a", "b"])


def test_pruning_keeps_current_the_rollback_target_and_the_newest_live() -> None:
    history = ["1-a", "2-b", "3-c", "4-d"]
    assert rel.keep_set(history, 1, "4-d") == {"4-d", "3-c"}
    assert rel.keep_set(history, 3, "4-d") == {"4-d", "3-c", "2-b"}
    existing = ["1-a", "2-b", "3-c", "4-d", "5-failed"]
    assert rel.prunable(existing, {"4-d", "3-c"}) == ["1-a", "2-b", "5-failed"]


def test_resolve_root_expands_tilde_and_refuses_relative() -> None:
    assert rel.resolve_root("~/edgeserve", "/home/nvidia") == "/home/nvidia/edgeserve"
    assert rel.resolve_root("/opt/edgeserve/", "/root") == "/opt/edgeserve"
    with pytest.raises(ValueError, match="absolute"):
        rel.resolve_root("edgeserve", "/root")


def test_facts_and_df_are_parsed() -> None:
    facts = parse_facts("arch=aarch64\nhome=/home/nvidia\nl4t=# R36 (release), REVISION: 4.3\n")
    assert facts == {
        "arch": "aarch64",
        "home": "/home/nvidia",
        "l4t": "# R36 (release), REVISION: 4.3",
    }
    df = (
        "Filesystem 1024-blocks Used Available Capacity Mounted on\n"
        "/dev/nvme0n1p1 59000000 1 2097152 1% /\n"
    )
    assert parse_free_mb(df) == 2048


def test_preflight_problems_name_every_reason() -> None:
    settings = JetsonSettings(hosts=("dev",), min_free_mb=1000)
    device = Device("dev", "x86_64", "me", "/r", python3="", l4t=None, free_mb=10)
    found = problems(device, settings)
    assert len(found) == 3
    assert "arch x86_64 is not one of ['aarch64']" in found[0] and "allow_arch" in found[0]
    assert "10 MB free under /r, need 1000" in found[1]
    assert "no python3" in found[2]
    orin = Device("orin", "aarch64", "nvidia", "/r", "/usr/bin/python3", "36.4.3", 5000)
    assert problems(orin, settings) == []
    assert orin.jetpack == "6.2"


def test_systemd_unit_runs_the_supervisor_and_reloads_it_to_switch() -> None:
    unit = render_unit(spec())
    python = sys.executable
    assert (
        f"ExecStart={python} -m edgeserve.targets.supervisor run /home/nvidia/edgeserve/ocr "
        f"--host 0.0.0.0 --port 8080 --start-timeout 300.0 --python {python}\n" in unit
    )
    assert "ExecReload=/bin/kill -HUP $MAINPID\n" in unit and "KillMode=mixed\n" in unit
    assert "Environment=EDGESERVE_ENGINE_CACHE=/home/nvidia/edgeserve/engines" in unit
    assert "MemoryMax=4096M" in unit and "Restart=always" in unit
    assert unit.count("$") == 1


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_systemd_unit_passes_systemd_analyze_verify(tmp_path) -> None:
    layout = rel.Layout(str(tmp_path), "ocr")
    unit = tmp_path / "edgeserve-ocr.service"
    unit.write_text(render_unit(spec(layout=layout)))
    checked = subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stderr


def test_systemd_unit_refuses_whitespace_in_paths() -> None:
    with pytest.raises(ConfigError, match="python '/opt/my venv/python'"):
        render_unit(spec(python="/opt/my venv/python"))


def test_docker_run_uses_nvidia_runtime_host_network_and_engine_cache() -> None:
    argv = docker_run_argv(spec(), "/home/nvidia/edgeserve/ocr/releases/1-abc")
    assert argv == [
        "docker", "run", "--detach", "--name", "edgeserve-ocr", "--restart", "unless-stopped",
        "--runtime", "nvidia", "--network", "host",
        "--volume", "/home/nvidia/edgeserve/ocr/releases/1-abc:/srv/function:ro",
        "--volume", "/home/nvidia/edgeserve/engines:/var/lib/edgeserve/engines",
        "--env", "EDGESERVE_ENGINE_CACHE=/var/lib/edgeserve/engines",
        "nvcr.io/nvidia/l4t-jetpack:r36.4.0",
        "python3", "-m", "edgeserve", "serve", "/srv/function",
        "--host", "0.0.0.0", "--port", "8080",
    ]  # fmt: skip


def test_a_function_serving_grpc_starts_with_its_grpc_port() -> None:
    """The unit's supervisor and docker's `serve` both carry the gRPC port; the health check
    stays on HTTP (`local_url`)."""
    grpc = spec(grpc_port=8001)
    python = sys.executable
    assert (
        f"--host 0.0.0.0 --port 8080 --grpc-port 8001 --start-timeout 300.0 --python {python}\n"
        in render_unit(grpc)
    )
    assert docker_run_argv(grpc, "/r")[-6:] == [
        "--host", "0.0.0.0", "--port", "8080", "--grpc-port", "8001",
    ]  # fmt: skip
    assert grpc.local_url == "http://127.0.0.1:8080"
    with pytest.raises(ConfigError, match=r"ocr: gRPC port 8080 is the HTTP port too"):
        spec(grpc_port=8080)


def test_l4t_image_must_match_the_device_major() -> None:
    check_image_l4t("nvcr.io/nvidia/l4t-jetpack:r36.4.0", "36.4.3")
    with pytest.raises(ConfigError, match=r"built for L4T R35 but the device runs L4T 36\.4\.3"):
        check_image_l4t("nvcr.io/nvidia/l4t-jetpack:r35.4.1", "36.4.3")


@pytest.mark.parametrize(
    ("effective", "refused"),
    [
        ("stricthostkeychecking false\nuserknownhostsfile ~/.ssh/known_hosts", True),
        ("stricthostkeychecking accept-new\nuserknownhostsfile /dev/null", True),
        ("stricthostkeychecking accept-new\nuserknownhostsfile /dev/null /dev/null", True),
        ("stricthostkeychecking accept-new\nuserknownhostsfile ~/.ssh/known_hosts", False),
        ("stricthostkeychecking true\nuserknownhostsfile /dev/null", False),
        ("stricthostkeychecking ask\nuserknownhostsfile ~/.ssh/known_hosts", False),
    ],
)
def test_host_key_problem_reads_what_ssh_G_prints(effective: str, refused: bool) -> None:
    """`ssh -G` output (lowercase keys, canonical values); spellings are tested through ssh."""
    assert (host_key_problem(effective) is not None) is refused


def test_settings_select_hosts_and_groups_in_profile_order() -> None:
    settings = JetsonSettings(hosts=("a", "b", "c"), groups={"lab": ("c", "a")})
    assert settings.select(()) == ("a", "b", "c")
    assert settings.select(("lab",)) == ("a", "c")
    assert settings.select(("b",)) == ("b",)
    with pytest.raises(ValueError, match=r"unknown host\(s\) \['z'\]"):
        settings.select(("z",))


def test_rollout_stops_at_a_failing_canary() -> None:
    settings = JetsonSettings(hosts=("a", "b", "c"))
    touched: list[str] = []

    def each(host: str) -> str:
        touched.append(host)
        if host == "a":
            raise DeployError("host a: health check failed")
        return host

    with pytest.raises(
        DeployError, match=r"canary a failed, rollout stopped; not touched: \['b', 'c'\]"
    ):
        rollout(settings.hosts, settings.max_parallel, True, each)
    assert touched == ["a"]


def test_rollout_reports_every_failed_host_after_the_canary() -> None:
    settings = JetsonSettings(hosts=("a", "b", "c"), max_parallel=2)

    def each(host: str) -> str:
        if host != "a":
            raise DeployError(f"host {host}: down")
        return host

    with pytest.raises(DeployError) as caught:
        rollout(settings.hosts, settings.max_parallel, True, each)
    assert caught.value.message == (
        "2 of 3 hosts failed; a (canary) succeeded and stays on the new release:\n"
        "b: host b: down\nc: host c: down"
    )


def test_a_supervisor_that_exited_is_dead_to_the_device_scripts_while_still_a_zombie(
    tmp_path: Path,
) -> None:
    """Where the device's pid 1 reaps late (a container's), an exited supervisor stays a zombie
    for seconds; `kill -0` passes on it, so a failed start and a stop waited for the reaping."""
    exited = subprocess.Popen(["true"])  # not waited for: a zombie of this process
    time.sleep(0.2)
    assert Path(f"/proc/{exited.pid}/stat").read_text().rsplit(") ", 1)[1][0] == "Z"
    pid_file = tmp_path / "supervisor.pid"
    for pid, said in ((exited.pid, f"dead {exited.pid}"), (os.getpid(), "running")):
        pid_file.write_text(str(pid))
        shown = subprocess.run(["sh", "-c", LIVENESS_SCRIPT, "sh", str(pid_file)], check=True,
                               capture_output=True, text=True)  # fmt: skip
        assert shown.stdout.strip() == said
    exited.wait()
