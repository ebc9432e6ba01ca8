"""Build an ImagePlan into a real image: stage the context, build, measure; push by digest.

The context is staged in a scratch folder: `packages/` from pip (`--target`, `--platform` per
manylinux tag the base's glibc accepts, `--python-version` of the base, binary wheels only),
`edgeserve/` from the installed package, `bundle/` from the bundle. The base is probed by
running its python3 once, so the wheels always match the image's Python and architecture.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import edgeserve
from edgeserve.errors import DeployError
from edgeserve.image.plan import BasePython, ImagePlan
from edgeserve.image.tools import ImageTool
from edgeserve.wheels import install_wheels

_PROBE = (
    "import platform, sys; print(sys.version_info[0], sys.version_info[1]); "
    "print(platform.machine()); print(platform.libc_ver()[1])"
)
_BUILD_TIMEOUT_S = 1800
PRUNED = ("*/tests", "*/*/tests", "*/*/*/tests", "onnx/backend/test/data")


@dataclass(frozen=True)
class LayerSize:
    """One layer of the built image: its size and the Containerfile step that made it."""

    size_bytes: int
    step: str


@dataclass(frozen=True)
class BuiltImage:
    """A built image: its reference, size and layers; `digest` once pushed."""

    reference: str
    size_bytes: int | None
    layers: tuple[LayerSize, ...]
    tool: str
    python: BasePython
    digest: str | None = None

    def describe(self) -> list[str]:
        """Lines for the CLI: the total, then each layer, largest cost first in build order."""
        mb = 1024 * 1024
        total = f"{self.size_bytes / mb:.1f} MB" if self.size_bytes is not None else "unknown"
        lines = [
            f"image {self.reference}: {total} (built with {self.tool}, "
            f"Python {self.python.version} {self.python.machine})"
        ]
        lines += [f"  {layer.size_bytes / mb:8.1f} MB  {layer.step}" for layer in self.layers]
        return lines


def build_image(
    plan: ImagePlan,
    tool: ImageTool,
    sources: dict[str, Path],
    *,
    context: Path | None = None,
) -> BuiltImage:
    """Build `plan` with `tool`; `sources` maps a layer name to the folder it copies
    (`packages` and `edgeserve` are staged here and need no source). With `context`, the
    build context (Containerfile included) is staged there and kept, else in a scratch folder."""
    python = probe_base(tool, plan.base, plan.platform)
    with tempfile.TemporaryDirectory(prefix="edgeserve-image-") as scratch:
        folder = context or Path(scratch)
        if folder.exists() and context is not None:
            shutil.rmtree(folder)
        folder.mkdir(parents=True, exist_ok=True)
        _stage(plan, python, sources, folder)
        (folder / "Containerfile").write_text(plan.containerfile(), encoding="utf-8")
        platform = ["--platform", plan.platform] if plan.platform else []
        build = [
            "build",
            *platform,
            "-f",
            str(folder / "Containerfile"),
            "-t",
            plan.reference,
            str(folder),
        ]
        _run(tool, build, "build", timeout_s=_BUILD_TIMEOUT_S)
    size, layers = image_size(tool, plan.reference), layer_sizes(tool, plan.reference)
    return BuiltImage(plan.reference, size, layers, tool.name, python)


def probe_base(tool: ImageTool, base: str, platform: str | None = None) -> BasePython:
    """Run the base's python3 once: its version, machine and glibc decide the wheels (for
    another `platform` the machine needs its emulation, binfmt/qemu, as any such build does)."""
    try:
        return _probe(tool, base, platform)
    except DeployError as exc:
        raise DeployError(
            f"{exc.message}. Hint: the base image {base} is pulled unless {tool.name} has it "
            "already; where its registry cannot be reached, set `base_image` in the target "
            "profile to a local image with python3 (docs/kubernetes.md)"
        ) from None


def _probe(tool: ImageTool, base: str, platform: str | None) -> BasePython:
    chosen = ["--platform", platform] if platform else []
    if tool.name == "buildah":
        container = _run(tool, ["from", "--quiet", *chosen, base], "probe the base").strip()
        try:
            out = _run(
                tool,
                ["run", "--network", "none", container, "--", "python3", "-c", _PROBE],
                "probe the base",
            )
        finally:
            _run(tool, ["rm", container], "probe the base")
    else:
        out = _run(
            tool,
            [
                "run",
                "--rm",
                "--network",
                "none",
                *chosen,
                "--entrypoint",
                "python3",
                base,
                "-c",
                _PROBE,
            ],
            "probe the base",
        )
    major_minor, machine, glibc = out.split("\n")[:3]
    return BasePython(major_minor.replace(" ", "."), machine, glibc)


def push_image(tool: ImageTool, reference: str, *, tls_verify: bool = True) -> str:
    """Push `reference` to its registry; returns `repository@sha256:...` (pull by digest)."""
    repository = reference.rsplit(":", 1)[0] if "/" in reference else reference
    if tool.name == "docker":
        _run(tool, ["push", reference], "push")
        digests = _run(
            tool, ["image", "inspect", "--format", '{{join .RepoDigests "\\n"}}', reference], "push"
        ).split()
        mine = [d for d in digests if d.startswith(f"{repository}@")]
        if not mine:
            raise DeployError(f"docker push {reference}: no digest recorded for {repository}")
        return mine[0]
    with tempfile.TemporaryDirectory(prefix="edgeserve-push-") as scratch:
        digest_file = Path(scratch) / "digest"
        tls = [] if tls_verify else ["--tls-verify=false"]
        _run(tool, ["push", *tls, "--digestfile", str(digest_file), reference], "push")
        return f"{repository}@{digest_file.read_text().strip()}"


def image_size(tool: ImageTool, reference: str) -> int | None:
    if tool.name == "buildah":
        return None
    return int(_run(tool, ["image", "inspect", "--format", "{{.Size}}", reference], "inspect"))


def layer_sizes(tool: ImageTool, reference: str) -> tuple[LayerSize, ...]:
    """Each layer's size in bytes, base first (history lists newest first)."""
    if tool.name == "buildah":
        return ()
    if tool.name == "podman":  # podman's templates print sizes for humans; its JSON does not
        rows = json.loads(
            _run(tool, ["history", "--no-trunc", "--format", "json", reference], "inspect")
        )
        pairs = [(int(row["size"]), row["CreatedBy"]) for row in rows]
    else:
        out = _run(
            tool,
            [
                "history",
                "--human=false",
                "--no-trunc",
                "--format",
                "{{.Size}}\t{{.CreatedBy}}",
                reference,
            ],
            "inspect",
        )
        pairs = [
            (int(size), step)
            for size, step in (line.split("\t", 1) for line in out.splitlines() if "\t" in line)
        ]
    return tuple(LayerSize(size, _step(step)) for size, step in reversed(pairs))


def _step(created_by: str) -> str:
    """`/bin/sh -c #(nop) COPY dir:abc... in /opt/x` -> `COPY ... in /opt/x` (readable)."""
    step = created_by.removeprefix("/bin/sh -c ").removeprefix("#(nop) ").strip()
    return re.sub(r"(dir|file):[0-9a-f]{64}", r"\1", step)


def _stage(plan: ImagePlan, python: BasePython, sources: dict[str, Path], context: Path) -> None:
    for layer in plan.layers:
        folder = context / layer.name
        if layer.name == "packages":
            folder.mkdir()
            install_wheels(
                plan.requirements,
                folder,
                platforms=python.pip_platforms(),
                python_version=python.version,
                hint="every pinned version needs a binary wheel for the base image's Python; "
                "pick a base whose Python matches the build's, or set `requirements` in the "
                "profile",
            )
            prune(folder)
        elif layer.name == "edgeserve":
            _copy_tree(Path(edgeserve.__file__).parent, folder / "edgeserve")  # + templates
        else:
            _copy_tree(sources[layer.name], folder)


def prune(packages: Path) -> None:
    """Drop what no server imports: the packages' own test suites (numpy's and onnx's test
    data alone are about 35 MB of a 190 MB layer)."""
    for pattern in PRUNED:
        for path in sorted(packages.glob(pattern), reverse=True):
            if path.is_dir():
                shutil.rmtree(path)


def _copy_tree(source: Path, dest: Path) -> None:
    """Every file but compiled bytecode (the image compiles its own)."""
    for path in sorted(source.rglob("*")):
        relative = path.relative_to(source)
        if path.is_file() and "__pycache__" not in relative.parts and path.suffix != ".pyc":
            (dest / relative).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, dest / relative)


def _run(tool: ImageTool, args: list[str], step: str, *, timeout_s: float = 300) -> str:
    command = tool.argv(*args)
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except subprocess.TimeoutExpired:
        raise DeployError(f"{tool.name} {step}: no answer after {timeout_s:.0f}s") from None
    if done.returncode != 0:
        raise DeployError(
            f"{tool.name} {step} failed ({' '.join(command[:3])} ...): "
            f"{done.stderr.strip()[-1500:] or done.stdout.strip()[-1500:]}"
        )
    return done.stdout
