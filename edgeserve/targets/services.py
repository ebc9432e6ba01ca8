"""How a release runs on a device: systemd, docker or a supervised process, and its health check.

Each service manager makes the release `current` names live (`restart`) or stops it; the
commands they send are built by pure functions (`render_unit`, `docker_run_argv`) so tests can
compare them whole. The health check runs on the device itself (a few lines of the device's
python3 against 127.0.0.1), so it works the same for a Jetson across the network, behind NAT
or a firewall that only lets ssh through, as for the loopback test device.
"""

from __future__ import annotations

import json
import re
import string
import time
from dataclasses import dataclass
from importlib import resources
from typing import Protocol

from edgeserve.errors import ConfigError, DeployError
from edgeserve.targets.releases import Layout
from edgeserve.targets.ssh import Remote

HEALTH_SCRIPT = """\
import sys, time, urllib.request
url, deadline, error = sys.argv[1], time.monotonic() + float(sys.argv[2]), "no answer"
while True:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            sys.stdout.write(response.read().decode())
            sys.exit(0)
    except Exception as exc:
        error = str(exc)
    if time.monotonic() > deadline:
        sys.exit(f"GET {url}: {error}")
    time.sleep(0.2)
"""
"""GET a URL on the device until it answers 2xx or the deadline passes; print the body."""

STATE_SCRIPT = 'pid=$(cat "$2" 2>/dev/null) && kill -0 "$pid" 2>/dev/null && cat "$1" || true'
START_SCRIPT = (
    'cd "$1" && mkdir -p run && shift && '
    '{ setsid "$@" >>run/service.log 2>&1 </dev/null & }; echo $!'
)
"""Start detached (its own session, no tty, stdio in the log) and print the pid."""
PROBE_SCRIPT = 'kill -0 "$2" 2>/dev/null || { echo dead; exit 0; }; cat "$1" 2>/dev/null || true'
POLL_S = 0.3


@dataclass(frozen=True)
class ServiceSpec:
    """Everything a service manager needs to run one function on one device."""

    target: str
    layout: Layout
    bind: str
    port: int
    python: str
    user: str
    memory_mb: int
    start_timeout_s: float
    image: str | None = None

    @property
    def unit(self) -> str:
        return f"edgeserve-{self.layout.function}"

    @property
    def local_url(self) -> str:
        """The function's address as seen from the device itself."""
        host = "127.0.0.1" if self.bind in ("0.0.0.0", "127.0.0.1", "::") else self.bind  # noqa: S104
        return f"http://{host}:{self.port}"


class Service(Protocol):
    def restart(self, remote: Remote, spec: ServiceSpec) -> None: ...

    def stop(self, remote: Remote, spec: ServiceSpec) -> None: ...


def fetch(remote: Remote, spec: ServiceSpec, path: str, timeout_s: float) -> str:
    """GET `path` of the function from the device; DeployError if no 2xx within `timeout_s`."""
    return remote.run(["python3", "-c", HEALTH_SCRIPT, spec.local_url + path, str(timeout_s)])


class ProcessService:
    """`edgeserve.targets.supervisor` started detached; a restart is a SIGHUP hand-over."""

    def restart(self, remote: Remote, spec: ServiceSpec) -> None:
        before = self.state(remote, spec)
        if before is None:
            started = remote.sh(START_SCRIPT, spec.layout.fn_dir, *self._supervisor_argv(spec))
            pid, seen = started.strip(), None
        else:
            pid, seen = str(before["pid"]), before["generation"]
            remote.run(["kill", "-HUP", pid])
        after = self._await_generation(remote, spec, pid, seen)
        if after.get("error"):
            tail = self._log_tail(remote, spec)
            raise DeployError(f"host {remote.host}: {after['error']}\n{tail}")

    def stop(self, remote: Remote, spec: ServiceSpec) -> None:
        state = self.state(remote, spec)
        if state is not None:
            remote.run(["kill", "-TERM", str(state["pid"])])

    def state(self, remote: Remote, spec: ServiceSpec) -> dict[str, object] | None:
        """The running supervisor's state, or None when none runs."""
        paths = (spec.layout.run_file("state.json"), spec.layout.run_file("supervisor.pid"))
        text = remote.sh(STATE_SCRIPT, *paths)
        return json.loads(text) if text.strip() else None

    def _supervisor_argv(self, spec: ServiceSpec) -> list[str]:
        argv = ["env", f"EDGESERVE_ENGINE_CACHE={spec.layout.engines}", spec.python, "-m"]
        argv += ["edgeserve.targets.supervisor", "run", spec.layout.fn_dir, "--host", spec.bind]
        argv += ["--port", str(spec.port), "--start-timeout", str(spec.start_timeout_s)]
        return [*argv, "--python", spec.python]

    def _await_generation(
        self, remote: Remote, spec: ServiceSpec, pid: str, seen: object
    ) -> dict[str, object]:
        """The supervisor's state once it has tried the release (a new generation)."""
        deadline = time.monotonic() + spec.start_timeout_s + 10
        while time.monotonic() < deadline:
            text = remote.sh(PROBE_SCRIPT, spec.layout.run_file("state.json"), pid).strip()
            if text == "dead":
                raise DeployError(
                    f"host {remote.host}: the supervisor of {spec.layout.function} exited\n"
                    f"{self._log_tail(remote, spec)}"
                )
            state = json.loads(text) if text else None
            if state is not None and state["generation"] != seen:
                return state
            time.sleep(POLL_S)
        raise DeployError(
            f"host {remote.host}: the supervisor of {spec.layout.function} did not report the new "
            f"release within {spec.start_timeout_s} s; see {spec.layout.run_file('service.log')}"
        )

    def _log_tail(self, remote: Remote, spec: ServiceSpec) -> str:
        return remote.run(["tail", "-n", "20", spec.layout.run_file("service.log")])


class SystemdService:
    """A unit rendered from templates/systemd, installed into /etc/systemd/system."""

    def restart(self, remote: Remote, spec: ServiceSpec) -> None:
        staged = f"{spec.layout.fn_dir}/{spec.unit}.service"
        remote.write(staged, render_unit(spec).encode())
        sudo = [] if spec.user == "root" else ["sudo", "-n"]
        installed = f"/etc/systemd/system/{spec.unit}.service"
        remote.run([*sudo, "install", "-m", "0644", staged, installed])
        remote.run([*sudo, "systemctl", "daemon-reload"])
        remote.run([*sudo, "systemctl", "enable", "--quiet", f"{spec.unit}.service"])
        remote.run([*sudo, "systemctl", "restart", f"{spec.unit}.service"])

    def stop(self, remote: Remote, spec: ServiceSpec) -> None:
        sudo = [] if spec.user == "root" else ["sudo", "-n"]
        remote.run([*sudo, "systemctl", "stop", f"{spec.unit}.service"])


class DockerService:
    """`docker run --runtime nvidia` of an image that has edgeserve, with the release mounted."""

    def restart(self, remote: Remote, spec: ServiceSpec) -> None:
        release = remote.run(["readlink", "-f", spec.layout.current]).strip()
        remote.succeeds(["docker", "rm", "-f", spec.unit])
        remote.run(docker_run_argv(spec, release))

    def stop(self, remote: Remote, spec: ServiceSpec) -> None:
        remote.run(["docker", "stop", "-t", "40", spec.unit])


SERVICES: dict[str, Service] = {
    "process": ProcessService(),
    "systemd": SystemdService(),
    "docker": DockerService(),
}


def render_unit(spec: ServiceSpec) -> str:
    """The systemd unit of a function, as text (paths must not contain whitespace)."""
    fields = {
        "function": spec.layout.function,
        "target": spec.target,
        "user": spec.user,
        "fn_dir": spec.layout.fn_dir,
        "engines": spec.layout.engines,
        "python": spec.python,
        "host": spec.bind,
        "port": str(spec.port),
        "memory_mb": str(spec.memory_mb),
    }
    for name, value in fields.items():
        if not value or re.search(r"\s", value):
            raise ConfigError(
                f"systemd unit of {spec.layout.function}: {name} {value!r} is empty "
                "or contains whitespace"
            )
    template = resources.files("edgeserve") / "templates" / "systemd" / "edgeserve.service"
    return string.Template(template.read_text(encoding="utf-8")).substitute(fields)


def docker_run_argv(spec: ServiceSpec, release: str) -> list[str]:
    """The `docker run` of a release: host network, NVIDIA runtime, engine cache mounted."""
    if spec.image is None:
        raise ConfigError('service = "docker" needs `image` in the target profile\'s [settings]')
    cache = "/var/lib/edgeserve/engines"
    return [
        "docker", "run", "--detach", "--name", spec.unit, "--restart", "unless-stopped",
        "--runtime", "nvidia", "--network", "host",
        "--volume", f"{release}:/srv/function:ro", "--volume", f"{spec.layout.engines}:{cache}",
        "--env", f"EDGESERVE_ENGINE_CACHE={cache}", spec.image,
        "python3", "-m", "edgeserve", "serve", "/srv/function",
        "--host", spec.bind, "--port", str(spec.port),
    ]  # fmt: skip


def check_image_l4t(image: str, l4t: str | None) -> None:
    """An L4T image (`...:r36.4.0`) must match the device's L4T major, or CUDA will not load."""
    tag = re.search(r":r(\d+)\.", image)
    if tag is None or l4t is None:
        return
    if tag.group(1) != l4t.split(".")[0]:
        raise ConfigError(
            f"image {image} is built for L4T R{tag.group(1)} but the device runs L4T {l4t}; "
            f"Hint: use an image tagged r{l4t.split('.')[0]}.x"
        )
