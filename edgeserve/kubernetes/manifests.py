"""Manifests of one function, as data: Knative Service, KServe InferenceService, or
Deployment + Service + HorizontalPodAutoscaler. Pure: rendering touches no disk and no cluster.

All three run the same container: the image by digest, the HTTP port (and the gRPC one: two
ports on plain Kubernetes, the one port named h2c on Knative and KServe where the profile
chooses `protocol = "grpc"`), readiness on /v2/health/ready (503 while loading, warming up or
draining), liveness on /v2/health/live, memory requested and limited, CPU requested only (a
CPU limit throttles inference and adds latency) and given to `serve` as EDGESERVE_CORES (with
no limit the pod sees the node's every core, and would start processes for them all),
`nvidia.com/gpu` when the profile asks for GPUs, non-root with no privileges.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from typing import Any

from edgeserve.errors import ConfigError
from edgeserve.kubernetes.limits import (
    check_knative_concurrency,
    check_knative_port,
    check_knative_timeout,
    check_label_value,
)
from edgeserve.kubernetes.scaling import Concurrency
from edgeserve.kubernetes.settings import KubernetesSettings
from edgeserve.workers.layout import CORES_VAR

Manifest = dict[str, Any]
KNATIVE_API = "serving.knative.dev/v1"
KSERVE_API = "serving.kserve.io/v1beta1"
AUTOSCALING = "autoscaling.knative.dev"
PRESTOP_SLEEP_S = 5
"""Plain Kubernetes: endpoints stop sending traffic a moment after SIGTERM; wait that out."""


@dataclass(frozen=True)
class Workload:
    """What every manifest is rendered from: the function, its image and its settings."""

    name: str
    version: str
    image: str  # by digest where pushed: repository@sha256:...
    settings: KubernetesSettings
    concurrency: Concurrency
    memory_mb: int
    request_timeout_s: float  # the function's timeout_ms
    drain_s: float  # how long `edgeserve serve` drains after SIGTERM
    grpc_port: int | None = None  # KServe v2 over gRPC in the container; None: HTTP only

    @property
    def grace_s(self) -> int:
        """Seconds Kubernetes waits after SIGTERM: the drain, plus a margin to exit."""
        return math.ceil(self.drain_s) + 5


def knative_service(work: Workload) -> Manifest:
    """A Knative Service: one revision per template, its own KPA autoscaler on concurrency."""
    template: Manifest = {
        "metadata": {"annotations": _kpa(work), "labels": _labels(work)},
        "spec": {
            "containerConcurrency": work.concurrency.limit,
            # Knative gives the pod this long after SIGTERM (terminationGracePeriodSeconds)
            "timeoutSeconds": _knative_timeout(work),
            "containers": [_one_port_container(work, "user-container")],
            **_pod_extras(work.settings),
        },
    }
    template["metadata"]["name"] = revision_name(work.name, template)
    return {
        "apiVersion": KNATIVE_API,
        "kind": "Service",
        "metadata": _metadata(work),
        "spec": {"template": template},
    }


def inference_service(work: Workload) -> Manifest:
    """A KServe InferenceService in Knative mode: `kserve-container`, named as the function
    (KServe routes /v2/models/{name} by host: the model name must be the service name)."""
    settings = work.settings
    predictor: Manifest = {
        "minReplicas": settings.min_scale,
        "maxReplicas": settings.max_scale,
        "scaleMetric": "concurrency",
        "scaleTarget": work.concurrency.target,
        "containerConcurrency": work.concurrency.limit,
        "timeout": _knative_timeout(work),
        "annotations": _kpa(work, bounds=False),
        "labels": _labels(work),
        "containers": [_one_port_container(work, "kserve-container")],
        **_pod_extras(settings),
    }
    meta = _metadata(work)
    meta["annotations"] = {"serving.kserve.io/deploymentMode": "Knative"}
    return {
        "apiVersion": KSERVE_API,
        "kind": "InferenceService",
        "metadata": meta,
        "spec": {"predictor": predictor},
    }


def plain_kubernetes(work: Workload) -> list[Manifest]:
    """Deployment + Service + HPA (CPU utilization: HPA cannot see concurrency without a
    metrics adapter), for clusters without Knative. No scale to zero (HPA's minimum is 1)."""
    settings = work.settings
    if settings.protocol == "grpc":
        raise ConfigError(
            '[settings] protocol = "grpc": plain Kubernetes serves HTTP and gRPC on two ports '
            "of one Service; `protocol` chooses the one port of knative and kserve. Hint: "
            "remove it (grpc_port turns gRPC on beside HTTP)"
        )
    knative_only = [k for k in ("target", "container_concurrency") if getattr(settings, k)]
    if knative_only:
        raise ConfigError(
            f"[settings] {' and '.join(knative_only)}: Knative's per-pod concurrency, which "
            "plain Kubernetes has no autoscaler for (HPA scales on CPU: "
            "target_utilization_percent). Hint: remove it, or deploy with --target knative"
        )
    replicas = min(max(settings.initial_scale or 0, min_replicas(settings)), settings.max_scale)
    selector = {"app.kubernetes.io/name": work.name}
    container = _container(work, name=work.name, port_name="http", probe_port="http")
    ports = [{"name": "http", "port": 80, "targetPort": "http"}]
    if work.grpc_port is not None:
        container["ports"].append(_port("grpc", work.grpc_port))
        grpc = {"name": "grpc", "port": work.grpc_port, "targetPort": "grpc"}
        ports.append({**grpc, "appProtocol": "kubernetes.io/h2c"})
    container["startupProbe"] = _probe(
        "/v2/health/live", "http", period_s=2, failures=math.ceil(settings.ready_timeout_s / 2)
    )
    container["lifecycle"] = {"preStop": {"sleep": {"seconds": PRESTOP_SLEEP_S}}}
    pod = {
        "metadata": {"labels": {**_labels(work), **selector}},
        "spec": {
            "containers": [container],
            "terminationGracePeriodSeconds": work.grace_s + PRESTOP_SLEEP_S,
            **_pod_extras(settings),
        },
    }
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(work),
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": selector},
            # a new version that never becomes ready never replaces a ready pod
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1},
            },
            "template": pod,
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(work),
        "spec": {
            "selector": selector,
            "ports": ports,
        },
    }
    return [deployment, service, _hpa(work)]


def min_replicas(settings: KubernetesSettings, where: str = "[settings]") -> int:
    """The HPA's minimum: `min_scale`, refused rather than raised when 0 (HPA keeps at least
    one pod, so 0 would silently cost a pod the user asked not to pay for)."""
    if settings.min_scale == 0:
        raise ConfigError(
            f"{where} min_scale = 0 (the default when unset): plain Kubernetes (HPA) cannot "
            "scale to zero, it keeps at least 1 replica. Hint: set min_scale = 1 or more, or "
            "deploy with --target knative or --target kserve to scale to zero"
        )
    return settings.min_scale


def revision_name(service: str, template: Manifest) -> str:
    """`<service>-<hash of the template>`: a changed template is a new revision, an unchanged
    one keeps its name (Knative refuses a changed template under an existing name)."""
    digest = hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()
    return f"{service}-{digest[:10]}"


def _hpa(work: Workload) -> Manifest:
    settings = work.settings
    target = {"type": "Utilization", "averageUtilization": settings.target_utilization_percent}
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": _metadata(work),
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": work.name},
            "minReplicas": min_replicas(settings),
            "maxReplicas": settings.max_scale,
            "metrics": [{"type": "Resource", "resource": {"name": "cpu", "target": target}}],
            # scale_down_delay_s: what Knative's scale-down-delay is, HPA's window for it
            **_scale_down(settings.scale_down_delay_s),
        },
    }


def _scale_down(delay_s: int) -> Manifest:
    if not delay_s:
        return {}
    return {"behavior": {"scaleDown": {"stabilizationWindowSeconds": delay_s}}}


def _kpa(work: Workload, *, bounds: bool = True) -> dict[str, str]:
    """Knative autoscaler annotations (KServe sets the bounds and target from its own fields)."""
    settings = work.settings
    notes = {
        f"{AUTOSCALING}/class": "kpa.autoscaling.knative.dev",
        f"{AUTOSCALING}/target-utilization-percentage": str(settings.target_utilization_percent),
    }
    if bounds:
        notes |= {
            f"{AUTOSCALING}/metric": "concurrency",
            f"{AUTOSCALING}/target": str(work.concurrency.target),
            f"{AUTOSCALING}/min-scale": str(settings.min_scale),
            f"{AUTOSCALING}/max-scale": str(settings.max_scale),
        }
    if settings.initial_scale is not None:
        notes[f"{AUTOSCALING}/initial-scale"] = str(settings.initial_scale)
    if settings.scale_down_delay_s:
        notes[f"{AUTOSCALING}/scale-down-delay"] = f"{settings.scale_down_delay_s}s"
    return notes


def _knative_timeout(work: Workload) -> int:
    """A revision's timeoutSeconds: as long as the function's requests and its drain, within
    Knative's bounds, as is its containerConcurrency (both checked here: every Knative and
    KServe render passes)."""
    timeout_s = max(work.grace_s, math.ceil(work.request_timeout_s))
    check_knative_timeout(timeout_s, work.request_timeout_s, work.drain_s)
    check_knative_concurrency(work.concurrency.limit)
    return timeout_s


def _one_port_container(work: Workload, name: str) -> Manifest:
    """Knative's container: one port. HTTP (`http1`); or, with `protocol = "grpc"`, gRPC
    (`h2c`, which makes the route speak HTTP/2 to it, as KServe documents for v2 gRPC), probed
    by TCP: the gRPC port opens once the model is loaded and warmed up, closes at the drain."""
    if work.grpc_port is None:
        check_knative_port(work.settings.port, "[settings] port")
        return _container(work, name=name, port_name="http1")
    if work.settings.protocol != "grpc":
        raise ConfigError(
            f"the function asks for gRPC on port {work.grpc_port} ([resources] grpc_port, or "
            "[settings] grpc_port), but Knative and KServe route one container port, HTTP/1 or "
            'HTTP/2 (h2c), not both. Hint: in the profile\'s [settings], protocol = "http" '
            'serves HTTP only (gRPC off), protocol = "grpc" serves only KServe v2 gRPC on '
            "that port"
        )
    check_knative_port(work.grpc_port, "the gRPC port ([resources] or [settings] grpc_port)")
    container = _container(work, name=name, port_name="h2c")
    container["ports"] = [_port("h2c", work.grpc_port)]
    socket = {"tcpSocket": {"port": work.grpc_port}}  # the container's own: Knative admits it
    container["readinessProbe"] = socket
    container["livenessProbe"] = {**socket, "periodSeconds": 10, "failureThreshold": 3}
    return container


def _port(name: str, number: int) -> Manifest:
    return {"name": name, "containerPort": number, "protocol": "TCP"}


def _container(
    work: Workload, *, name: str, port_name: str, probe_port: str | None = None
) -> Manifest:
    settings = work.settings
    memory = f"{work.memory_mb}Mi"
    limits: dict[str, str] = {"memory": memory}
    if settings.gpu:
        limits["nvidia.com/gpu"] = str(settings.gpu)
    return {
        "name": name,
        "image": work.image,
        "ports": [_port(port_name, settings.port)],
        "env": [{"name": CORES_VAR, "value": str(settings.cores)}],
        "readinessProbe": _readiness(probe_port),
        "livenessProbe": _probe("/v2/health/live", probe_port, period_s=10, failures=3),
        "resources": {"requests": {"cpu": settings.cpu, "memory": memory}, "limits": limits},
        "securityContext": {
            "runAsNonRoot": True,
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    }


def _readiness(port: str | None) -> Manifest:
    """Under Knative no period: its queue-proxy then probes every 25 ms until the first
    success, so a cold pod takes traffic as soon as it is ready (the kubelet's period would
    add up to a whole period to every cold start)."""
    if port is None:
        return {"httpGet": {"path": "/v2/health/ready"}}
    return _probe("/v2/health/ready", port, period_s=2, failures=2)


def _probe(path: str, port: str | None, *, period_s: int, failures: int) -> Manifest:
    """Knative probes name no port (it must be the container's own); Kubernetes needs one."""
    get = {"path": path, **({"port": port} if port else {})}
    return {"httpGet": get, "periodSeconds": period_s, "failureThreshold": failures}


def _pod_extras(settings: KubernetesSettings) -> Manifest:
    extras: Manifest = {}
    if settings.service_account:
        extras["serviceAccountName"] = settings.service_account
    if settings.image_pull_secret:
        extras["imagePullSecrets"] = [{"name": settings.image_pull_secret}]
    return extras


def _metadata(work: Workload) -> Manifest:
    return {"name": work.name, "namespace": work.settings.namespace, "labels": _labels(work)}


def _labels(work: Workload) -> dict[str, str]:
    version = check_label_value(work.version, "[function] version")
    return {"app.kubernetes.io/managed-by": "edgeserve", "edgeserve.dev/version": version}


RENDERERS = {
    "knative": lambda work: [knative_service(work)],
    "kserve": lambda work: [inference_service(work)],
    "kubernetes": plain_kubernetes,
}
"""Target kind -> the manifests it applies, in apply order."""


def render(kind: str, work: Workload) -> list[Manifest]:
    return list(RENDERERS[kind](work))


def to_yaml(manifests: list[Manifest]) -> str:
    """A multi-document YAML stream, keys in the order written (kubectl apply -f takes it)."""
    import yaml

    return yaml.safe_dump_all(manifests, sort_keys=False, default_flow_style=False)
