"""Function source -> bundle: plan (pure data), then write (into a scratch folder, then rename).

A failed build never leaves half a bundle: everything is written beside `out` and renamed into
place at the end. Same source, same targets, same edgeserve -> same bytes and the same content
hash (no timestamps, no absolute paths, canonical JSON, deterministic archives).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

from edgeserve.archive import write_archive
from edgeserve.backends import BACKENDS, BY_NAME, forced
from edgeserve.buildchecks import Check, PassedOver, Refused, Replaced, check_source, log_check
from edgeserve.bundle import (
    BUNDLE_FILE,
    FORMAT,
    Bundle,
    canonical_json,
    content_hash,
    is_function_source,
    list_files,
    recorded_build,
    sha256_file,
    signature_to_json,
)
from edgeserve.cache import bundles_dir, prune, touch
from edgeserve.errors import BackendError, BundleError, ConfigError
from edgeserve.hardware import probe_modules
from edgeserve.kinds import KINDS, TargetKind
from edgeserve.manifest import MANIFEST_NAME, Manifest, load_manifest
from edgeserve.pathhints import not_a_source
from edgeserve.profiles import load_target, target_name
from edgeserve.requirements import (
    installed_version,
    pinned_requirements,
    requirements_text,
    unpinned,
)
from edgeserve.signature import check_max_batch_size, read_signature
from edgeserve.sources import (
    external_data_copies,
    handler_copies,
    model_file,
    sample_copies,
)
from edgeserve.types import Signature


@dataclass(frozen=True)
class TargetPlan:
    """What one target gets: its platform, its backends (best first), its pinned requirements."""

    name: str
    platform: str
    backends: tuple[str, ...]
    requirements: tuple[str, ...]
    declined: tuple[tuple[str, str], ...] = ()  # (backend, why): preferred, fits, not planned

    def to_json(self) -> dict[str, Any]:
        return {"platform": self.platform, "backends": list(self.backends)}

    def without(self, backend: str) -> TargetPlan:
        """This plan less `backend`, and its package's pin where no other backend needs it."""
        backends = tuple(name for name in self.backends if name != backend)
        requirements = unpinned(self.requirements, backend, backends)
        return replace(self, backends=backends, requirements=requirements)


@dataclass(frozen=True)
class BuildPlan:
    """Everything a build will write, as data: nothing is on disk until `write_bundle`."""

    manifest: Manifest  # resolved: [model] path points into the bundle
    signature: Signature
    copies: tuple[tuple[str, Path], ...]  # (path in the bundle, source file)
    targets: tuple[TargetPlan, ...]

    @property
    def backends(self) -> tuple[str, ...]:
        """Every backend some target plans, in table order."""
        planned = {name for target in self.targets for name in target.backends}
        return tuple(backend.name for backend in BACKENDS if backend.name in planned)

    @property
    def preferred(self) -> tuple[str, ...]:
        """Every backend some target plans, best first: the `planned_backends` of its bundle."""
        return tuple(dict.fromkeys(name for target in self.targets for name in target.backends))

    def texts(self) -> dict[str, str]:
        """Files written from text: one requirements file per target."""
        return {
            f"requirements/{target.name}.txt": requirements_text(target.name, target.requirements)
            for target in self.targets
        }

    def describe(self) -> dict[str, Any]:
        """edgeserve.json without the file list and the hash."""
        return {
            "format": FORMAT,
            "edgeserve_version": installed_version("edgeserve") or "unknown",
            "manifest": self.manifest.model_dump(mode="json"),
            "signature": signature_to_json(self.signature),
            "targets": {target.name: target.to_json() for target in self.targets},
        }

    def metadata(self, files: dict[str, str]) -> dict[str, Any]:
        """The sealed edgeserve.json for a bundle holding `files` (path -> sha256)."""
        unsealed = {**self.describe(), "files": dict(sorted(files.items()))}
        return {**unsealed, "content_hash": content_hash(unsealed)}

    def without(self, backend: str) -> BuildPlan:
        """This plan less `backend` (every target keeps another: see `_prepare`)."""
        return replace(self, targets=tuple(target.without(backend) for target in self.targets))

    def only(self, target: str) -> BuildPlan:
        return replace(self, targets=tuple(t for t in self.targets if t.name == target))

    def fingerprint(self) -> str:
        """A hash of the build's inputs: the plan and the bytes of every source file."""
        sources = {dest: sha256_file(source) for dest, source in self.copies}
        return content_hash({"plan": self.describe(), "sources": sources})


def plan_build(
    source: Path, *, targets: Sequence[str] = ("local",), backend: str | None = None
) -> BuildPlan:
    """Read and check a function source folder and decide what its bundle holds."""
    if not source.is_dir():
        raise ConfigError(not_a_source(source))
    manifest = load_manifest(source)
    model, signature = read_model(source, manifest)
    model_dest = f"model/{model.name}"
    copies = [(MANIFEST_NAME, source / MANIFEST_NAME), (model_dest, model)]
    copies += external_data_copies(model) + handler_copies(source, manifest)
    copies += sample_copies(source)
    resolved = manifest.model_copy(
        update={"model": manifest.model.model_copy(update={"path": model_dest})}
    )
    names = dict.fromkeys(targets or ("local",))
    plans = tuple(_target_plan(name, manifest, backend, source, signature, model) for name in names)
    return BuildPlan(resolved, signature, tuple(sorted(copies)), plans)


def read_model(source: Path, manifest: Manifest) -> tuple[Path, Signature]:
    """The model `[model] path` names and its signature, held to [batching] as build holds it."""
    model = model_file(source, manifest)
    batching = manifest.batching.max_batch_size > 0
    signature = read_signature(model, manifest.model, source / MANIFEST_NAME, batching)
    check_max_batch_size(signature, manifest.batching, source / MANIFEST_NAME)
    return model, signature


def write_bundle(
    plan: BuildPlan,
    out: Path,
    *,
    dist: Path | None = None,
    check: Callable[[BuildPlan], list[Check]] = lambda plan: [],
    report: Callable[[Check], None] = lambda done: None,
) -> Bundle:
    """Write `plan` to `out` (replacing a bundle there) and archives to `dist` if given.

    Each planned backend prepares the model first (`_prepare`: a backend that refuses it leaves
    the plan, with a warning to `report`), then `check` runs on the plan as it then stands (a
    refused OpenVINO has no precision to check), each finding given to `report`."""
    _check_replaceable(out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix=f".{out.name}-build-", dir=out.parent))
    except OSError as exc:  # a file where a parent folder should be, no permission
        raise ConfigError(f"{out}: cannot write the bundle there ({exc.strerror})") from None
    try:
        _copy_sources(plan, scratch)
        plan = _prepare(plan, scratch, report)
        for done in check(plan):
            report(done)
        _write_files(plan, scratch)
        if dist is not None:
            write_archives(plan, scratch, dist)
        _swap_in(scratch, out)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return Bundle.open(out)


def build(
    source: Path,
    out: Path,
    *,
    targets: Sequence[str] = ("local",),
    backend: str | None = None,
    archive: bool = False,
    dist: Path | None = None,
    report: Callable[[Check], None] | None = None,
) -> Bundle:
    """Build the function at `source` into the bundle folder `out`.

    With `archive`, also write `<name>-<version>-<target>.tar.gz` per target into `dist`
    (default: a `dist` folder beside `out`). When a target runs OpenVINO at a precision other
    than fp32, the drift against fp32 is measured (refused over max_abs_diff) and given to `report`.
    The handler is imported and run on the samples first (`dryrun`): its mistakes fail the build;
    a batch-axis check that could not run is given to `report` as a warning.
    """
    plan = plan_build(source, targets=targets, backend=backend)
    report = report or (lambda done: None)
    earlier = recorded_build(out)
    bundle = write_bundle(
        plan,
        out,
        dist=(dist or out.parent / "dist") if archive else None,
        check=partial(check_source, source),
        report=report,
    )
    if earlier is not None:
        report(
            Replaced(out, *earlier, bundle.targets, bundle.planned_backends(), bundle.content_hash)
        )
    return bundle


def open_or_build(
    path: Path,
    *,
    targets: Sequence[str] = ("local",),
    backend: str | None = None,
    report: Callable[[Check], None] = log_check,
) -> Bundle:
    """Open a bundle, or first build a function source into the cache (what `serve` does).

    A `backend` forced (serve's --backend, else EDGESERVE_BACKEND) is the only one planned and
    checked: forcing onnxruntime gets around a model OpenVINO refuses. The plan is part of the
    cache key, so a later serve that forces nothing builds its own entry.

    The cache entry is keyed by a hash of the source files and the build plan, so an edited
    source builds again and an unchanged one opens at once. A new entry gets build's checks
    first (`check_source`: the batch axis, the handler's dry run on the samples, the precision
    check), each given to `report`; an entry is made only once they pass. The handler they
    import is the one this process then serves (handler.import_handler runs a file once).
    """
    if not is_function_source(path):
        return Bundle.open(path)
    plan = plan_build(path, targets=targets, backend=forced(backend))
    cached = bundles_dir() / f"{plan.manifest.function.name}-{plan.fingerprint()[:16]}"
    if (cached / BUNDLE_FILE).is_file():
        try:
            bundle = Bundle.open(cached)
        except BundleError:  # a damaged cache entry is built again
            pass
        else:
            touch(cached)
            return replace(bundle, source=path)
    bundle = write_bundle(plan, cached, check=partial(check_source, path), report=report)
    prune(keep=cached)
    return replace(bundle, source=path)


def archive_name(plan: BuildPlan, target: str) -> str:
    info = plan.manifest.function
    return f"{info.name}-{info.version}-{target}.tar.gz"


def write_archives(plan: BuildPlan, bundle_dir: Path, dist: Path) -> list[Path]:
    """One archive per target, holding only what that target needs (its own edgeserve.json)."""
    written = []
    for target in plan.targets:
        sub = plan.only(target.name)
        names = [name for name in list_files(bundle_dir) if _needed(name, sub)]
        files = {name: sha256_file(bundle_dir / name) for name in names}
        members: list[tuple[str, Path | bytes]] = [(name, bundle_dir / name) for name in names]
        members.append((BUNDLE_FILE, canonical_json(sub.metadata(files))))
        written.append(write_archive(dist / archive_name(plan, target.name), members))
    return written


def _needed(name: str, plan: BuildPlan) -> bool:
    if name.startswith("requirements/"):
        return name in plan.texts()
    owner = next((backend for backend in BACKENDS if name in backend.prepared), None)
    return owner is None or owner.name in plan.backends


def _copy_sources(plan: BuildPlan, root: Path) -> None:
    for dest, source in plan.copies:
        (root / dest).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, root / dest)


def _prepare(plan: BuildPlan, root: Path, report: Callable[[Check], None]) -> BuildPlan:
    """Each planned backend prepares the model in `root`; one that refuses it, or answers it
    otherwise than ONNX Runtime (`differs`), leaves the plan (its files removed) where every
    target keeps another backend, else its refusal stands, as
    does a backend not installed on this machine: a bundle is built for other machines too, so
    what this one lacks is said, not planned away."""
    declined = dict(pair for target in plan.targets for pair in target.declined)
    for name, why in declined.items():  # what it would serve wrong: never planned
        report(PassedOver(name, why, plan.preferred))
    model = root / plan.manifest.model.path
    for name in plan.backends:
        backend = BY_NAME[name]
        try:
            backend.prepare(model, root)
            if otherwise := backend.differs(model, plan.signature):  # wrong answers, no error
                raise BackendError(otherwise)
        except BackendError as exc:
            source = dict(plan.copies)[plan.manifest.model.path]  # not the scratch copy
            said = exc.message.replace(str(model), str(source))
            missing = len(probe_modules(list(backend.modules))) < len(backend.modules)
            if missing or any(target.backends == (name,) for target in plan.targets):
                # not installed here (not the model's fault), or a target's only backend
                raise BackendError(said) from None
            plan = plan.without(name)
            for prepared in backend.prepared:
                (root / prepared).unlink(missing_ok=True)
            report(Refused(name, said, plan.preferred))
    return plan


def _write_files(plan: BuildPlan, root: Path) -> None:
    for dest, text in plan.texts().items():
        (root / dest).parent.mkdir(parents=True, exist_ok=True)
        (root / dest).write_text(text, encoding="utf-8")
    files = {name: sha256_file(root / name) for name in list_files(root)}
    (root / BUNDLE_FILE).write_bytes(canonical_json(plan.metadata(files)))


def _check_replaceable(out: Path) -> None:
    """Never delete a folder that is not a bundle (a typo in `out` must not eat a project)."""
    foreign = out.is_dir() and not (out / BUNDLE_FILE).is_file() and any(out.iterdir())
    if foreign or (out.exists() and not out.is_dir()):
        raise ConfigError(
            f"{out}: exists and is not a bundle; refusing to replace it. "
            "Hint: choose an empty or new output folder"
        )


def _swap_in(scratch: Path, out: Path) -> None:
    scratch.chmod(0o755)  # mkdtemp made it private; a bundle is read by the service's user
    if not out.exists():
        scratch.rename(out)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{out.name}-old-", dir=out.parent))
    out.rename(old / "bundle")
    scratch.rename(out)
    shutil.rmtree(old, ignore_errors=True)


def _target_plan(
    target: str,
    manifest: Manifest,
    backend: str | None,
    source: Path,
    signature: Signature,
    model: Path,
) -> TargetPlan:
    kind = _target_kind(target, source)
    kind.check_name(manifest.function.name)  # a cluster's refusal, before "built"
    fits = kind.backends
    if backend is not None and backend not in BY_NAME:
        raise ConfigError(f"backend {backend!r}: unknown; expected one of {list(BY_NAME)}")
    wanted = (backend,) if backend else manifest.backend.prefer
    declined = {name: why for name in wanted if (why := BY_NAME[name].declines(signature, model))}
    backends = tuple(name for name in wanted if name in fits and name not in declined)
    if not backends:
        asked = (
            "the backend override"
            if backend
            else f"{source / MANIFEST_NAME}: field `backend.prefer`"
        )
        if all(name in fits for name in wanted):  # each runs here, and declines the model
            reasons = "; ".join(declined.values())
            raise ConfigError(f"{asked}: {list(wanted)} cannot serve this model: {reasons}")
        why = "".join(f"; {reason}" for reason in declined.values())
        fix = "force one of them" if backend else "add one of them to `prefer`, or leave it out"
        raise ConfigError(
            f"{asked}: {list(wanted)} has no backend that runs on target {target!r} (platform "
            f"{kind.platform}: {list(fits)}){why}. Hint: {fix}, or build for a target whose "
            f"platform runs {list(wanted)}"
        )
    requirements = pinned_requirements(kind, backends, manifest)
    not_planned = tuple((name, why) for name, why in declined.items() if name in fits)
    return TargetPlan(target_name(target), kind.platform, backends, requirements, not_planned)


def _target_kind(target: str, source: Path) -> TargetKind:
    """A known target kind as given, else the kind of the target profile of that name."""
    if target in KINDS:
        return KINDS[target]
    return KINDS[load_target(target, source).driver]
