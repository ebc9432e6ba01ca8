"""What `edgeserve doctor` reports: the machine (platform, backends, image tools) and, given a
function, a `Finding` per step of serving it here (edgeserve.examination), as tables.

A finding's verdict is `ok`, `note` (worth knowing, not wrong), `fail` (carrying the error of
the tree that the step raised, whose exit code the command exits with: the worst one's) or
`skipped` (an earlier failure left nothing to check it on).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, replace
from typing import Literal

from rich.table import Table
from rich.text import Text

from edgeserve.backends import Choice, choose, probe
from edgeserve.errors import EdgeserveError
from edgeserve.hardware import describe
from edgeserve.image.tools import describe_tools
from edgeserve.manifest import Manifest
from edgeserve.signature import unbatchable
from edgeserve.types import Signature, TensorSpec

Verdict = Literal["ok", "note", "fail", "skipped"]
STYLES: dict[Verdict, str] = {"ok": "green", "note": "yellow", "fail": "bold red", "skipped": "dim"}
HINT = "Hint: "


@dataclass(frozen=True)
class Finding:
    """One step of serving a function here: what it found and, where something is wrong or
    could be better, what to do (`hint`)."""

    check: str
    verdict: Verdict
    found: str
    hint: str = ""
    error: EdgeserveError | None = None

    @classmethod
    def failed(cls, check: str, error: EdgeserveError, hint: str = "", said: str = "") -> Finding:
        """The step's error as its finding, after what the step `said` first: the message,
        and its own hint apart (most errors of the tree end in "Hint: ..."), then `hint`
        where the step knows more."""
        found, _, own = error.message.partition(HINT)
        hints = "; ".join(part for part in (own, hint) if part)
        return cls(check, "fail", said + found.rstrip(" .;"), hints, error)

    @classmethod
    def skipped(cls, check: str, why: str) -> Finding:
        return cls(check, "skipped", why)

    def renamed(self, path: str, shown: str) -> Finding:
        """The finding with `path` (a file doctor made) named as `shown` (the user's)."""
        return replace(
            self, found=self.found.replace(path, shown), hint=self.hint.replace(path, shown)
        )


@dataclass(frozen=True)
class Report:
    """A function's findings, in the order serving meets them."""

    subject: str
    findings: tuple[Finding, ...]

    @property
    def problems(self) -> tuple[Finding, ...]:
        return tuple(finding for finding in self.findings if finding.error is not None)

    @property
    def exit_code(self) -> int:
        """The error tree's exit code of the worst problem (the highest: 2, a function to fix,
        above 1, a failure of a backend or of this machine), 0 with none."""
        return max((f.error.exit_code for f in self.findings if f.error is not None), default=0)

    def summary(self) -> str:
        checks = ", ".join(dict.fromkeys(finding.check for finding in self.problems))
        count = len(self.problems)
        return f"doctor: {count} problem{'s' if count > 1 else ''} with {self.subject} ({checks})"


def model_finding(signature: Signature, manifest: Manifest) -> Finding:
    """A model's tensors in brief: what a request sends and gets back, and how it batches."""
    inputs = ", ".join(_tensor(spec) for spec in signature.inputs)
    outputs = ", ".join(_tensor(spec, output=True) for spec in signature.outputs)
    tensors = f"inputs {inputs}; outputs {outputs}"
    max_batch = manifest.batching.max_batch_size
    if not signature.batched:
        said = f"{tensors}; no batch axis ({unbatchable(signature)}): requests run alone"
        return Finding("model", "note", said, "export the model with a dynamic batch axis")
    if max_batch == 0:
        return Finding("model", "ok", f"{tensors}; batching off ([batching] max_batch_size = 0)")
    return Finding("model", "ok", f"{tensors}; batch axis 0, up to {max_batch} rows a batch")


def _tensor(spec: TensorSpec, output: bool = False) -> str:
    """`image FP32 [-1, 1, 32, -1] (pads axis 3 with 0)`: what a request sends or gets."""
    notes = ["optional"] if spec.optional else []
    if spec.pad_axis is not None and not output:
        notes.append(f"pads axis {spec.pad_axis} with {spec.pad_value:g}")
    elif spec.pad_axis is not None:
        ratio = f" x {spec.ratio:g}" if spec.ratio != 1.0 else ""
        notes.append(f"axis {spec.pad_axis} follows {spec.follows or 'the padded input'}{ratio}")
    said = f" ({', '.join(notes)})" if notes else ""
    return f"{spec.name} {spec.datatype} {spec.shown}{said}"


def requirements_finding(
    requirements: tuple[str, ...], unmet: list[tuple[str, str | None]]
) -> Finding:
    """[handler] requirements against what is installed here (`unmet`: each with the version
    installed, None where none is), and the pip command that meets them."""
    if not unmet:
        return Finding("requirements", "ok", f"installed: {', '.join(requirements)}")
    listed = ", ".join(
        f"{text} ({f'{v} installed' if v else 'not installed'})" for text, v in unmet
    )
    command = "pip install " + " ".join(shlex.quote(text) for text, _ in unmet)
    return Finding.failed(
        "requirements",
        EdgeserveError(f"[handler] requirements not met here: {listed}. {HINT}{command}"),
    )


def machine_table(backend: str | None) -> tuple[Table, EdgeserveError | None]:
    """The probe, the backend chosen for any function (or `backend`, forced) and why, and the
    image tools; with the refusal of a forced backend that cannot run here, shown in its row
    rather than raised, so that a function's rows still follow."""
    platform = probe()
    refused = None
    try:
        choice = choose(platform, override=backend)
    except EdgeserveError as exc:
        if backend is None:
            raise
        choice, refused = Choice(backend, exc.message), exc
    table = Table(title="edgeserve doctor", show_header=False)
    for key, value in [*describe(platform, choice), *describe_tools()]:
        table.add_row(Text(key), Text(value))
    return table, refused


def render(report: Report) -> Table:
    """The findings as a table, a hint under what it is about; plain text throughout (a path
    or a backend's words in brackets are not markup)."""
    table = Table(title=f"{report.subject} on this machine")
    for column in ("check", "verdict", "found"):
        table.add_column(column)
    for finding in report.findings:
        found = Text(finding.found)
        if finding.hint:
            found.append(f"\nhint: {finding.hint}", style="cyan")
        verdict = Text(finding.verdict, style=STYLES[finding.verdict])
        table.add_row(Text(finding.check), verdict, found)
    return table
