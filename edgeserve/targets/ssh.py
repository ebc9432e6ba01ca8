"""The SSH command layer: run argument lists on a device and copy trees to it.

Every remote command is an argument list joined with `shlex.join`, so the remote shell sees
each argument exactly once and quoted. Host keys are checked the way the user's ssh does
(their ~/.ssh/config, keys and known_hosts, or the profile's `ssh_config`), and a configuration
that turns the check off is refused before connecting: `ssh -G` prints the options OpenSSH
itself would use for the host (every spelling, `-o` and config files, Include and Match, all
resolved), so the check reads OpenSSH's answer instead of guessing its parser. `BatchMode=yes`
makes a missing key or an unknown host fail at once instead of waiting for a password prompt
nobody will answer. Every wait is bounded: the handshake by 3 x connect_timeout_s, an open
connection by ServerAliveInterval (connect_timeout_s) x 3 unanswered probes, a command by
`timeout_s`. A failed command becomes a `DeployError`
naming the host, the command and its stderr: the one place `ssh`, `rsync` and `tar` failures
are translated.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from types import TracebackType

from edgeserve.errors import ConfigError, DeployError

SSH_UNREACHABLE = 255
"""ssh's own exit status when it cannot connect or authenticate."""
NO_KNOWN_HOSTS = "/dev/null"
HANDSHAKE_FACTOR = 3
"""Connecting and authenticating may take this many times connect_timeout_s."""
SERVER_ALIVE_COUNT = 3


def host_key_problem(effective: str) -> str | None:
    """Why the options `ssh -G` printed let a device's host key go unchecked, or None.

    `stricthostkeychecking false` (no, off, false in any case or form) accepts any key; with
    known hosts kept in /dev/null, `accept-new` accepts any key too, since none is remembered.
    """
    options: dict[str, str] = {}
    for line in effective.splitlines():
        key, _, value = line.partition(" ")
        options.setdefault(key.lower(), value.strip())
    checking = options.get("stricthostkeychecking", "ask").lower()
    files = options.get("userknownhostsfile", "").split()
    if checking == "false":
        return "StrictHostKeyChecking is off (no, off and false all turn it off)"
    if checking == "accept-new" and files and set(files) == {NO_KNOWN_HOSTS}:
        return "StrictHostKeyChecking=accept-new with UserKnownHostsFile=/dev/null accepts any key"
    return None


@dataclass
class Remote:
    """One device as ssh sees it: a host (or ~/.ssh/config alias) and how to reach it.

    Used as a context manager it keeps one multiplexed connection open (ControlMaster), so the
    dozen commands of a deploy pay for one ssh handshake instead of one each.
    """

    host: str
    user: str | None = None
    port: int | None = None
    config_file: Path | None = None
    options: tuple[str, ...] = ()
    connect_timeout_s: int = 10
    timeout_s: float = 600.0
    control_dir: Path | None = None

    def __enter__(self) -> Remote:
        self.check_host_keys()
        self.control_dir = Path(tempfile.mkdtemp(prefix="edgeserve-ssh-"))
        master = [*self.ssh_argv(control="yes"), "-o", "ControlPersist=120", "-N", "-f"]
        master += ["--", self.host]
        # The master stays in the background: it must not hold pipes we wait on.
        log_path = self.control_dir / "master.log"
        try:
            with log_path.open("wb") as log:
                started = subprocess.run(
                    master, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                    timeout=self.handshake_s,
                )  # fmt: skip
        except subprocess.TimeoutExpired:
            shutil.rmtree(self.control_dir, ignore_errors=True)
            raise DeployError(
                f"host {self.host}: no SSH session within {self.handshake_s} s: the server "
                "accepted the connection but stopped answering. Hint: check the device's sshd "
                "(`ssh -v` shows where it stops), or raise connect_timeout_s"
            ) from None
        if started.returncode != 0:
            raise self.failure(["(connect)"], started.returncode, log_path.read_bytes())
        return self

    @property
    def handshake_s(self) -> int:
        """The bound on connecting and authenticating: ConnectTimeout covers only the TCP
        connect, so a server that accepts and then stalls would be waited for forever."""
        return HANDSHAKE_FACTOR * self.connect_timeout_s

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.control_dir is not None:
            self._complete([*self.ssh_argv(), "-O", "exit", "--", self.host], None)
            shutil.rmtree(self.control_dir, ignore_errors=True)
            self.control_dir = None

    def check_host_keys(self) -> None:
        """Refuse a configuration under which ssh would not check this device's host key."""
        shown = self._complete([*self.ssh_argv(), "-G", "--", self.host], None)
        if shown.returncode != 0:
            raise self.failure(["ssh", "-G", self.host], shown.returncode, shown.stderr)
        problem = host_key_problem(shown.stdout.decode(errors="replace"))
        if problem:
            raise ConfigError(
                f"host {self.host}: host key checking is turned off by the profile's ssh_options "
                f"or the ssh config: {problem}; refused. Hint: add the device's key to "
                "known_hosts (ssh-keyscan, checked), or use StrictHostKeyChecking=accept-new"
            )

    def ssh_argv(self, control: str = "no") -> list[str]:
        """`ssh` and its options, without the host: the `-e` of rsync uses the same."""
        argv = ["ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={self.connect_timeout_s}"]
        # a connection that goes silent once up ends after SERVER_ALIVE_COUNT unanswered probes
        argv += ["-o", f"ServerAliveInterval={self.connect_timeout_s}"]
        argv += ["-o", f"ServerAliveCountMax={SERVER_ALIVE_COUNT}"]
        if self.config_file is not None:
            argv += ["-F", str(self.config_file)]
        if self.user:
            argv += ["-l", self.user]
        if self.port:
            argv += ["-p", str(self.port)]
        for option in self.options:
            argv += ["-o", option]
        if self.control_dir is not None:
            argv += ["-o", f"ControlPath={self.control_dir}/%C", "-o", f"ControlMaster={control}"]
        return argv

    def command_argv(self, argv: list[str]) -> list[str]:
        """The local argument list that runs `argv` on the device."""
        return [*self.ssh_argv(), "--", self.host, shlex.join(argv)]

    def run(self, argv: list[str], stdin: bytes | None = None) -> str:
        """Run `argv` on the device and return its stdout; raise `DeployError` on failure."""
        completed = self._complete(self.command_argv(argv), stdin)
        if completed.returncode != 0:
            raise self.failure(argv, completed.returncode, completed.stderr)
        return completed.stdout.decode(errors="replace")

    def succeeds(self, argv: list[str]) -> bool:
        """Whether `argv` exits 0 on the device (a probe: only an unreachable host raises)."""
        completed = self._complete(self.command_argv(argv), None)
        if completed.returncode == SSH_UNREACHABLE:
            raise self.failure(argv, completed.returncode, completed.stderr)
        return completed.returncode == 0

    def sh(self, script: str, *args: str) -> str:
        """Run a fixed POSIX sh script with positional arguments ($1, $2, ...)."""
        return self.run(["sh", "-c", script, "sh", *args])

    def write(self, path: str, data: bytes) -> None:
        """Write `data` to the file `path` on the device."""
        self.run(["sh", "-c", 'cat > "$1"', "sh", path], stdin=data)

    def failure(self, argv: list[str], code: int, stderr: bytes) -> DeployError:
        detail = stderr.decode(errors="replace").replace("\r\n", "\n").strip() or "(no stderr)"
        if code == SSH_UNREACHABLE:
            return DeployError(
                f"host {self.host}: ssh could not connect or authenticate: {detail}\nHint: check "
                f"that `ssh {self.host}` works (keys, known_hosts, the profile's ssh settings)."
            )
        return DeployError(f"host {self.host}: `{shlex.join(argv)}` failed (exit {code}): {detail}")

    def copy_tree(self, src: Path, dest: str, link_dest: str | None = None) -> str:
        """Copy the directory `src` to `dest` on the device; return the tool used.

        rsync (when both ends have it) sends only what changed and hard-links files equal to
        those in `link_dest` (the current release), so a release costs only its changes on disk.
        Files in `dest` that `src` lacks are deleted.
        Without rsync the tree is streamed as tar over ssh: everything is sent, nothing deleted.
        """
        self.run(["mkdir", "-p", dest])
        if self.has_rsync:
            self._rsync_tree(src, dest, link_dest)
            return "rsync"
        self._tar_tree(src, dest)
        return "tar"

    @cached_property
    def has_rsync(self) -> bool:
        """Whether both this machine and the device have rsync (asked once per device)."""
        return shutil.which("rsync") is not None and self.succeeds(["rsync", "--version"])

    def _rsync_tree(self, src: Path, dest: str, link_dest: str | None) -> None:
        # --checksum: builds are reproducible, so two different files can share size and mtime;
        # rsync's quick check would then hard-link the old one into the new release.
        argv = ["rsync", "-a", "--checksum", "--delete", "--protect-args"]
        argv += ["-e", shlex.join(self.ssh_argv())]
        if link_dest is not None:
            argv.append(f"--link-dest={link_dest}")
        argv += [f"{src}/", f"{self.host}:{dest}/"]
        completed = self._complete(argv, None)
        if completed.returncode != 0:
            raise self.failure(argv, completed.returncode, completed.stderr)

    def _tar_tree(self, src: Path, dest: str) -> None:
        pack = subprocess.run(
            ["tar", "-C", str(src), "-cf", "-", "."], capture_output=True, check=False
        )
        if pack.returncode != 0:
            raise DeployError(f"could not pack {src} with tar: {pack.stderr.decode().strip()}")
        self.run(["tar", "-C", dest, "-xf", "-"], stdin=pack.stdout)

    def _complete(self, argv: list[str], stdin: bytes | None) -> subprocess.CompletedProcess[bytes]:
        try:
            if stdin is None:
                return subprocess.run(
                    argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=self.timeout_s
                )
            return subprocess.run(argv, input=stdin, capture_output=True, timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            raise DeployError(
                f"host {self.host}: `{shlex.join(argv)}` still running after {self.timeout_s} s"
            ) from None
        except FileNotFoundError as exc:
            raise DeployError(f"`{argv[0]}` is not installed on this machine: {exc}") from None
