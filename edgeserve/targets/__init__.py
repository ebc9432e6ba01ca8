"""Deploying to targets: one driver per target kind (edgeserve.kinds), behind one small protocol.

`deploy()` is what `edgeserve deploy` calls. A driver module is imported only when its target
is used, so `boto3` (aws-lambda) or an SSH client (jetson) load only for the command that
needs them.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from edgeserve.errors import ConfigError
from edgeserve.kinds import KINDS, kind_named

if TYPE_CHECKING:
    from edgeserve.bundle import Bundle
    from edgeserve.profiles import TargetProfile


@dataclass(frozen=True)
class DeployResult:
    """What a deploy or rollback left running: the version now live and where to reach it."""

    target: str
    name: str
    version: str
    url: str | None = None
    previous_version: str | None = None
    details: dict[str, Any] = field(default_factory=dict)


class Driver(Protocol):
    """Packages a bundle for a target, deploys it, reports its state and rolls it back."""

    def package(self, bundle: Bundle, profile: TargetProfile, out: Path) -> Path: ...

    def deploy(self, bundle: Bundle, profile: TargetProfile) -> DeployResult: ...

    def status(self, name: str, profile: TargetProfile) -> dict[str, Any]: ...

    def rollback(self, name: str, profile: TargetProfile) -> DeployResult: ...


def deploy(path: Path, target: str | Path, *, hosts: Sequence[str] = ()) -> DeployResult:
    """Ship the function at `path` (a bundle, or a source folder built here first) to `target`
    (a profile name or .toml path), health-check it, and roll back if it fails."""
    from edgeserve.builder import open_or_build

    profile = target_profile(target, path, hosts)
    bundle = open_or_build(path, targets=(str(target),))  # a profile file: the file given
    return driver_for(profile).deploy(bundle, profile)


def target_profile(target: str | Path, path: Path, hosts: Sequence[str] = ()) -> TargetProfile:
    """The profile for a function at `path`, narrowed to `hosts` where the driver has several."""
    from edgeserve.profiles import load_target

    profile = load_target(target, path if path.is_dir() else path.parent)
    if not hosts:
        return profile
    narrow = getattr(driver_for(profile), "with_hosts", None)
    if narrow is None:
        raise ConfigError(
            f"--host applies to targets with several hosts (jetson); {target} is {profile.driver}"
        )
    narrowed: TargetProfile = narrow(profile, tuple(hosts))
    return narrowed


def driver_for(profile: TargetProfile) -> Driver:
    """The driver a profile names, imported on first use."""
    spec = kind_named(profile.driver, str(profile.source)).driver
    if spec is None:
        raise ConfigError(
            f"target {profile.name!r} (driver {profile.driver!r}) has nothing to deploy; "
            "Hint: run it with `edgeserve serve`"
        )
    module_name, attribute = spec.split(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise ConfigError(
            f"{profile.source}: driver {profile.driver!r} is not available ({exc})"
        ) from None
    driver: Driver = getattr(module, attribute)
    return driver


def package_targets(
    bundle: Bundle, targets: Sequence[str], out: Path, function_dir: Path | None
) -> list[Path]:
    """What `build --target T` writes for each target whose driver packages: `<out>/<name>-<T>/`.

    Every target whose profile's kind has a driver is packaged (a kind's name, or any profile
    of such a kind: `knative-gpu`); `local` is planned by `build` alone."""
    from edgeserve.profiles import load_target

    written = []
    for name in targets:
        profile = load_target(name, function_dir)
        if KINDS[profile.driver].driver is not None:
            folder = out / f"{bundle.name}-{profile.name}"
            written.append(driver_for(profile).package(bundle, profile, folder))
    return written
