"""What a device is before anything is copied to it: arch, L4T/JetPack, disk, Python.

Facts come back from one fixed script as `key=value` lines and are parsed here (pure), so the
checks and their messages are tested without a device.
"""

from __future__ import annotations

from dataclasses import dataclass

from edgeserve.errors import DeployError
from edgeserve.hardware import jetpack_for, parse_l4t
from edgeserve.targets.jetson_settings import JetsonSettings
from edgeserve.targets.releases import resolve_root
from edgeserve.targets.ssh import Remote

FACTS_SCRIPT = """\
echo "arch=$(uname -m)"
echo "home=$HOME"
echo "user=$(id -un)"
echo "python3=$(command -v python3)"
echo "flock=$(command -v flock)"
echo "l4t=$(head -n 1 /etc/nv_tegra_release 2>/dev/null)"
"""

SPACE_SCRIPT = 'mkdir -p "$1/engines" "$2/releases" "$2/run" && df -Pk "$1"'


@dataclass(frozen=True)
class Device:
    """The facts of one device that a deploy depends on."""

    host: str
    arch: str
    user: str
    root: str
    python3: str
    l4t: str | None
    free_mb: int
    flock: str = "flock"

    @property
    def jetpack(self) -> str | None:
        return jetpack_for(self.l4t) if self.l4t else None

    def describe(self) -> str:
        l4t = f"L4T {self.l4t} (JetPack {self.jetpack or '?'})" if self.l4t else "no L4T"
        return f"{self.arch}, {l4t}, {self.free_mb} MB free, python3 {self.python3 or 'missing'}"


def parse_facts(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def parse_free_mb(df_output: str) -> int:
    """Available MB from `df -Pk` (POSIX format: the 4th column of the 2nd line, in KiB)."""
    lines = df_output.strip().splitlines()
    return int(lines[-1].split()[3]) // 1024


def inspect(remote: Remote, settings: JetsonSettings, install_root: str, function: str) -> Device:
    """Read the device's facts and prepare its install root (idempotent)."""
    facts = parse_facts(remote.sh(FACTS_SCRIPT))
    try:
        root = resolve_root(install_root, facts.get("home", ""))
    except ValueError as exc:
        raise DeployError(f"host {remote.host}: {exc}") from None
    space = remote.sh(SPACE_SCRIPT, root, f"{root}/{function}")
    return Device(
        host=remote.host,
        arch=facts.get("arch", "unknown"),
        user=facts.get("user", ""),
        root=root,
        python3=facts.get("python3", ""),
        l4t=parse_l4t(facts.get("l4t", "")),
        free_mb=parse_free_mb(space),
        flock=facts.get("flock", ""),
    )


def problems(device: Device, settings: JetsonSettings) -> list[str]:
    """Why this device cannot take a release; empty when it can."""
    found = []
    if device.arch not in settings.allow_arch:
        found.append(
            f"arch {device.arch} is not one of {list(settings.allow_arch)}; Hint: a Jetson is "
            f"aarch64 - for a development box set allow_arch = [{device.arch!r}] in the profile"
        )
    if device.free_mb < settings.min_free_mb:
        found.append(f"{device.free_mb} MB free under {device.root}, need {settings.min_free_mb}")
    if not device.python3:
        found.append("no python3 on PATH (the health check and the venv need it)")
    if not device.flock:
        found.append("no flock on PATH (the deploy lock needs it; it is in util-linux)")
    return found


def preflight(remote: Remote, settings: JetsonSettings, install_root: str, function: str) -> Device:
    """Inspect the device and refuse it with every reason at once."""
    device = inspect(remote, settings, install_root, function)
    found = problems(device, settings)
    if found:
        raise DeployError(f"host {remote.host}: preflight failed: " + "; ".join(found))
    return device
