"""Plain Kubernetes rollout: Deployment + Service + HPA.

Deploy: apply the three (an existing Deployment keeps its replica count, which the HPA owns)
-> wait for the rollout (bounded). The strategy is RollingUpdate with maxUnavailable 0, so old
pods serve until new ones are ready; if the new pods never become ready, the Deployment is
undone to its previous pod template (as `kubectl rollout undo` does) and the deploy fails.
Rollback: the pod template of the newest earlier ReplicaSet whose image once rolled out
(edgeserve records those in the `edgeserve.dev/ready-images` annotation).
"""

from __future__ import annotations

import json
from typing import Any

from edgeserve.errors import DeployError
from edgeserve.kubernetes.cluster import DEPLOYMENT, HPA, REPLICASET, Cluster, Obj
from edgeserve.targets import DeployResult

REVISION = "deployment.kubernetes.io/revision"
READY_IMAGES = "edgeserve.dev/ready-images"
KEEP_READY = 10
NAME_LABEL = "app.kubernetes.io/name"


class DeploymentRollout:
    """Deploy, status and rollback of one Deployment (+ Service + HPA) per function."""

    kind = "kubernetes"

    def __init__(self, cluster: Cluster, ready_timeout_s: float) -> None:
        self.cluster = cluster
        self.timeout_s = ready_timeout_s

    def deploy(self, name: str, version: str, manifests: list[Obj]) -> DeployResult:
        deployment, *rest = manifests
        before = self.cluster.get(DEPLOYMENT, name)
        if before is not None:  # the HPA owns the replica count now
            spec = {k: v for k, v in deployment["spec"].items() if k != "replicas"}
            deployment = {**deployment, "spec": spec}
        self.cluster.apply(deployment)
        for manifest in rest:
            self.cluster.apply(manifest)
        try:
            self._wait_rollout(name)
        except DeployError as exc:
            if before is None:
                raise
            self._undo(name)
            raise DeployError(
                f"{exc.message}; rolled back to the previous pod template, whose pods kept serving"
            ) from None
        self._remember_ready(name, _image(deployment["spec"]["template"]))
        url = f"http://{name}.{self.cluster.namespace}.svc.cluster.local"
        previous = _annotation(before, REVISION) if before else None
        return DeployResult(
            self.kind,
            name,
            version,
            url,
            previous,
            {"revision": _annotation(self.cluster.get(DEPLOYMENT, name), REVISION)},
        )

    def status(self, name: str) -> dict[str, Any]:
        deployment = self.cluster.get(DEPLOYMENT, name)
        if deployment is None:
            raise DeployError(f"{self.cluster.where}: no Deployment {name}")
        status = deployment.get("status", {})
        hpa = (self.cluster.get(HPA, name) or {}).get("status", {})
        return {
            "deployment": name,
            "namespace": self.cluster.namespace,
            "revision": _annotation(deployment, REVISION),
            "replicas": status.get("replicas"),
            "ready_replicas": status.get("readyReplicas"),
            "updated_replicas": status.get("updatedReplicas"),
            "hpa": {"current": hpa.get("currentReplicas"), "desired": hpa.get("desiredReplicas")},
            "revisions": [
                {
                    "revision": _annotation(rs, REVISION),
                    "image": rs["spec"]["template"]["spec"]["containers"][0]["image"],
                    "ready_replicas": rs.get("status", {}).get("readyReplicas", 0),
                }
                for rs in self._replicasets(name)
            ],
        }

    def rollback(self, name: str) -> DeployResult:
        current = self.cluster.get(DEPLOYMENT, name)
        if current is None:
            raise DeployError(f"{self.cluster.where}: no Deployment {name}")
        previous = self._undo(name, ready=_ready_images(current))
        self._wait_rollout(name)
        labels = previous["spec"]["template"]["metadata"].get("labels", {})
        return DeployResult(
            self.kind,
            name,
            labels.get("edgeserve.dev/version", "?"),
            f"http://{name}.{self.cluster.namespace}.svc.cluster.local",
            _annotation(current, REVISION),
            {"revision": _annotation(previous, REVISION)},
        )

    def _undo(self, name: str, ready: list[str] | None = None) -> Obj:
        """Put the previous ReplicaSet's pod template back (kubectl rollout undo); with
        `ready`, the newest earlier one running another image that once rolled out."""
        deployment = self.cluster.get(DEPLOYMENT, name)
        current = _annotation(deployment, REVISION)
        older = [rs for rs in self._replicasets(name) if _number(rs) < _number_of(current)]
        if ready is not None:
            live = _image((deployment or {}).get("spec", {}).get("template", {}))
            older = [
                rs
                for rs in older
                if _image(rs["spec"]["template"]) in ready
                and _image(rs["spec"]["template"]) != live
            ]
        if not older:
            raise DeployError(
                f"{self.cluster.where}: deployment {name} has no earlier ready revision"
            )
        previous = older[-1]
        template = previous["spec"]["template"]
        labels = {
            k: v
            for k, v in template["metadata"].get("labels", {}).items()
            if k != "pod-template-hash"
        }
        template = {**template, "metadata": {**template["metadata"], "labels": labels}}
        self.cluster.merge(DEPLOYMENT, name, {"spec": {"template": template}})
        return previous

    def _remember_ready(self, name: str, image: str) -> None:
        """Record the images that rolled out (rollback goes only to one of them)."""
        found = _ready_images(self.cluster.get(DEPLOYMENT, name))
        images = [*[i for i in found if i != image], image][-KEEP_READY:]
        notes = {READY_IMAGES: json.dumps(images)}
        self.cluster.merge(DEPLOYMENT, name, {"metadata": {"annotations": notes}})

    def _wait_rollout(self, name: str) -> None:
        def done() -> bool | None:
            found = self.cluster.get(DEPLOYMENT, name) or {}
            status, spec = found.get("status", {}), found.get("spec", {})
            for cond in status.get("conditions", []):
                if cond.get("type") == "Progressing" and cond.get("status") == "False":
                    raise DeployError(
                        f"{self.cluster.where}: deployment {name}: "
                        f"{cond.get('reason')}: {cond.get('message')}"
                    )
            current = status.get("observedGeneration", 0) >= found.get("metadata", {}).get(
                "generation", 1
            )
            wanted = spec.get("replicas", 1)
            ready = (
                status.get("updatedReplicas", 0) >= wanted
                and status.get("availableReplicas", 0) >= wanted
            )
            return True if current and ready else None

        self.cluster.wait(done, self.timeout_s, f"deployment {name} did not roll out")

    def _replicasets(self, name: str) -> list[Obj]:
        found = self.cluster.select(REPLICASET, f"{NAME_LABEL}={name}")
        return sorted(found, key=_number)


def _annotation(obj: Obj | None, key: str) -> str | None:
    return ((obj or {}).get("metadata") or {}).get("annotations", {}).get(key)


def _image(template: Obj) -> str:
    return str(template["spec"]["containers"][0]["image"])


def _ready_images(deployment: Obj | None) -> list[str]:
    text = _annotation(deployment, READY_IMAGES)
    return list(json.loads(text)) if text else []


def _number(replicaset: Obj) -> int:
    return _number_of(_annotation(replicaset, REVISION))


def _number_of(revision: str | None) -> int:
    return int(revision) if revision and revision.isdigit() else 0
