"""The jetson driver: ship a bundle to devices over SSH, switch atomically, roll back on failure.

Per host, each step shown as it runs:

    1. preflight   reachable, arch, L4T/JetPack, free disk, python3
    2. copy        the bundle into releases/<version>-<hash12> (rsync --link-dest current)
    3. install     a per-release venv with the runtime requirements (or the profile's python)
    4. engine      `edgeserve engine build` on the device when the plan starts with tensorrt
    5. switch      `current` -> the new release (ln -s + mv -T: one rename)
    6. restart     the service manager makes `current` live (systemd, docker, process)
    7. health      GET /v2/health/ready on the device within the deadline
    8. prune       keep the newest `keep_releases`

A failure in 5-7 switches `current` back and restarts the previous release. A fleet goes canary
first, then the rest `max_parallel` at a time; a failing canary stops the rollout.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from rich.console import Console

from edgeserve.archive import write_archive
from edgeserve.bundle import Bundle
from edgeserve.errors import ConfigError, DeployError
from edgeserve.profiles import TargetProfile
from edgeserve.targets import DeployResult
from edgeserve.targets import releases as rel
from edgeserve.targets.jetson_settings import JetsonSettings
from edgeserve.targets.preflight import Device, inspect, preflight
from edgeserve.targets.services import SERVICES, ServiceSpec, check_image_l4t, fetch
from edgeserve.targets.ssh import Remote

TARGET = "jetson"
T = TypeVar("T")
STATUS_TIMEOUT_S = 3.0


class StepLog:
    """Prints each step of each host as it starts and ends, with its duration."""

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console(stderr=True)

    @contextmanager
    def step(self, host: str, name: str) -> Iterator[Callable[[str], None]]:
        notes: list[str] = []
        started = time.monotonic()
        with self.console.status(f"{host}: {name} ..."):
            try:
                yield notes.append
            except DeployError:
                self.console.print(f"[red]✗[/] {host}: {name} failed", highlight=False)
                raise
        took = time.monotonic() - started
        detail = f" ({'; '.join(notes)})" if notes else ""
        self.console.print(f"[green]✓[/] {host}: {name}{detail} {took:.1f}s", highlight=False)


@dataclasses.dataclass
class HostRun:
    """One function on one host: the steps of deploy, rollback and status."""

    settings: JetsonSettings
    host: str
    function: str
    target: str
    log: StepLog
    memory_mb: int = 1024
    port: int | None = None
    """The bundle's port on deploy; None: the profile's, else the deployed release's."""

    def __post_init__(self) -> None:
        self.remote: Remote = self.settings.remote(self.host)
        self.config = self.settings.for_host(self.host)

    def prepare(self, checked: bool = True) -> tuple[Device, ServiceSpec]:
        """Inspect the device (refusing it on preflight problems when `checked`) and plan."""
        with self.log.step(self.host, "preflight" if checked else "inspect") as note:
            root = self.config.install_root or self.settings.install_root
            look = preflight if checked else inspect
            device = look(self.remote, self.settings, root, self.function)
            if checked and self.settings.service == "docker" and self.settings.image:
                check_image_l4t(self.settings.image, device.l4t)
            note(device.describe())
        layout = rel.Layout(device.root, self.function)
        python = self.config.python or f"{layout.current}/.venv/bin/python"
        self.port = self.config.port or self.port or self.deployed_port(layout)
        spec = ServiceSpec(
            self.target, layout, self.settings.bind, self.port, python, device.user,
            self.memory_mb, self.settings.health_timeout_s, self.settings.image,
        )  # fmt: skip
        return device, spec

    def deployed_port(self, layout: rel.Layout) -> int:
        """The port in the manifest of the live release (what status and rollback talk to)."""
        text = self.remote.sh('cat "$1" 2>/dev/null || true', f"{layout.current}/edgeserve.json")
        port: int = json.loads(text)["manifest"]["resources"]["port"] if text else 8080
        return port

    def current(self, spec: ServiceSpec) -> str | None:
        return rel.name_of(self.remote.sh(rel.CURRENT_SCRIPT, spec.layout.current))

    def releases(self, spec: ServiceSpec) -> list[str]:
        return rel.newest_first(self.remote.sh(rel.LIST_SCRIPT, spec.layout.releases))

    def deploy(self, bundle: Bundle, plan: str) -> dict[str, Any]:
        _, spec = self.prepare()
        previous = self.current(spec)
        name = rel.release_name(bundle.version, bundle.content_hash)
        path = spec.layout.release(name)
        with self.log.step(self.host, "copy") as note:
            link_dest = spec.layout.release(previous) if previous else None
            note(self.remote.copy_tree(bundle.root, path, link_dest, keep=(".venv",)))
            self.remote.run(["touch", path])
        python = self.install(bundle, plan, path)
        if bundle.backends(plan)[:1] == ("tensorrt",):
            with self.log.step(self.host, "engine"):
                cache = f"EDGESERVE_ENGINE_CACHE={spec.layout.engines}"
                self.remote.run(["env", cache, python, "-m", "edgeserve", "engine", "build", path])
        self.go_live(spec, name, previous)
        self.prune(spec, keep={name, previous or name})
        return {"release": name, "previous": previous, "url": f"http://{self.host}:{self.port}"}

    def install(self, bundle: Bundle, plan: str, path: str) -> str:
        """The release's interpreter: the profile's as is, else a fresh venv of the release."""
        with self.log.step(self.host, "install") as note:
            if self.config.python:
                note(f"using the profile's python {self.config.python}, nothing installed")
                return self.config.python
            venv = f"{path}/.venv"
            self.remote.run(["python3", "-m", "venv", "--system-site-packages", venv])
            version = bundle.metadata.get("edgeserve_version", "")
            edgeserve = self.settings.edgeserve_requirement or f"edgeserve=={version}"
            requirements = f"{path}/requirements/{plan}.txt"
            pip = [f"{venv}/bin/python", "-m", "pip", "install", "--quiet", "-r", requirements]
            self.remote.run([*pip, edgeserve])
            return f"{venv}/bin/python"

    def go_live(self, spec: ServiceSpec, name: str, previous: str | None) -> None:
        """Switch, restart, check health; on failure switch back and restart `previous`."""
        try:
            with self.log.step(self.host, "switch") as note:
                self.remote.sh(rel.SWITCH_SCRIPT, rel.link_target(name), spec.layout.current)
                note(f"current -> {name}")
            self.restart_and_check(spec)
        except DeployError as failure:
            if previous is None:
                raise DeployError(
                    f"{failure.message}\n(no previous release to go back to)"
                ) from None
            self.revert(spec, previous)
            raise DeployError(f"{failure.message}\nrolled back to {previous}") from None

    def restart_and_check(self, spec: ServiceSpec) -> None:
        with self.log.step(self.host, f"restart ({self.settings.service})"):
            SERVICES[self.settings.service].restart(self.remote, spec)
        with self.log.step(self.host, "health") as note:
            fetch(self.remote, spec, "/v2/health/ready", self.settings.health_timeout_s)
            note(f"{spec.local_url}/v2/health/ready answered on the device")

    def revert(self, spec: ServiceSpec, previous: str) -> None:
        with self.log.step(self.host, f"roll back to {previous}"):
            self.remote.sh(rel.SWITCH_SCRIPT, rel.link_target(previous), spec.layout.current)
            self.restart_and_check(spec)

    def prune(self, spec: ServiceSpec, keep: set[str]) -> None:
        with self.log.step(self.host, "prune") as note:
            doomed = rel.prunable(self.releases(spec), self.settings.keep_releases, keep)
            if doomed:
                self.remote.sh(rel.PRUNE_SCRIPT, spec.layout.releases, *doomed)
            note(f"removed {len(doomed)}, kept {self.settings.keep_releases}")

    def rollback(self) -> dict[str, Any]:
        _, spec = self.prepare()
        current = self.current(spec)
        target = rel.previous_release(self.releases(spec), current)
        if target is None or target == current:
            raise DeployError(f"host {self.host}: no release before {current} to roll back to")
        self.go_live(spec, target, current)
        return {"release": target, "previous": current, "url": f"http://{self.host}:{self.port}"}

    def status(self) -> dict[str, Any]:
        _, spec = self.prepare(checked=False)
        current = self.current(spec)
        if current is None:
            return {"release": None, "health": "not deployed"}
        meta = json.loads(self.remote.run(["cat", f"{spec.layout.current}/edgeserve.json"]))
        report = {"release": current, "version": meta["manifest"]["function"]["version"]}
        try:
            model = json.loads(
                fetch(self.remote, spec, f"/v2/models/{self.function}", STATUS_TIMEOUT_S)
            )
            report.update(
                health="ready", backend=model.get("platform"), serving=model.get("versions")
            )
        except DeployError as exc:
            report["health"] = f"down: {exc.message.splitlines()[-1]}"
        return report

    def stop(self) -> None:
        _, spec = self.prepare(checked=False)
        SERVICES[self.settings.service].stop(self.remote, spec)


def rollout(
    hosts: tuple[str, ...], settings: JetsonSettings, each: Callable[[str], T]
) -> dict[str, T]:
    """Run `each` on the canary, then on the others in parallel; a failing canary stops it all."""
    if len(hosts) == 1:
        return {hosts[0]: each(hosts[0])}
    if not settings.canary:
        return in_parallel(hosts, settings.max_parallel, each)
    canary, rest = hosts[0], hosts[1:]
    try:
        first = each(canary)
    except DeployError as exc:
        raise DeployError(
            f"canary {canary} failed, rollout stopped; not touched: {list(rest)}:\n{exc.message}"
        ) from None
    return {canary: first, **in_parallel(rest, settings.max_parallel, each)}


def in_parallel(hosts: tuple[str, ...], limit: int, each: Callable[[str], T]) -> dict[str, T]:
    """`each` on every host, `limit` at a time; every failure is reported, none hides another."""
    with ThreadPoolExecutor(max_workers=limit) as pool:
        futures = {host: pool.submit(each, host) for host in hosts}
    failures = [f"{h}: {f.exception()}" for h, f in futures.items() if f.exception() is not None]
    if failures:
        raise DeployError(f"{len(failures)} of {len(hosts)} hosts failed:\n" + "\n".join(failures))
    return {host: future.result() for host, future in futures.items()}


class JetsonDriver:
    """The `Driver` of `driver = "jetson"` profiles (see edgeserve.targets)."""

    def __init__(self, console: Console | None = None) -> None:
        self.log = StepLog(console)

    def package(self, bundle: Bundle, profile: TargetProfile, out: Path) -> Path:
        """The release as one archive, for devices reached by other means than ssh."""
        name = rel.release_name(bundle.version, bundle.content_hash)
        files = sorted(path for path in bundle.root.rglob("*") if path.is_file())
        members = [(str(path.relative_to(bundle.root)), path) for path in files]
        return write_archive(out / f"{bundle.name}-{name}-{TARGET}.tar.gz", members)

    def deploy(self, bundle: Bundle, profile: TargetProfile) -> DeployResult:
        settings = profile.settings_as(JetsonSettings)
        plan = plan_name(bundle, profile)
        resources = bundle.manifest.resources

        def each(run: HostRun) -> dict[str, Any]:
            run.memory_mb, run.port = resources.memory_mb, resources.port
            return run.deploy(bundle, plan)

        hosts = rollout(settings.hosts, settings, self._on(settings, bundle.name, profile, each))
        return self._result(profile, bundle.name, bundle.version, hosts)

    def rollback(self, name: str, profile: TargetProfile) -> DeployResult:
        settings = profile.settings_as(JetsonSettings)
        hosts = rollout(
            settings.hosts, settings, self._on(settings, name, profile, HostRun.rollback)
        )
        return self._result(profile, name, next(iter(hosts.values()))["release"], hosts)

    def status(self, name: str, profile: TargetProfile) -> dict[str, Any]:
        settings = profile.settings_as(JetsonSettings)
        on_host = self._on(settings, name, profile, HostRun.status)
        return {host: on_host(host) for host in settings.hosts}

    def with_hosts(self, profile: TargetProfile, names: tuple[str, ...]) -> TargetProfile:
        """`deploy --host`: the profile narrowed to these hosts or groups."""
        return with_hosts(profile, names)

    def stop(self, name: str, profile: TargetProfile) -> None:
        """Stop the function's service on every host (its releases stay)."""
        settings = profile.settings_as(JetsonSettings)
        on_host = self._on(settings, name, profile, HostRun.stop)
        for host in settings.hosts:
            on_host(host)

    def _on(
        self,
        settings: JetsonSettings,
        name: str,
        profile: TargetProfile,
        action: Callable[[HostRun], T],
    ) -> Callable[[str], T]:
        """`action` as a function of the host, run over one multiplexed ssh connection."""

        def on_host(host: str) -> T:
            run = HostRun(settings, host, name, profile.name, self.log)
            with run.remote:
                return action(run)

        return on_host

    def _result(
        self, profile: TargetProfile, name: str, version: str, hosts: dict[str, Any]
    ) -> DeployResult:
        first = next(iter(hosts.values()))
        return DeployResult(
            profile.name, name, version, url=first["url"], previous_version=first["previous"],
            details={"hosts": hosts},
        )  # fmt: skip


def plan_name(bundle: Bundle, profile: TargetProfile) -> str:
    """The bundle's build plan for this profile: its own name, else the generic `jetson`."""
    for name in (profile.name, TARGET):
        if name in bundle.targets:
            return name
    raise ConfigError(
        f"bundle {bundle.root} has no build plan for target {profile.name!r} (it has "
        f"{list(bundle.targets)}); Hint: `edgeserve build --target {profile.name}`"
    )


def with_hosts(profile: TargetProfile, names: tuple[str, ...]) -> TargetProfile:
    """The profile narrowed to the hosts (or groups) `--host` names."""
    settings = profile.settings_as(JetsonSettings)
    try:
        hosts = settings.select(names)
    except ValueError as exc:
        raise ConfigError(f"{profile.source}: --host: {exc}") from None
    overrides = {h: o for h, o in profile.settings.get("overrides", {}).items() if h in hosts}
    narrowed = {**profile.settings, "hosts": list(hosts), "overrides": overrides}
    return dataclasses.replace(profile, settings=narrowed)


DRIVER = JetsonDriver()
