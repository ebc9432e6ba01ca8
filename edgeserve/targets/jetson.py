"""The jetson driver: ship a bundle to devices over SSH, switch atomically, roll back on failure.

Per host, each step shown as it runs:

    1. preflight   reachable, host keys checked, arch, L4T/JetPack, free disk, python3, flock
    2. lock        the device's deploy lock: one deploy, rollback or stop at a time per device
    3. copy        the bundle into releases/<version>-<hash12> (rsync --link-dest current)
    4. install     a per-release venv with the runtime requirements (or the profile's python)
    5. engine      `edgeserve engine build` on the device when the plan starts with tensorrt
    6. switch      `current` -> the new release (ln -s + mv -T: one rename)
    7. restart     the service manager makes `current` live (systemd, docker, process)
    8. health      GET /v2/health/ready on the device within the deadline, and the service
                   must be serving this very release
    9. record      the release joins the device's record of live releases; prune the rest

A failure in 6-8 switches `current` back to the last live release, restarts it and deletes the
failed one (it never went live, so rollback can never pick it). A fleet goes canary first, then
the rest `max_parallel` at a time; a failing canary stops the rollout.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any, TypeVar

from rich.console import Console
from rich.text import Text

from edgeserve.archive import write_archive
from edgeserve.bundle import Bundle
from edgeserve.errors import ConfigError, DeployError, DeployInterrupted, EdgeserveError
from edgeserve.manifest import ResourcesSection
from edgeserve.profiles import TargetProfile
from edgeserve.targets import DeployResult
from edgeserve.targets import releases as rel
from edgeserve.targets.fleet import on_every, rollout
from edgeserve.targets.jetson_settings import JetsonSettings
from edgeserve.targets.lock import device_lock
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
        with self.console.status(Text(f"{host}: {name} ...")):
            try:
                yield notes.append
            except EdgeserveError:
                self.console.print(Text.assemble(("✗", "red"), f" {host}: {name} failed"))
                raise
        took = time.monotonic() - started
        detail = f" ({'; '.join(notes)})" if notes else ""
        line = Text.assemble(("✓", "green"), f" {host}: {name}{detail} {took:.1f}s")
        self.console.print(line, highlight=False)


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
    grpc_port: int | None = None
    """The bundle's gRPC port on deploy (None: none); the profile's wins."""

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
        if self.port is None:  # status, rollback: the live release's
            self.port, self.grpc_port = self.deployed_ports(layout)
        self.port = self.config.port or self.port
        self.grpc_port = self.settings.grpc_port or self.grpc_port
        spec = ServiceSpec(
            self.target, layout, self.settings.bind, self.port, python, device.user,
            self.memory_mb, self.settings.health_timeout_s, self.settings.image,
            self.settings.docker_runtime, self.grpc_port,
        )  # fmt: skip
        return device, spec

    def deployed_ports(self, layout: rel.Layout) -> tuple[int, int | None]:
        """The HTTP and gRPC ports in the manifest of the live release (what status and
        rollback talk to)."""
        text = self.remote.sh(rel.READ_SCRIPT, f"{layout.current}/{rel.BUNDLE_DIR}/edgeserve.json")
        found = json.loads(text)["manifest"]["resources"] if text else {}
        resources = ResourcesSection(port=found.get("port", 8080), grpc_port=found.get("grpc_port"))
        return resources.port, resources.fixed_grpc_port

    def current(self, spec: ServiceSpec) -> str | None:
        return rel.name_of(self.remote.sh(rel.CURRENT_SCRIPT, spec.layout.current))

    def releases(self, spec: ServiceSpec) -> list[str]:
        return rel.lines(self.remote.sh(rel.LIST_SCRIPT, spec.layout.releases))

    def history(self, spec: ServiceSpec, current: str | None) -> list[str]:
        """The device's record of the releases that went live, oldest first."""
        recorded = rel.lines(self.remote.sh(rel.READ_SCRIPT, spec.layout.live))
        return rel.live_history(recorded, current, self.releases(spec))

    def record(self, spec: ServiceSpec, history: list[str]) -> None:
        self.remote.sh(rel.RECORD_SCRIPT, spec.layout.live, *history)

    @contextmanager
    def locked(self, spec: ServiceSpec, action: str) -> Iterator[None]:
        """The device's deploy lock, held for the block (another deploy there waits for it)."""
        wait_s, started = self.settings.lock_timeout_s, time.monotonic()
        with ExitStack() as held:
            with self.log.step(self.host, "lock") as note:
                held.enter_context(device_lock(self.remote, spec.layout.lock, wait_s, action))
                note(f"{spec.layout.lock}, waited {time.monotonic() - started:.1f}s")
            yield

    def deploy(self, bundle: Bundle, plan: str) -> dict[str, Any]:
        _, spec = self.prepare()
        name = rel.release_name(bundle.version, bundle.content_hash)
        with self.locked(spec, f"deploy of {bundle.name} {name}"):
            history = self.history(spec, self.current(spec))
            previous = history[-1] if history else None
            path = spec.layout.bundle(name)
            with self.log.step(self.host, "copy") as note:
                link_dest = spec.layout.bundle(previous) if previous else None
                note(self.remote.copy_tree(bundle.root, path, link_dest))
            python = self.install(bundle, plan, spec.layout.release(name))
            if bundle.backends(plan)[:1] == ("tensorrt",):
                with self.log.step(self.host, "engine"):
                    cache = f"EDGESERVE_ENGINE_CACHE={spec.layout.engines}"
                    argv = ["env", cache, python, "-m", "edgeserve", "engine", "build", path]
                    self.remote.run(argv)
            self.go_live(spec, name, previous, history)
            self.finish(spec, rel.went_live(history, name))
        return {"release": name, "previous": previous, "url": f"http://{self.host}:{self.port}"}

    def install(self, bundle: Bundle, plan: str, path: str) -> str:
        """The release's interpreter: the profile's as is, else a fresh venv in the release
        folder `path`, beside its bundle, with the bundle's pinned requirements."""
        with self.log.step(self.host, "install") as note:
            if self.config.python:
                note(f"using the profile's python {self.config.python}, nothing installed")
                return self.config.python
            venv = f"{path}/.venv"
            self.remote.run(["python3", "-m", "venv", "--system-site-packages", venv])
            version = bundle.metadata.get("edgeserve_version", "")
            edgeserve = self.settings.edgeserve_requirement or f"edgeserve=={version}"
            requirements = f"{path}/{rel.BUNDLE_DIR}/requirements/{plan}.txt"
            pip = [f"{venv}/bin/python", "-m", "pip", "install", "--quiet", "-r", requirements]
            self.remote.run([*pip, edgeserve])
            return f"{venv}/bin/python"

    def go_live(
        self, spec: ServiceSpec, name: str, previous: str | None, history: list[str]
    ) -> None:
        """Switch, restart, check; on failure, or Ctrl-C, go back to `previous` and delete
        what failed (a release never checked must not stay live)."""
        try:
            with self.log.step(self.host, "switch") as note:
                self.remote.sh(rel.SWITCH_SCRIPT, rel.link_target(name), spec.layout.current)
                note(f"current -> {name}")
            self.restart_and_check(spec, name)
        except (DeployError, KeyboardInterrupt) as failure:
            error = DeployError if isinstance(failure, DeployError) else DeployInterrupted
            why = failure.message if isinstance(failure, DeployError) else (
                f"host {self.host}: interrupted while switching to {name}"
            )  # fmt: skip
            if previous is None:
                self.abandon(spec, name)
                raise error(f"{why}\n(no previous release to go back to)") from None
            self.revert(spec, previous)
            self.finish(spec, history)
            raise error(f"{why}\nrolled back to {previous}") from None

    def restart_and_check(self, spec: ServiceSpec, name: str) -> None:
        service = SERVICES[self.settings.service]
        with self.log.step(self.host, f"restart ({self.settings.service})"):
            service.restart(self.remote, spec)
        with self.log.step(self.host, "health") as note:
            fetch(self.remote, spec, "/v2/health/ready", self.settings.health_timeout_s)
            live = rel.name_of(service.live_release(self.remote, spec) or "")
            if live != name:
                raise DeployError(
                    f"host {self.host}: after the switch the service runs {live}, not {name} "
                    "(something else changed the device meanwhile)"
                )
            note(f"{spec.local_url}/v2/health/ready answered on the device, serving {name}")

    def revert(self, spec: ServiceSpec, previous: str) -> None:
        with self.log.step(self.host, f"roll back to {previous}"):
            self.remote.sh(rel.SWITCH_SCRIPT, rel.link_target(previous), spec.layout.current)
            self.restart_and_check(spec, previous)

    def abandon(self, spec: ServiceSpec, name: str) -> None:
        """A first release that failed: stop it and leave the device as it found it."""
        with self.log.step(self.host, f"remove {name}"):
            SERVICES[self.settings.service].stop(self.remote, spec)
            self.remote.run(["rm", "-f", spec.layout.current])
            self.finish(spec, [])

    def finish(self, spec: ServiceSpec, history: list[str], prune: bool = True) -> None:
        """Write the live record, then keep `keep_releases` of it; what never went live goes.

        A rollback does not prune: the release it left stays for inspection until a deploy."""
        with self.log.step(self.host, "record + prune" if prune else "record") as note:
            self.record(spec, history)
            current = history[-1] if history else None
            kept = rel.keep_set(history, self.settings.keep_releases, current)
            doomed = rel.prunable(self.releases(spec), kept) if prune else []
            if doomed:
                self.remote.sh(rel.PRUNE_SCRIPT, spec.layout.releases, *doomed)
            note(f"live now {current}; removed {len(doomed)}, kept {len(kept)}")

    def rollback(self) -> dict[str, Any]:
        _, spec = self.prepare()
        with self.locked(spec, f"rollback of {self.function}"):
            current = self.current(spec)
            history = self.history(spec, current)
            if current is None:
                raise DeployError(
                    f"host {self.host}: {self.function} is not deployed here; nothing to roll back"
                )
            target, below = rel.rollback_target(history, current)
            if target is None:
                raise DeployError(
                    f"host {self.host}: no live release before {current} to roll back to "
                    f"(live record: {history})"
                )
            self.go_live(spec, target, current, history)
            self.finish(spec, below, prune=False)
        return {"release": target, "previous": current, "url": f"http://{self.host}:{self.port}"}

    def status(self) -> dict[str, Any]:
        _, spec = self.prepare(checked=False)
        current = self.current(spec)
        if current is None:
            return {"release": None, "health": "not deployed"}
        bundle = f"{spec.layout.current}/{rel.BUNDLE_DIR}/edgeserve.json"
        meta = json.loads(self.remote.run(["cat", bundle]))
        report = {"release": current, "version": meta["manifest"]["function"]["version"]}
        report["service"] = SERVICES[self.settings.service].state(self.remote, spec)
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

    def stop(self) -> dict[str, Any]:
        _, spec = self.prepare(checked=False)
        current = self.current(spec)
        if current is None:
            return {"release": None, "service": "not deployed"}
        with self.locked(spec, f"stop of {self.function}"):
            SERVICES[self.settings.service].stop(self.remote, spec)
        return {"release": current, "service": "stopped"}


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
            run.grpc_port = resources.fixed_grpc_port
            return run.deploy(bundle, plan)

        on_host = self._on(settings, bundle.name, profile, each)
        hosts = rollout(settings.hosts, settings.max_parallel, settings.canary, on_host)
        return self._result(profile, bundle.name, bundle.version, hosts)

    def rollback(self, name: str, profile: TargetProfile) -> DeployResult:
        settings = profile.settings_as(JetsonSettings)
        on_host = self._on(settings, name, profile, HostRun.rollback)
        back = "on the release it went back to"
        hosts = rollout(settings.hosts, settings.max_parallel, settings.canary, on_host, back)
        return self._result(profile, name, next(iter(hosts.values()))["release"], hosts)

    def status(self, name: str, profile: TargetProfile) -> dict[str, Any]:
        """Every host's state; an unreachable host's entry is its `error`, hiding no other."""
        settings = profile.settings_as(JetsonSettings)
        on_host = self._on(settings, name, profile, HostRun.status)
        done, failures = on_every(settings.hosts, settings.max_parallel, on_host)
        return {h: done[h] if h in done else {"error": failures[h]} for h in settings.hosts}

    def with_hosts(self, profile: TargetProfile, names: tuple[str, ...]) -> TargetProfile:
        """`deploy --host`: the profile narrowed to these hosts or groups."""
        return with_hosts(profile, names)

    def stop(self, name: str, profile: TargetProfile) -> dict[str, Any]:
        """Stop the function's service on every host (its releases stay; deploy starts it)."""
        settings = profile.settings_as(JetsonSettings)
        on_host = self._on(settings, name, profile, HostRun.stop)
        stopped = rollout(settings.hosts, settings.max_parallel, False, on_host, "stopped")
        if all(report["release"] is None for report in stopped.values()):
            raise DeployError(
                f"{name} is not deployed on {list(stopped)} ({profile.name}); nothing to stop"
            )
        return stopped

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
