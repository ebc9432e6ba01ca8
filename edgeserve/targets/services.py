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
from pathlib import PurePosixPath
from typing import Any, Protocol

from edgeserve.errors import ConfigError, DeployError
from edgeserve.targets.releases import BUNDLE_DIR, CURRENT_SCRIPT, Layout, name_of
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

ALIVE = (
    'alive() { s=$(cat "/proc/$1/stat" 2>/dev/null) || return 1; '
    's=${s##*) }; [ "${s%% *}" != Z ]; }; '
)
"""`alive PID`: the process runs. Not `kill -0`, which a zombie passes: where the device's pid 1
is no init (a container's), an exited supervisor stayed a zombie for seconds, and a failed start
or a stop waited for the reaping (12 s)."""
STATE_SCRIPT = ALIVE + 'pid=$(cat "$2" 2>/dev/null) && alive "$pid" && cat "$1" || true'
START_SCRIPT = (
    'cd "$1" && mkdir -p run && shift && '
    '{ setsid "$@" >>run/service.log 2>&1 </dev/null & }; echo $!'
)
"""Start detached (its own session, no tty, stdio in the log) and print the pid."""
PROBE_SCRIPT = ALIVE + 'alive "$2" || { echo dead; exit 0; }; cat "$1" 2>/dev/null || true'
LIVENESS_SCRIPT = ALIVE + (
    'pid=$(cat "$1" 2>/dev/null) || { echo stopped; exit 0; }; '
    'alive "$pid" && echo running || echo "dead $pid"'
)
"""`running`, `stopped` (no pid file: stopped on purpose) or `dead PID` (killed, never stopped)."""
STOP_SCRIPT = ALIVE + (
    'kill -TERM "$1" && i=0 && while alive "$1" && [ $i -lt $(($2 * 10)) ]; '
    "do sleep 0.1; i=$((i + 1)); done"
)
"""SIGTERM the pid $1, then wait up to $2 s for it to exit."""
POLL_S = 0.3
DRAIN_S = 35.0
"""How long a supervisor may take to drain its release (supervisor.DRAIN_S)."""


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
    docker_runtime: str = "nvidia"
    grpc_port: int | None = None  # KServe v2 over gRPC beside HTTP; None: HTTP only

    def __post_init__(self) -> None:
        if self.grpc_port == self.port:
            raise ConfigError(
                f"{self.layout.function}: gRPC port {self.port} is the HTTP port too ([settings] "
                "port, else [resources] port). Hint: set [settings] grpc_port to another port"
            )

    @property
    def unit(self) -> str:
        return f"edgeserve-{self.layout.function}"

    @property
    def local_url(self) -> str:
        """The function's address as seen from the device itself."""
        host = "127.0.0.1" if self.bind in ("0.0.0.0", "127.0.0.1", "::") else self.bind  # noqa: S104
        return f"http://{host}:{self.port}"


class Service(Protocol):
    def restart(self, remote: Remote, spec: ServiceSpec) -> None:
        """Make the release `current` names live."""

    def stop(self, remote: Remote, spec: ServiceSpec) -> None: ...

    def state(self, remote: Remote, spec: ServiceSpec) -> str:
        """`running`, `stopped`, or why it is neither (shown by `status`)."""

    def live_release(self, remote: Remote, spec: ServiceSpec) -> str | None:
        """The release folder the running service serves (what a deploy verifies)."""


def fetch(remote: Remote, spec: ServiceSpec, path: str, timeout_s: float) -> str:
    """GET `path` of the function from the device; DeployError if no 2xx within `timeout_s`."""
    return remote.run(["python3", "-c", HEALTH_SCRIPT, spec.local_url + path, str(timeout_s)])


def supervisor_argv(spec: ServiceSpec) -> list[str]:
    """The supervisor of the function (edgeserve.targets.supervisor), whoever starts it."""
    argv = [spec.python, "-m", "edgeserve.targets.supervisor", "run", spec.layout.fn_dir]
    argv += ["--host", spec.bind, "--port", str(spec.port), *grpc_args(spec)]
    return [*argv, "--start-timeout", str(spec.start_timeout_s), "--python", spec.python]


def grpc_args(spec: ServiceSpec) -> list[str]:
    """`--grpc-port N` where the function serves gRPC (the supervisor and `serve` take it)."""
    return [] if spec.grpc_port is None else ["--grpc-port", str(spec.grpc_port)]


class Supervised:
    """What the `process` and `systemd` managers share: the supervisor, its state and its log.

    A switch is a SIGHUP to the running supervisor (no gap, see supervisor.py); the new
    generation in `run/state.json` says whether the new release took over."""

    def supervisor_state(self, remote: Remote, spec: ServiceSpec) -> dict[str, Any] | None:
        """The running supervisor's state, or None when none runs."""
        paths = (spec.layout.run_file("state.json"), spec.layout.run_file("supervisor.pid"))
        text = remote.sh(STATE_SCRIPT, *paths)
        return json.loads(text) if text.strip() else None

    def state(self, remote: Remote, spec: ServiceSpec) -> str:
        said = remote.sh(LIVENESS_SCRIPT, spec.layout.run_file("supervisor.pid")).strip()
        if said.startswith("dead"):
            return (
                f"dead: the supervisor (pid {said.split()[-1]}) was killed; "
                "the next deploy or rollback starts it again"
            )
        return said

    def live_release(self, remote: Remote, spec: ServiceSpec) -> str | None:
        state = self.supervisor_state(remote, spec)
        return str(state["release"]) if state and state.get("release") else None

    def await_generation(self, remote: Remote, spec: ServiceSpec, pid: str, seen: object) -> None:
        """Wait for the supervisor to try the release `current` names (a new generation);
        raise if it failed. It may first finish a start it had begun (a deploy interrupted
        mid-start, then reverted): that generation names another release and is passed over."""
        wanted = name_of(remote.sh(CURRENT_SCRIPT, spec.layout.current))
        deadline = time.monotonic() + 2 * spec.start_timeout_s + 10
        while time.monotonic() < deadline:
            text = remote.sh(PROBE_SCRIPT, spec.layout.run_file("state.json"), pid).strip()
            if text == "dead":
                raise DeployError(
                    f"host {remote.host}: the supervisor of {spec.layout.function} exited\n"
                    f"{self.log_tail(remote, spec)}"
                )
            state = json.loads(text) if text else None
            tried = state is not None and name_of(str(state.get("attempted", ""))) == wanted
            if state is not None and state["generation"] != seen and tried:
                if state.get("error"):
                    tail = self.log_tail(remote, spec)
                    raise DeployError(f"host {remote.host}: {state['error']}\n{tail}")
                return
            time.sleep(POLL_S)
        raise DeployError(
            f"host {remote.host}: the supervisor of {spec.layout.function} did not report the new "
            f"release within {spec.start_timeout_s} s; see {spec.layout.run_file('service.log')}"
        )

    def log_tail(self, remote: Remote, spec: ServiceSpec) -> str:
        return remote.run(["tail", "-n", "20", spec.layout.run_file("service.log")])


class ProcessService(Supervised):
    """The supervisor started detached over ssh (development boxes without systemd)."""

    def restart(self, remote: Remote, spec: ServiceSpec) -> None:
        before = self.supervisor_state(remote, spec)
        if before is None:
            argv = ["env", f"EDGESERVE_ENGINE_CACHE={spec.layout.engines}", *supervisor_argv(spec)]
            pid, seen = remote.sh(START_SCRIPT, spec.layout.fn_dir, *argv).strip(), None
        else:
            pid, seen = str(before["pid"]), before["generation"]
            remote.run(["kill", "-HUP", pid])
        self.await_generation(remote, spec, pid, seen)

    def stop(self, remote: Remote, spec: ServiceSpec) -> None:
        """SIGTERM the supervisor and wait until it has drained its release and exited."""
        state = self.supervisor_state(remote, spec)
        if state is not None:
            remote.sh(STOP_SCRIPT, str(state["pid"]), str(int(DRAIN_S + 5)))


class SystemdService(Supervised):
    """The supervisor as a systemd unit (templates/systemd): a switch is `systemctl reload`.

    systemd restarts the supervisor if it dies (Restart=always), and the supervisor restarts
    its release's process if that dies; a new unit file means one cold restart."""

    def restart(self, remote: Remote, spec: ServiceSpec) -> None:
        sudo = [] if spec.user == "root" else ["sudo", "-n"]
        unit = f"{spec.unit}.service"
        installed = f"/etc/systemd/system/{unit}"
        staged = f"{spec.layout.fn_dir}/{unit}"
        remote.write(staged, render_unit(spec).encode())
        changed = not remote.succeeds(["cmp", "-s", staged, installed])
        if changed:
            remote.run([*sudo, "install", "-m", "0644", staged, installed])
            remote.run([*sudo, "systemctl", "daemon-reload"])
            remote.run([*sudo, "systemctl", "enable", "--quiet", unit])
        before = self.supervisor_state(remote, spec)
        running = before is not None and remote.succeeds(["systemctl", "is-active", "-q", unit])
        verb = "reload" if running and not changed else "restart"
        remote.run([*sudo, "systemctl", verb, unit])
        pid = remote.run(["systemctl", "show", "-p", "MainPID", "--value", unit]).strip()
        seen = before["generation"] if verb == "reload" and before else None
        self.await_generation(remote, spec, pid, seen)

    def stop(self, remote: Remote, spec: ServiceSpec) -> None:
        sudo = [] if spec.user == "root" else ["sudo", "-n"]
        remote.run([*sudo, "systemctl", "stop", f"{spec.unit}.service"])

    def state(self, remote: Remote, spec: ServiceSpec) -> str:
        unit = f"{spec.unit}.service"
        said = remote.sh('systemctl is-active "$1" || true', unit).strip()
        return "running" if said == "active" else f"{said} (systemctl status {unit})"


class DockerService:
    """`docker run --runtime nvidia` of an image that has edgeserve, with the release mounted.

    A switch replaces the container, so the function is down while the new one loads."""

    def restart(self, remote: Remote, spec: ServiceSpec) -> None:
        release = remote.run(["readlink", "-f", f"{spec.layout.current}/{BUNDLE_DIR}"]).strip()
        remote.succeeds(["docker", "stop", "-t", "40", spec.unit])  # drains, as SIGTERM does
        remote.succeeds(["docker", "rm", "-f", spec.unit])
        remote.run(docker_run_argv(spec, release))

    def stop(self, remote: Remote, spec: ServiceSpec) -> None:
        remote.run(["docker", "stop", "-t", "40", spec.unit])

    def state(self, remote: Remote, spec: ServiceSpec) -> str:
        argv = ["docker", "inspect", "--format", "{{.State.Status}}", spec.unit]
        return remote.sh('"$@" 2>/dev/null || echo stopped', *argv).strip()

    def live_release(self, remote: Remote, spec: ServiceSpec) -> str | None:
        mount = '{{range .Mounts}}{{if eq .Destination "/srv/function"}}{{.Source}}{{end}}{{end}}'
        text = remote.sh(
            '"$@" 2>/dev/null || true', "docker", "inspect", "--format", mount, spec.unit
        )
        return str(PurePosixPath(text.strip()).parent) if text.strip() else None  # <release>/bundle


SERVICES: dict[str, Service] = {
    "process": ProcessService(),
    "systemd": SystemdService(),
    "docker": DockerService(),
}


def render_unit(spec: ServiceSpec) -> str:
    """The systemd unit of a function, as text (paths must not contain whitespace)."""
    command = supervisor_argv(spec)
    fields = {
        "function": spec.layout.function,
        "target": spec.target,
        "user": spec.user,
        "fn_dir": spec.layout.fn_dir,
        "engines": spec.layout.engines,
        "memory_mb": str(2 * spec.memory_mb),  # two releases overlap during a switch
        "python": spec.python,
        "host": spec.bind,
        "port": str(spec.port),
    }
    for name, value in fields.items():
        if not value or re.search(r"\s", value):
            raise ConfigError(
                f"systemd unit of {spec.layout.function}: {name} {value!r} is empty "
                "or contains whitespace"
            )
    template = resources.files("edgeserve") / "templates" / "systemd" / "edgeserve.service"
    text = string.Template(template.read_text(encoding="utf-8"))
    return text.substitute(fields, command=" ".join(command))


def docker_run_argv(spec: ServiceSpec, release: str) -> list[str]:
    """The `docker run` of a release: host network, NVIDIA runtime, engine cache mounted."""
    if spec.image is None:
        raise ConfigError('service = "docker" needs `image` in the target profile\'s [settings]')
    cache = "/var/lib/edgeserve/engines"
    return [
        "docker", "run", "--detach", "--name", spec.unit, "--restart", "unless-stopped",
        "--runtime", spec.docker_runtime, "--network", "host",
        "--volume", f"{release}:/srv/function:ro", "--volume", f"{spec.layout.engines}:{cache}",
        "--env", f"EDGESERVE_ENGINE_CACHE={cache}", spec.image,
        "python3", "-m", "edgeserve", "serve", "/srv/function",
        "--host", spec.bind, "--port", str(spec.port), *grpc_args(spec),
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
