"""Real OpenSSH servers on 127.0.0.1 for deploy tests: the "devices" of the jetson driver.

Each server gets its own port and generated host key; the client gets one generated user key,
a known_hosts file pinned to those host keys (so host key checking stays on, as in production)
and an ssh config file with one `Host` alias per server. Clients use `ssh -F <config> <alias>`.
Everything lives under the test's tmp_path; `stop()` ends the servers this module started.

Needs the Debian packages openssh-server, openssh-client and rsync
(`apt-get install -y openssh-server openssh-client rsync`); without sshd the tests skip.
"""

from __future__ import annotations

import getpass
import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

SSHD = Path("/usr/sbin/sshd")
START_TIMEOUT_S = 10.0
DEVICE_PATH = "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin"

SSHD_CONFIG = """\
ListenAddress 127.0.0.1
Port {port}
HostKey {host_key}
PidFile {pid_file}
AuthorizedKeysFile {authorized_keys}
StrictModes no
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
PermitRootLogin prohibit-password
AllowUsers {user}
LogLevel ERROR
SetEnv PATH={path} HOME={home}
"""

CLIENT_HOST = """\
Host {alias}
    HostName 127.0.0.1
    Port {port}
    User {user}
    IdentityFile {identity}
    IdentitiesOnly yes
    UserKnownHostsFile {known_hosts}
    StrictHostKeyChecking yes
"""


def sshd_missing() -> str | None:
    """Why sshd cannot run here, or None when it can."""
    if not SSHD.exists():
        return "no /usr/sbin/sshd (apt-get install -y openssh-server openssh-client rsync)"
    if shutil.which("ssh") is None or shutil.which("ssh-keygen") is None:
        return "no ssh client (apt-get install -y openssh-client)"
    return None


@dataclass
class SshFleet:
    """Running sshd processes, one per alias, and the client config that reaches them."""

    root: Path
    config: Path
    ports: dict[str, int] = field(default_factory=dict)
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def stop(self) -> None:
        for process in self.processes:
            process.terminate()
        for process in self.processes:
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def start_fleet(root: Path, aliases: list[str], path: str = DEVICE_PATH) -> SshFleet:
    """Start one sshd per alias under `root`; the caller must `stop()` the fleet. `path` is
    the PATH of commands run on the devices (a test may put its own tools first)."""
    if os.geteuid() == 0:
        Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege separation directory
    user = getpass.getuser()
    root.mkdir(parents=True, exist_ok=True)
    identity = _keygen(root / "client_key")
    known_hosts = root / "known_hosts"
    fleet = SshFleet(root, root / "ssh_config")
    hosts, pinned = [], []
    try:
        for alias in aliases:
            port, host_key, process = _start_one(root / f"sshd-{alias}", user, identity, path)
            fleet.ports[alias], fleet.processes = port, [*fleet.processes, process]
            pinned.append(f"[127.0.0.1]:{port} {host_key.with_suffix('.pub').read_text().strip()}")
            hosts.append(CLIENT_HOST.format(alias=alias, port=port, user=user, identity=identity,
                                            known_hosts=known_hosts))  # fmt: skip
    except BaseException:
        fleet.stop()
        raise
    known_hosts.write_text("\n".join(pinned) + "\n")
    fleet.config.write_text("\n".join(hosts))
    return fleet


def _start_one(
    folder: Path, user: str, identity: Path, path: str
) -> tuple[int, Path, subprocess.Popen[bytes]]:
    folder.mkdir()
    host_key = _keygen(folder / "host_key")
    authorized = folder / "authorized_keys"
    authorized.write_text(identity.with_suffix(".pub").read_text())
    port = _free_port()
    config = folder / "sshd_config"
    home = folder / "home"  # a device's own: this machine's ~/.bashrc runs `pyenv init` (90 ms,
    home.mkdir()  # 100 processes) in every ssh command's bash, a Jetson's does not
    fields = {"port": port, "host_key": host_key, "pid_file": folder / "sshd.pid",
              "authorized_keys": authorized, "user": user, "path": path, "home": home}  # fmt: skip
    config.write_text(SSHD_CONFIG.format(**fields))
    with (folder / "sshd.log").open("wb") as log:
        argv = [str(SSHD), "-D", "-e", "-f", str(config)]
        process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=log)
    _await_banner(port, process, folder / "sshd.log")
    return port, host_key, process


def _keygen(path: Path) -> Path:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "edgeserve-test", "-f", str(path)],
        check=True,
        capture_output=True,
    )
    return path


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _await_banner(port: int, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"sshd exited with {process.returncode}: {log.read_text()}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
                if sock.recv(4).startswith(b"SSH-"):
                    return
        except OSError:
            time.sleep(0.05)
    process.kill()
    raise RuntimeError(f"sshd on port {port} not answering after {START_TIMEOUT_S} s")
