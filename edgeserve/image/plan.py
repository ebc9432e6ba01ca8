"""What an image holds and in which order, as data: the Containerfile is rendered from it.

Layers go from the least to the most often changed, so a new model version rebuilds and
pushes only its own small layer:

    base image              configurable (the profile's `base_image`)
    /opt/edgeserve/packages the pinned wheels, installed for the base's Python and architecture
    (their .pyc)            compiled by the image's own Python: a cold start never compiles
    /opt/edgeserve/app      the edgeserve package (and its .pyc)
    /opt/edgeserve/bundle   the bundle (model, handler, manifest)

No package manager runs in the image (the wheels are installed beside it by pip's
`--platform` options), so any base with a glibc Python 3 works, distroless included.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from edgeserve.errors import ConfigError

ROOT = "/opt/edgeserve"
PACKAGES = f"{ROOT}/packages"
APP = f"{ROOT}/app"
BUNDLE = f"{ROOT}/bundle"
NONROOT = "65532:65532"
"""The numeric user of distroless' `nonroot`: numeric, so Kubernetes' runAsNonRoot can check it."""


@dataclass(frozen=True)
class BasePython:
    """The base image's Python, probed by running it: the wheels are chosen for it."""

    version: str  # "3.11"
    machine: str  # "x86_64" | "aarch64"
    glibc: str  # "2.36"

    def pip_platforms(self) -> list[str]:
        """Every manylinux tag this glibc accepts (pip expands only the legacy aliases itself)."""
        major, _, minor = self.glibc.partition(".")
        if major != "2" or not minor.isdigit():
            raise ConfigError(
                f"base image: glibc {self.glibc!r} is not a glibc 2.x; the wheels need a glibc "
                "base. Hint: use a Debian, Ubuntu or distroless base, not Alpine (musl)"
            )
        return [f"manylinux_2_{n}_{self.machine}" for n in range(int(minor), 16, -1)]


@dataclass(frozen=True)
class Layer:
    """A folder of the build context copied to `path` in the image (its Python compiled)."""

    name: str
    path: str
    compiled: bool = False


@dataclass(frozen=True)
class ImagePlan:
    """One function's image: what goes in, how it starts, and what it is called."""

    repository: str  # "registry.example.com/models/ocr"
    tag: str
    base: str
    requirements: tuple[str, ...]
    layers: tuple[Layer, ...]
    command: tuple[str, ...]
    entrypoint: tuple[str, ...] = ()
    workdir: str | None = None
    platform: str | None = None  # "linux/arm64": build for it (else the base's own)
    user: str | None = NONROOT
    port: int | None = None
    grpc_port: int | None = None
    env: tuple[tuple[str, str], ...] = ()
    labels: tuple[tuple[str, str], ...] = field(default=())

    @property
    def reference(self) -> str:
        return f"{self.repository}:{self.tag}"

    def containerfile(self) -> str:
        """The Containerfile: COPY per layer, one RUN (compileall), no shell form anywhere."""
        lines = [
            f"FROM --platform={self.platform} {self.base}" if self.platform else f"FROM {self.base}"
        ]
        if self.labels:
            lines.append("LABEL " + " ".join(f"{k}={json.dumps(v)}" for k, v in self.labels))
        env = {"PYTHONPATH": f"{APP}:{PACKAGES}", "PYTHONDONTWRITEBYTECODE": "1"}
        env |= dict(self.env)
        lines.append("ENV " + " ".join(f"{k}={json.dumps(v)}" for k, v in env.items()))
        for layer in self.layers:
            lines.append(f"COPY --chown=0:0 {layer.name} {layer.path}")
            if layer.compiled:  # by the image's own Python: its .pyc format
                lines.append(_compile(layer.path))
        if self.workdir:
            lines.append(f"WORKDIR {self.workdir}")
        if self.user:
            lines.append(f"USER {self.user}")
        exposed = [str(port) for port in (self.port, self.grpc_port) if port]
        if exposed:
            lines.append(f"EXPOSE {' '.join(exposed)}")
        lines.append("STOPSIGNAL SIGTERM")
        if self.entrypoint:
            lines.append(f"ENTRYPOINT {json.dumps(list(self.entrypoint))}")
        lines.append(f"CMD {json.dumps(list(self.command))}")
        return "\n".join(lines) + "\n"


def plan_image(
    repository: str,
    tag: str,
    base: str,
    requirements: tuple[str, ...],
    *,
    port: int,
    grpc_port: int | None = None,
    serve_args: tuple[str, ...] = (),
    labels: tuple[tuple[str, str], ...] = (),
) -> ImagePlan:
    """The image of a function served by `edgeserve serve` (Knative, KServe, Kubernetes), over
    gRPC too where `grpc_port` is given."""
    command = ("python3", "-m", "edgeserve", "serve", BUNDLE, "--host", "0.0.0.0")  # noqa: S104
    if grpc_port is not None:
        serve_args = ("--grpc-port", str(grpc_port), *serve_args)
    return ImagePlan(
        repository=repository,
        tag=tag,
        base=base,
        requirements=requirements,
        layers=SERVE_LAYERS,
        command=(*command, "--port", str(port), *serve_args),
        port=port,
        grpc_port=grpc_port,
        env=(("HOME", "/tmp"), ("EDGESERVE_CACHE_DIR", "/tmp/edgeserve")),  # noqa: S108
        labels=labels,
    )


SERVE_LAYERS = (
    Layer("packages", PACKAGES, compiled=True),
    Layer("edgeserve", APP, compiled=True),
    Layer("bundle", BUNDLE),
)


def _compile(path: str) -> str:
    # unchecked-hash: the .pyc stays valid whatever the file times; -j0 uses every core
    argv = [
        "python3",
        "-m",
        "compileall",
        "-q",
        "-j",
        "0",
        "--invalidation-mode",
        "unchecked-hash",
        path,
    ]
    return f"RUN {json.dumps(argv)}"
