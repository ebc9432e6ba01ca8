"""The runtime requirements a bundle pins per target: what the runtime imports, the target
kind's server (and grpcio where the function serves gRPC beside it), each planned backend's
package, then the handler's own [handler] requirements."""

from __future__ import annotations

from importlib import metadata as package_metadata

from edgeserve.backends import BY_NAME
from edgeserve.kinds import TargetKind
from edgeserve.manifest import Manifest

RUNTIME_PACKAGES = (
    "msgpack",
    "numpy",
    "orjson",
    "prometheus-client",
    "pydantic",
    "starlette",
)
"""What the runtime itself imports, on every target; the kind adds its server, each planned
backend its own package (backends.BY_NAME[name].package). Not onnx: a bundle carries its
signature, so only building reads the model with it (23 MB less in a Lambda zip)."""


def pinned_requirements(
    kind: TargetKind, backends: tuple[str, ...], manifest: Manifest
) -> tuple[str, ...]:
    """Every package a target running `backends` on `kind` needs, pinned to this machine's."""
    packages = {*RUNTIME_PACKAGES, *kind.server}
    if manifest.resources.grpc_port is not None and "uvicorn" in kind.server:
        packages.add("grpcio")  # gRPC serves beside uvicorn; Lambda has no port to serve it on
    packages |= {package for name in backends if (package := BY_NAME[name].package)}
    pinned = [pin(name) for name in sorted(packages)]
    return (*pinned, *manifest.handler.requirements)


def unpinned(requirements: tuple[str, ...], backend: str, kept: tuple[str, ...]) -> tuple[str, ...]:
    """`requirements` less `backend`'s package pin, unless a `kept` backend needs it too."""
    package = BY_NAME[backend].package
    needed = {BY_NAME[name].package for name in kept}
    pinned = pin(package) if package and package not in needed else None
    return tuple(line for line in requirements if line != pinned)


def requirements_text(target: str, requirements: tuple[str, ...]) -> str:
    header = f"# runtime requirements of target {target}, pinned by `edgeserve build`\n"
    return header + "".join(f"{line}\n" for line in requirements)


def pin(package: str) -> str:
    """`package==<the version installed here>`, or the bare name where it is not installed."""
    version = installed_version(package)
    return f"{package}=={version}" if version else package


def installed_version(package: str) -> str | None:
    try:
        return package_metadata.version(package)
    except package_metadata.PackageNotFoundError:
        return None
