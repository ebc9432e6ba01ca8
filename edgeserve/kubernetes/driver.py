"""The knative, kserve and kubernetes drivers: one image per function, its manifests, and the
rollout (push, apply, wait for Ready, move traffic) against the user's cluster.

`package` (what `edgeserve build --target knative` runs) builds the image and writes the
manifests and the image report beside it; `deploy` also pushes the image to the profile's
registry, renders the manifests with the image's digest and hands them to the rollout of the
kind (rollouts.py), which talks to the cluster named by the user's kubeconfig and context.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgeserve.backends import BACKENDS
from edgeserve.errors import ConfigError
from edgeserve.image import BuiltImage, build_image, find_tool, plan_image, push_image
from edgeserve.kinds import KINDS
from edgeserve.kubernetes.manifests import Workload, min_replicas, render, to_yaml
from edgeserve.kubernetes.scaling import concurrency_for
from edgeserve.kubernetes.settings import KubernetesSettings
from edgeserve.manifest import TRITON_GRPC_PORT, ResourcesSection
from edgeserve.requirements import pin
from edgeserve.targets import DeployResult

if TYPE_CHECKING:
    from edgeserve.bundle import Bundle
    from edgeserve.image.plan import ImagePlan
    from edgeserve.profiles import TargetProfile

_CPU_PACKAGES = [b.package for b in BACKENDS if "cpu" in b.platforms and b.package]
CPU_BACKEND_PACKAGES = re.compile(rf"^({'|'.join(map(re.escape, _CPU_PACKAGES))})([=<>!~ ].*)?$")


@dataclass(frozen=True)
class KubernetesDriver:
    """The Driver of one kind: `knative`, `kserve` or `kubernetes`."""

    kind: str

    def package(self, bundle: Bundle, profile: TargetProfile, out: Path) -> Path:
        """Build the image (tagged, not pushed) and write manifests.yaml, Containerfile and
        image.txt (size and per-layer cost) into `out`."""
        settings = self.checked(bundle, profile)
        plan = image_plan(bundle, profile.name, settings)
        built = build_image(plan, find_tool(settings.image_tool), {"bundle": bundle.root})
        out.mkdir(parents=True, exist_ok=True)
        (out / "Containerfile").write_text(plan.containerfile(), encoding="utf-8")
        (out / "image.txt").write_text("\n".join(built.describe()) + "\n", encoding="utf-8")
        manifests = out / "manifests.yaml"
        manifests.write_text(self.manifests_yaml(bundle, settings, built.reference))
        return manifests

    def manifests_yaml(self, bundle: Bundle, settings: KubernetesSettings, image: str) -> str:
        return to_yaml(render(self.kind, workload(bundle, settings, image)))

    def deploy(self, bundle: Bundle, profile: TargetProfile) -> DeployResult:
        from edgeserve.kubernetes.rollouts import rollout_for

        settings = self.checked(bundle, profile)
        if not settings.registry:
            raise ConfigError(
                f"{profile.source}: settings.registry is empty; a cluster pulls images from a "
                f'registry. Hint: registry = "registry.example.com/team" in a {profile.name}.toml '
                "of your own (a copy of this one) in the function's folder or ./targets/, which "
                f"--target {profile.name} finds first"
            )
        rollout = rollout_for(self.kind, settings)  # the kubeconfig read before any image is built
        built = self.push(bundle, profile.name, settings)
        manifests = render(self.kind, workload(bundle, settings, built.digest or built.reference))
        return rollout.deploy(bundle.name, bundle.version, manifests)

    def settings(self, profile: TargetProfile) -> KubernetesSettings:
        """The profile's settings, refused before any image is built where this kind cannot
        honour them (plain Kubernetes cannot scale to zero)."""
        settings = profile.settings_as(KubernetesSettings)
        if self.kind == "kubernetes":
            min_replicas(settings, f"{profile.source} [settings]")
        return settings

    def checked(self, bundle: Bundle, profile: TargetProfile) -> KubernetesSettings:
        """The settings, once the manifests render: what this kind cannot run (a name too
        long, gRPC beside HTTP on Knative's one port) is refused before any image is built."""
        KINDS[self.kind].check_name(bundle.name)
        settings = self.settings(profile)
        try:
            render(self.kind, workload(bundle, settings, "unbuilt"))
        except ConfigError as exc:
            raise ConfigError(f"{profile.source}: {exc}") from None
        return settings

    def push(self, bundle: Bundle, target: str, settings: KubernetesSettings) -> BuiltImage:
        tool = find_tool(settings.image_tool)
        built = build_image(image_plan(bundle, target, settings), tool, {"bundle": bundle.root})
        digest = push_image(tool, built.reference, tls_verify=settings.registry_tls_verify)
        return BuiltImage(
            built.reference, built.size_bytes, built.layers, built.tool, built.python, digest
        )

    def status(self, name: str, profile: TargetProfile) -> dict[str, Any]:
        from edgeserve.kubernetes.rollouts import rollout_for

        return rollout_for(self.kind, profile.settings_as(KubernetesSettings)).status(name)

    def rollback(self, name: str, profile: TargetProfile) -> DeployResult:
        from edgeserve.kubernetes.rollouts import rollout_for

        return rollout_for(self.kind, profile.settings_as(KubernetesSettings)).rollback(name)


def image_plan(bundle: Bundle, target: str, settings: KubernetesSettings) -> ImagePlan:
    """The function's image: tag `<version>-<hash12>`, the target's pinned requirements (the
    CPU backends swapped for `gpu_package` on a GPU profile)."""
    tag = f"{bundle.version}-{bundle.content_hash[:12]}"
    grpc = grpc_port(bundle.manifest.resources, settings)
    labels = (
        ("org.opencontainers.image.title", bundle.name),
        ("org.opencontainers.image.version", bundle.version),
        ("dev.edgeserve.content-hash", bundle.content_hash),
    )
    return plan_image(
        settings.image_repository(bundle.name),
        tag,
        settings.base_image,
        image_requirements(bundle.requirements(target), settings, grpc is not None),
        port=settings.port,
        grpc_port=grpc,
        serve_args=settings.serve_args,
        labels=labels,
    )


def image_requirements(
    pinned: list[str], settings: KubernetesSettings, grpc: bool = False
) -> tuple[str, ...]:
    """The bundle's pins (or the profile's), grpcio added where the profile alone asks for
    gRPC (a function's [resources] grpc_port pins it in the bundle already)."""
    if settings.requirements is not None:
        return settings.requirements
    kept = [line for line in pinned if not (settings.gpu and CPU_BACKEND_PACKAGES.match(line))]
    if settings.gpu:
        kept.append(settings.gpu_package)
    if grpc and not any(line.startswith("grpcio") for line in kept):
        kept.append(pin("grpcio"))
    return tuple(kept)


def workload(bundle: Bundle, settings: KubernetesSettings, image: str) -> Workload:
    """Everything the manifests need, from the bundle and the profile."""
    manifest = bundle.manifest
    return Workload(
        name=bundle.name,
        version=bundle.version,
        image=image,
        settings=settings,
        concurrency=concurrency_for(
            manifest.batching,
            bundle.signature.batched,
            settings.target,
            settings.container_concurrency,
        ),
        memory_mb=settings.memory_mb or manifest.resources.memory_mb,
        request_timeout_s=manifest.batching.timeout_ms / 1000,
        drain_s=manifest.resources.drain_timeout_s,
        grpc_port=grpc_port(manifest.resources, settings),
    )


def grpc_port(resources: ResourcesSection, settings: KubernetesSettings) -> int | None:
    """The container's gRPC port (None: HTTP only): the profile's, else the function's;
    `protocol = "http"` turns it off, `protocol = "grpc"` turns it on (Triton's 8001)."""
    if settings.protocol == "http":
        return None
    port = settings.grpc_port or resources.fixed_grpc_port
    if port is None and settings.protocol == "grpc":
        port = TRITON_GRPC_PORT
    if port == settings.port:
        raise ConfigError(
            f"gRPC port {port} ([resources] grpc_port) is the profile's HTTP port too "
            "([settings] port). Hint: set [settings] grpc_port to another port"
        )
    return port


KNATIVE = KubernetesDriver("knative")
KSERVE = KubernetesDriver("kserve")
KUBERNETES = KubernetesDriver("kubernetes")
