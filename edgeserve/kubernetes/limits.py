"""What a cluster would refuse at apply, refused at build instead, naming the setting: Knative's
admission webhook (the ports its queue-proxy holds, `containerConcurrency` and `timeoutSeconds`
past their default bounds) and the API server (label values). A build that passed here wrote
manifests the cluster would have rejected, or failed minutes later in podman's words.

Knative's bounds are its defaults (config-defaults: container-concurrency-max-limit 1000,
max-revision-timeout-seconds 600): a cluster may raise them, which the hint says.
"""

from __future__ import annotations

import re

from edgeserve.errors import ConfigError

RESERVED_PORTS = frozenset({8008, 8012, 8013, 8022, 9090, 9091})
"""Knative's queue-proxy, autoscaler metrics and profiling ports: a user container may not use
them (knative/serving pkg/apis/serving/k8s_validation.go, reservedPorts)."""
KNATIVE_MAX_CONCURRENCY = 1000
"""Knative's default container-concurrency-max-limit."""
KNATIVE_MAX_TIMEOUT_S = 600
"""Knative's default max-revision-timeout-seconds."""
_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
_LABEL_MAX = 63


def check_label_value(value: str, where: str) -> str:
    """A label value the API server takes (it also tags the image: a stricter rule than a tag's)."""
    if len(value) > _LABEL_MAX or not _LABEL_VALUE.fullmatch(value):
        raise ConfigError(
            f"{where} {value!r} labels the Kubernetes objects and tags the image, and a label "
            f"value is at most {_LABEL_MAX} letters, digits, '-', '_' and '.', starting and "
            "ending with a letter or digit. Hint: 1.2.0-build.5 for 1.2.0+build.5"
        )
    return value


def check_knative_port(port: int, where: str) -> None:
    if port in RESERVED_PORTS:
        raise ConfigError(
            f"{where} {port} is reserved by Knative's queue-proxy ({sorted(RESERVED_PORTS)}). "
            "Hint: another port, such as 8080 for HTTP or 8001 for gRPC"
        )


def check_knative_concurrency(limit: int) -> None:
    if limit > KNATIVE_MAX_CONCURRENCY:
        raise ConfigError(
            f"[settings] container_concurrency = {limit} is over Knative's default limit "
            f"({KNATIVE_MAX_CONCURRENCY}, container-concurrency-max-limit), which its webhook "
            f"refuses. Hint: {KNATIVE_MAX_CONCURRENCY} or less, or 0 for no limit, unless the "
            "cluster raised it"
        )


def check_knative_timeout(timeout_s: int, request_s: float, drain_s: float) -> None:
    if timeout_s > KNATIVE_MAX_TIMEOUT_S:
        raise ConfigError(
            f"the revision's timeoutSeconds would be {timeout_s} (the longer of [batching] "
            f"timeout_ms, {request_s:g} s, and [resources] drain_timeout_s, {drain_s:g} s, plus "
            f"5 s to exit), over Knative's default limit ({KNATIVE_MAX_TIMEOUT_S} s, "
            "max-revision-timeout-seconds), which its webhook refuses. Hint: lower them, "
            "unless the cluster raised it"
        )
