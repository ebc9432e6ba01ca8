"""The SSH command layer: run argument lists on a device and copy trees to it.

Every remote command is an argument list joined with `shlex.join`, so the remote shell sees
each argument exactly once and quoted. Host keys are checked the way the user's ssh does
(their ~/.ssh/config, keys and known_hosts, or the profile's `ssh_config`); nothing here turns
that off. `BatchMode=yes` makes a missing key or an unknown host fail at once instead of
waiting for a password prompt nobody will answer. A failed command becomes a `DeployError`
naming the host, the command and its stderr: the one place `ssh`, `rsync` and `tar` failures
are translated.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from edgeserve.errors import DeployError

SSH_UNREACHABLE = 255
"""ssh's own exit status when it cannot connect or authenticate."""


@dataclass(frozen=True)
class Remote:
    """One device as ssh sees it: a host (or ~/.ssh/config alias) and how to reach it."""

    host: str
    user: str | None = None
    port: int | None = None
    config_file: Path | None = None
    options: tuple[str, ...] = ()
    connect_timeout_s: int = 10
    timeout_s: float = 600.0
    _rsync: dict[str, bool] = field(default_factory=dict, compare=False, repr=False)

    def ssh_argv(self) -> list[str]:
        """`ssh` and its options, without the host: the `-e` of rsync uses the same."""
        argv = ["ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={self.connect_timeout_s}"]
        if self.config_file is not None:
            argv += ["-F", str(self.config_file)]
        if self.user:
            argv += ["-l", self.user]
        if self.port:
            argv += ["-p", str(self.port)]
        for option in self.options:
            argv += ["-o", option]
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

    def failure(self, argv: list[str], code: int, stderr: bytes) -> DeployError:
        detail = stderr.decode(errors="replace").strip() or "(no stderr)"
        if code == SSH_UNREACHABLE:
            return DeployError(
                f"host {self.host}: ssh could not connect or authenticate: {detail}. Hint: check "
                f"that `ssh {self.host}` works (keys, known_hosts, the profile's ssh settings)."
            )
        return DeployError(
            f"host {self.host}: `{shlex.join(argv)}` failed (exit {code}): {detail}"
        )

    def copy_tree(self, src: Path, dest: str, link_dest: str | None = None) -> str:
        """Copy the directory `src` to `dest` on the device; return the tool used.

        rsync (when both ends have it) sends only what changed and hard-links files equal to
        those in `link_dest` (the current release), so a release costs only its changes on disk.
        Without rsync the tree is streamed as tar over ssh: everything is sent.
        """
        self.run(["mkdir", "-p", dest])
        if self._has_rsync():
            self._rsync_tree(src, dest, link_dest)
            return "rsync"
        self._tar_tree(src, dest)
        return "tar"

    def _has_rsync(self) -> bool:
        if "both" not in self._rsync:
            local = shutil.which("rsync") is not None
            self._rsync["both"] = local and self.succeeds(["rsync", "--version"])
        return self._rsync["both"]

    def _rsync_tree(self, src: Path, dest: str, link_dest: str | None) -> None:
        argv = ["rsync", "-a", "--delete", "--protect-args", "-e", shlex.join(self.ssh_argv())]
        if link_dest is not None:
            argv.append(f"--link-dest={link_dest}")
        target = f"{self.user}@{self.host}" if self.user else self.host
        argv += [f"{src}/", f"{target}:{dest}/"]
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
            return subprocess.run(
                argv, input=stdin, capture_output=True, timeout=self.timeout_s, check=False
            )
        except subprocess.TimeoutExpired:
            raise DeployError(
                f"host {self.host}: `{shlex.join(argv)}` still running after {self.timeout_s} s"
            ) from None
        except FileNotFoundError as exc:
            raise DeployError(f"`{argv[0]}` is not installed on this machine: {exc}") from None
