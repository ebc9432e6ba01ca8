"""What build says of a source before it writes a bundle: its checks (the batch axis, the
handler's dry run on the samples, OpenVINO's drift from fp32), a backend that refused the model
or that the plan passed over, and an earlier build it replaced."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from edgeserve.dryrun import DryRun, SkippedCheck, check_batch_axis, dry_run
from edgeserve.manifest import load_manifest
from edgeserve.precision import PrecisionCheck, SkippedPrecision, check_precision

if TYPE_CHECKING:
    from edgeserve.builder import BuildPlan


@dataclass(frozen=True)
class Replaced:
    """An earlier build in the output folder, replaced by this one: said, since what was
    tested or deployed from that folder is gone (the hash tells which build it was)."""

    out: Path
    content_hash: str  # "": its edgeserve.json recorded none
    # the targets each was planned for: `build --target aws-lambda` writes the same folder as a
    # local build (docs/aws-lambda.md serves it --emulate from there), so `serve` of that folder
    # then runs the Lambda plan; said where they differ
    targets: tuple[str, ...] = ()
    now: tuple[str, ...] = ()
    backends: tuple[str, ...] = ()  # the new plan's
    new_hash: str = ""

    def describe(self) -> str:
        which = f" (hash {self.content_hash[:12]})" if self.content_hash else ""
        said = f"replaced the earlier build in {self.out}{which}"
        if self.content_hash and self.content_hash == self.new_hash:
            said = f"rebuilt {self.out}: the same bundle as before (hash {self.new_hash[:12]})"
        if not self.targets or set(self.targets) == set(self.now):
            return said
        return (
            f"{said}, planned for {', '.join(self.targets)}: this one is planned for "
            f"{', '.join(self.now)}, so `edgeserve serve {self.out}` serves that plan "
            f"({', '.join(self.backends)})"
            + ("" if "local" in self.now else ". Hint: --out elsewhere keeps a local build")
        )


@dataclass(frozen=True)
class Refused:
    """A backend of the plan that could not prepare the model (OpenVINO has no conversion for
    an op): the bundle plans the others, and says so, since a machine whose first choice it
    was will serve on the next one."""

    backend: str
    reason: str
    planned: tuple[str, ...]  # what the bundle plans instead, best first

    def describe(self) -> str:
        return (
            f"warning: {self.backend} refuses the model, so the bundle plans "
            f"{', '.join(self.planned)} only: {self.reason}"
        )


@dataclass(frozen=True)
class PassedOver:
    """A backend of the plan that would not serve the model as written, known from the model
    alone (string tensors, INT64 outputs computed in 32 bits: `Backend.declines`): a fact about
    the model, not a failure, so said as the plan, not warned of on every build."""

    backend: str
    reason: str
    planned: tuple[str, ...]

    def describe(self) -> str:
        return f"plan: {', '.join(self.planned)}, not {self.backend}: {self.reason}"


Check = PrecisionCheck | DryRun | SkippedCheck | SkippedPrecision | Replaced | Refused | PassedOver
"""What build reports (each has `describe()`): its checks before writing a bundle (the skipped
ones warn), a backend that refused the model (a warning) or that the plan passed over (said as
the plan), and an earlier bundle it replaced."""

log = logging.getLogger("edgeserve")


def log_check(check: Check) -> None:
    """Build's checks of a source opened by serve, deploy or the Lambda emulator, in the log
    (`edgeserve build` prints them instead); a check that could not run as a warning."""
    said = check.describe()
    if said.startswith("warning: "):  # the level says "warning" already
        log.warning("%s", said.removeprefix("warning: "))
    else:
        log.info("%s", said)


def check_source(source: Path, plan: BuildPlan) -> list[Check]:
    """Build's checks of a source before anything is written, each raising what it refuses:
    the batch axis (`dryrun.check_batch_axis`; a SkippedCheck where it could not run), the
    handler on the samples (`dryrun.dry_run`), and OpenVINO's drift from fp32 where a target
    plans it (`precision.check_precision`). `build` and `open_or_build` (serve, bench, deploy
    and the Lambda emulator on a source folder) both run them: what one refuses, so does the
    other."""
    manifest = load_manifest(source)  # the source's own: the plan's points into the bundle
    planned = "openvino" in plan.backends  # the precision check measures OpenVINO's drift
    done = (
        check_batch_axis(source, manifest, plan.signature),
        dry_run(source, manifest, plan.signature),
        check_precision(source, manifest, plan.signature) if planned else None,
    )
    return [check for check in done if check is not None]
