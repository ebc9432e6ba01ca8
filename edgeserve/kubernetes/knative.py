"""Knative rollout: a new revision takes traffic only once it is Ready.

Deploy, in order: apply the Service with its traffic pinned to the revision serving now (the
new template creates a revision with no traffic) -> wait for the new revision to be Ready
(bounded; a revision that fails or never becomes ready leaves traffic where it was) -> move
100 % to it -> wait for the route. Rollback moves 100 % to the newest ready revision older
than the one serving.
"""

from __future__ import annotations

from typing import Any

from edgeserve.errors import DeployError
from edgeserve.kubernetes.cluster import KSERVICE, REVISION, Cluster, Obj, failure, is_true
from edgeserve.targets import DeployResult

SERVICE_LABEL = "serving.knative.dev/service"
GENERATION_LABEL = "serving.knative.dev/configurationGeneration"


class KnativeRollout:
    """Deploy, status and rollback of one Knative Service per function."""

    kind = "knative"

    def __init__(self, cluster: Cluster, ready_timeout_s: float) -> None:
        self.cluster = cluster
        self.timeout_s = ready_timeout_s

    def deploy(self, name: str, version: str, manifests: list[Obj]) -> DeployResult:
        service = manifests[0]
        revision = service["spec"]["template"]["metadata"]["name"]
        serving = serving_revision(self.cluster.get(KSERVICE, name))
        pinned = {"revisionName": serving} if serving else {"latestRevision": True}
        self.cluster.apply(
            {**service, "spec": {**service["spec"], "traffic": [{**pinned, "percent": 100}]}}
        )
        self._wait_revision(revision, serving)
        if serving and serving != revision:
            self._route(name, revision)
        live = self.cluster.wait(
            lambda: _routed(self.cluster.get(KSERVICE, name), revision),
            self.timeout_s,
            f"service {name} did not route to {revision}",
        )
        return DeployResult(
            self.kind,
            name,
            version,
            live.get("status", {}).get("url"),
            serving,
            {"revision": revision},
        )

    def status(self, name: str) -> dict[str, Any]:
        service = self.cluster.get(KSERVICE, name)
        if service is None:
            raise DeployError(f"{self.cluster.where}: no Knative Service {name}")
        status = service.get("status", {})
        return {
            "service": name,
            "namespace": self.cluster.namespace,
            "url": status.get("url"),
            "ready": is_true(service),
            "latest_created": status.get("latestCreatedRevisionName"),
            "latest_ready": status.get("latestReadyRevisionName"),
            "traffic": [
                {"revision": t.get("revisionName"), "percent": t.get("percent")}
                for t in status.get("traffic", [])
            ],
            "revisions": [revision_row(r) for r in revisions(self.cluster, name)],
        }

    def rollback(self, name: str) -> DeployResult:
        service = self.cluster.get(KSERVICE, name)
        serving = serving_revision(service)
        found = revisions(self.cluster, name)
        order = [r["metadata"]["name"] for r in found]
        if service is None or serving not in order:
            raise DeployError(f"{self.cluster.where}: service {name} serves no known revision")
        older = [r for r in found[: order.index(serving)] if is_true(r)]
        if not older:
            raise DeployError(
                f"{self.cluster.where}: service {name}: no ready revision older than {serving}"
            )
        previous = older[-1]["metadata"]["name"]
        self._route(name, previous)
        self.cluster.wait(
            lambda: _routed(self.cluster.get(KSERVICE, name), previous),
            self.timeout_s,
            f"service {name} did not route to {previous}",
        )
        version = older[-1]["metadata"].get("labels", {}).get("edgeserve.dev/version", "?")
        return DeployResult(
            self.kind,
            name,
            version,
            service.get("status", {}).get("url"),
            serving,
            {"revision": previous},
        )

    def _wait_revision(self, revision: str, serving: str | None) -> None:
        def ready() -> bool | None:
            found = self.cluster.get(REVISION, revision)
            if (why := failure(found)) is not None:
                raise DeployError(
                    f"{self.cluster.where}: revision {revision} failed: {why}; {_stays(serving)}"
                )
            return True if is_true(found) else None

        try:
            self.cluster.wait(ready, self.timeout_s, f"revision {revision} did not become ready")
        except DeployError as exc:
            raise DeployError(f"{exc.message}; {_stays(serving)}") from None

    def _route(self, name: str, revision: str) -> None:
        traffic = [{"revisionName": revision, "percent": 100}]
        self.cluster.merge(KSERVICE, name, {"spec": {"traffic": traffic}})


def revisions(cluster: Cluster, service: str) -> list[Obj]:
    """The Knative Service's revisions, oldest first (by configuration generation); KServe's
    predictor is one too (`<name>-predictor`)."""
    found = cluster.select(REVISION, f"{SERVICE_LABEL}={service}")
    return sorted(found, key=lambda r: int(r["metadata"]["labels"].get(GENERATION_LABEL, 0)))


def serving_revision(service: Obj | None) -> str | None:
    """The revision taking the most traffic now (None for a new or unrouted service)."""
    traffic = ((service or {}).get("status") or {}).get("traffic") or []
    routed = [t for t in traffic if t.get("percent") and t.get("revisionName")]
    return max(routed, key=lambda t: t["percent"])["revisionName"] if routed else None


def _routed(service: Obj | None, revision: str) -> Obj | None:
    """The service, once Ready and sending 100 % to `revision`."""
    traffic = ((service or {}).get("status") or {}).get("traffic") or []
    full = any(t.get("revisionName") == revision and t.get("percent") == 100 for t in traffic)
    return service if full and is_true(service) else None


def _stays(serving: str | None) -> str:
    return f"traffic stays on {serving}" if serving else "no revision was serving before"


def revision_row(revision: Obj) -> dict[str, Any]:
    """What `status` shows of one revision: version, image, ready, actual and desired replicas."""
    status = revision.get("status", {})
    containers = revision.get("spec", {}).get("containers", [{}])
    return {
        "name": revision["metadata"]["name"],
        "ready": is_true(revision),
        "version": revision["metadata"].get("labels", {}).get("edgeserve.dev/version"),
        "image": containers[0].get("image"),
        "replicas": status.get("actualReplicas"),
        "desired_replicas": status.get("desiredReplicas"),
    }
