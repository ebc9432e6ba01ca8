"""The `[settings]` of a jetson target profile: which devices, how to reach them, how to run."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from edgeserve.targets.ssh import Remote
from edgeserve.validation import StrictTable, arrays_as_tuples


class HostOverride(StrictTable):
    """Per-host exceptions to the profile (two functions' worth of devices rarely match)."""

    install_root: str | None = None
    port: int | None = Field(default=None, ge=1, le=65535)
    python: str | None = None


class JetsonSettings(StrictTable):
    """Devices are ssh hosts or ~/.ssh/config aliases; the first one is the canary."""

    hosts: tuple[str, ...] = Field(min_length=1)
    groups: dict[str, tuple[str, ...]] = {}
    user: str | None = None
    ssh_port: int | None = Field(default=None, ge=1, le=65535)
    ssh_config: Path | None = Field(default=None, strict=False)  # TOML has no paths: text
    ssh_options: tuple[str, ...] = ()
    """`ssh -o` options; any that turns host key checking off is refused (see ssh.py)."""
    connect_timeout_s: int = Field(default=10, ge=1)
    install_root: str = "~/edgeserve"
    service: Literal["systemd", "docker", "process"] = "systemd"
    image: str | None = None
    bind: str = "0.0.0.0"  # noqa: S104 - a device serves its network
    port: int | None = Field(default=None, ge=1, le=65535)
    grpc_port: int | None = Field(default=None, ge=1, le=65535)
    """KServe v2 over gRPC on this port; default: the function's [resources] grpc_port."""
    python: str | None = None
    edgeserve_requirement: str | None = None
    allow_arch: tuple[str, ...] = ("aarch64",)
    min_free_mb: int = Field(default=500, ge=0)
    keep_releases: int = Field(default=3, ge=1)
    canary: bool = True
    max_parallel: int = Field(default=4, ge=1)
    health_timeout_s: float = Field(default=300.0, gt=0)
    lock_timeout_s: float = Field(default=900.0, ge=0)
    """How long a deploy waits for another one on the same device to finish (0: fail at once)."""
    docker_runtime: str = "nvidia"
    overrides: dict[str, HostOverride] = {}

    @field_validator("groups", mode="before")
    @classmethod
    def _groups_are_tuples(cls, groups: Any) -> Any:
        """Each group is an array in TOML, a tuple here (StrictTable turns the table's own)."""
        return arrays_as_tuples(groups)

    @model_validator(mode="after")
    def _checked(self) -> JetsonSettings:
        if self.service == "docker" and not self.image:
            raise ValueError('service = "docker" needs `image` (an L4T image matching the devices)')
        unknown = sorted(set(self.overrides) - set(self.hosts))
        if unknown:
            raise ValueError(f"overrides name hosts not in `hosts`: {unknown}")
        return self

    def select(self, names: tuple[str, ...]) -> tuple[str, ...]:
        """The hosts `--host` names (hosts or groups), in profile order; all when none given."""
        if not names:
            return self.hosts
        wanted = {host for name in names for host in self.groups.get(name, (name,))}
        unknown = sorted(wanted - set(self.hosts))
        if unknown:
            raise ValueError(f"unknown host(s) {unknown}; the profile has {list(self.hosts)}")
        return tuple(host for host in self.hosts if host in wanted)

    def remote(self, host: str) -> Remote:
        return Remote(
            host,
            user=self.user,
            port=self.ssh_port,
            config_file=self.ssh_config.expanduser() if self.ssh_config else None,
            options=self.ssh_options,
            connect_timeout_s=self.connect_timeout_s,
        )

    def for_host(self, host: str) -> HostOverride:
        """The install root, port and python of one host, overrides applied."""
        override = self.overrides.get(host, HostOverride())
        return HostOverride(
            install_root=override.install_root or self.install_root,
            port=override.port or self.port,
            python=override.python or self.python,
        )
