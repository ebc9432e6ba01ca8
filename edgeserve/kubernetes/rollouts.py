"""The rollout of each kind: how a new version takes traffic, what status shows, how to go back.

knative     knative.py     revisions; traffic pinned, then moved to a Ready revision
kserve      kserve.py      canaryTrafficPercent 0 until the new revision is Ready
kubernetes  deployment.py  RollingUpdate with maxUnavailable 0; undo to the previous ReplicaSet
"""

from __future__ import annotations

from typing import Any, Protocol

from edgeserve.kubernetes.cluster import Cluster, Obj
from edgeserve.kubernetes.settings import KubernetesSettings
from edgeserve.targets import DeployResult


class Rollout(Protocol):
    def deploy(self, name: str, version: str, manifests: list[Obj]) -> DeployResult: ...

    def status(self, name: str) -> dict[str, Any]: ...

    def rollback(self, name: str) -> DeployResult: ...


def rollout_for(kind: str, settings: KubernetesSettings) -> Rollout:
    """The rollout of `kind` against the cluster the profile's kubeconfig and context name."""
    cluster = Cluster(settings)
    if kind == "knative":
        from edgeserve.kubernetes.knative import KnativeRollout

        return KnativeRollout(cluster, settings.ready_timeout_s)
    if kind == "kserve":
        from edgeserve.kubernetes.kserve import KServeRollout

        return KServeRollout(cluster, settings.ready_timeout_s)
    from edgeserve.kubernetes.deployment import DeploymentRollout

    return DeploymentRollout(cluster, settings.ready_timeout_s)
