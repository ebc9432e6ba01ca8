"""The `[settings]` of a knative, kserve or kubernetes target profile (one schema, three kinds)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from edgeserve.validation import StrictTable

_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$"
"""A DNS-1123 subdomain: what the API server takes as the name of a ServiceAccount or Secret."""
_REGISTRY = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?(:[0-9]+)?(/[a-z0-9]+([._-]+[a-z0-9]+)*)*/?$"
"""host[:port][/path], lowercase, no scheme: what prefixes an image reference."""
KUBECONFIG_ENV = "KUBECONFIG"


class KubernetesSettings(StrictTable):
    """One function = one service with its own autoscaler, replicas and image."""

    registry: str = Field(default="", pattern=r"^$|" + _REGISTRY)
    """Where images go: `registry.example.com/team`; the image is `<registry>/<function>`."""
    registry_tls_verify: bool = True
    base_image: str = "gcr.io/distroless/python3-debian12:nonroot"
    image_tool: Literal["auto", "podman", "buildah", "docker"] = "auto"
    requirements: tuple[str, ...] | None = None
    """Replaces the bundle's pinned requirements in the image."""
    gpu_package: str = "onnxruntime-gpu"
    """With `gpu`, replaces the CPU backends' packages (openvino, onnxruntime) in the image."""
    serve_args: tuple[str, ...] = ()
    """Appended to `edgeserve serve` in the image (the process layout, e.g. `--workers`)."""

    namespace: str = Field(default="default", pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
    kubeconfig: str | None = None
    context: str | None = None
    service_account: str | None = Field(default=None, pattern=_SUBDOMAIN)
    image_pull_secret: str | None = Field(default=None, pattern=_SUBDOMAIN)
    port: int = Field(default=8080, ge=1, le=65535)
    grpc_port: int | None = Field(default=None, ge=1, le=65535)
    """KServe v2 over gRPC on this port; default: the function's [resources] grpc_port."""
    protocol: Literal["http", "grpc"] | None = None
    """What the one port of a Knative or KServe container serves, where the function asks for
    gRPC too (Knative routes one port, HTTP/1 or h2c); "http" also turns gRPC off elsewhere."""

    min_scale: int = Field(default=0, ge=0)
    max_scale: int = Field(default=10, ge=1)
    initial_scale: int | None = Field(default=None, ge=0)
    scale_down_delay_s: int = Field(default=0, ge=0, le=3600)
    target: int | None = Field(default=None, ge=1)
    """Soft per-pod concurrency the autoscaler aims at; default derived from [batching]."""
    container_concurrency: int | None = Field(default=None, ge=0)
    """Hard per-pod limit; default derived from [batching]; 0 = unlimited."""
    target_utilization_percent: int = Field(default=70, ge=1, le=100)

    cpu: str = Field(default="1", pattern=r"^([0-9]+(\.[0-9]+)?|[0-9]+m)$")
    """Cores requested, as Kubernetes writes them ("1", "0.5", "1500m")."""
    memory_mb: int | None = Field(default=None, ge=64)
    """Default: the function's [resources] memory_mb."""
    gpu: int = Field(default=0, ge=0)
    ready_timeout_s: float = Field(default=300, gt=0, le=86400)
    request_timeout_s: float = Field(default=30, gt=0)
    """How long one API request may wait for the server's answer (connect and each read)."""

    @model_validator(mode="after")
    def _consistent(self) -> KubernetesSettings:
        if self.grpc_port == self.port:
            raise ValueError(f"grpc_port {self.grpc_port} is the HTTP port too (`port`)")
        if self.min_scale > self.max_scale:
            raise ValueError(
                f"min_scale {self.min_scale} is above max_scale {self.max_scale}, which every "
                "autoscaler refuses (Knative, KServe, HPA)"
            )
        return self

    @property
    def cores(self) -> int:
        """Whole cores the CPU request gives (at least 1): what `serve` plans its processes
        for (EDGESERVE_CORES), rather than the node's every core."""
        amount = int(self.cpu[:-1]) / 1000 if self.cpu.endswith("m") else float(self.cpu)
        return max(1, int(amount))

    def image_repository(self, function: str) -> str:
        """`<registry>/<function>`, or a local name (`localhost/<function>`) with no registry."""
        return (
            f"{self.registry.rstrip('/')}/{function}" if self.registry else f"localhost/{function}"
        )

    def kubeconfig_path(self) -> Path | None:
        """The profile's kubeconfig, else $KUBECONFIG (first entry), else the client's default."""
        given = self.kubeconfig or os.environ.get(KUBECONFIG_ENV, "").split(os.pathsep)[0]
        return Path(given).expanduser() if given else None
