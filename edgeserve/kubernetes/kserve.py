"""KServe rollout (Knative mode): the new predictor revision gets 0 % until it is Ready.

Deploy: apply the InferenceService with `canaryTrafficPercent: 0` when a revision already
serves (KServe then sends 100 % to the last rolled-out revision and 0 % to the new one) ->
wait for the new revision to be the latest ready one (bounded; if it never is, traffic stays)
-> drop `canaryTrafficPercent` (KServe moves 100 % to the latest ready revision) -> wait until
it is rolled out. Rollback: `canaryTrafficPercent: 0` after a rollout sends 100 % back to the
previous rolled-out revision (KServe's documented rollback).
"""

from __future__ import annotations

from typing import Any

from edgeserve.errors import DeployError
from edgeserve.kubernetes.cluster import ISVC, Cluster, Obj, is_true
from edgeserve.kubernetes.knative import revision_row, revisions
from edgeserve.targets import DeployResult


class KServeRollout:
    """Deploy, status and rollback of one InferenceService per function."""

    kind = "kserve"

    def __init__(self, cluster: Cluster, ready_timeout_s: float) -> None:
        self.cluster = cluster
        self.timeout_s = ready_timeout_s

    def deploy(self, name: str, version: str, manifests: list[Obj]) -> DeployResult:
        isvc = manifests[0]
        before = _predictor(self.cluster.get(ISVC, name))
        serving = before.get("latestRolledoutRevision")
        if serving:
            predictor = {**isvc["spec"]["predictor"], "canaryTrafficPercent": 0}
            isvc = {**isvc, "spec": {**isvc["spec"], "predictor": predictor}}
        self.cluster.apply(isvc)
        created = self._wait(
            name,
            lambda p: (
                p.get("latestCreatedRevision") not in (None, before.get("latestCreatedRevision"))
                or not serving
            ),
            "a new predictor revision was not created",
        )
        revision = created.get("latestCreatedRevision")
        try:
            self._wait(
                name,
                lambda p: p.get("latestReadyRevision") == revision and revision is not None,
                f"revision {revision} did not become ready",
            )
        except DeployError as exc:
            stays = f"traffic stays on {serving}" if serving else "no revision was serving before"
            raise DeployError(f"{exc.message}; {stays}") from None
        if serving:
            patch = {"spec": {"predictor": {"canaryTrafficPercent": None}}}
            self.cluster.merge(ISVC, name, patch)
        self._wait(name, lambda p: _full(p, revision), f"{revision} did not take all traffic")
        url = (self.cluster.get(ISVC, name) or {}).get("status", {}).get("url")
        return DeployResult(self.kind, name, version, url, serving, {"revision": revision})

    def status(self, name: str) -> dict[str, Any]:
        isvc = self.cluster.get(ISVC, name)
        if isvc is None:
            raise DeployError(f"{self.cluster.where}: no InferenceService {name}")
        predictor = _predictor(isvc)
        return {
            "service": name,
            "namespace": self.cluster.namespace,
            "url": isvc.get("status", {}).get("url"),
            "ready": is_true(isvc),
            "canary_traffic_percent": isvc["spec"]["predictor"].get("canaryTrafficPercent"),
            **{
                key: predictor.get(key)
                for key in (
                    "latestCreatedRevision",
                    "latestReadyRevision",
                    "latestRolledoutRevision",
                    "previousRolledoutRevision",
                )
            },
            "traffic": [
                {"revision": t.get("revisionName"), "percent": t.get("percent")}
                for t in predictor.get("traffic", [])
            ],
            # in Knative mode the predictor is the Knative Service `<name>-predictor`
            "revisions": [revision_row(r) for r in revisions(self.cluster, f"{name}-predictor")],
        }

    def rollback(self, name: str) -> DeployResult:
        predictor = _predictor(self.cluster.get(ISVC, name))
        previous = predictor.get("previousRolledoutRevision")
        serving = predictor.get("latestRolledoutRevision")
        if not previous:
            raise DeployError(f"{self.cluster.where}: {name} has no previous rolled-out revision")
        self.cluster.merge(ISVC, name, {"spec": {"predictor": {"canaryTrafficPercent": 0}}})
        self._wait(name, lambda p: _full(p, previous), f"{previous} did not take all traffic")
        isvc = self.cluster.get(ISVC, name) or {}
        version = isvc["spec"]["predictor"].get("labels", {}).get("edgeserve.dev/version", "?")
        return DeployResult(
            self.kind,
            name,
            version,
            isvc.get("status", {}).get("url"),
            serving,
            {"revision": previous, "pinned": True},
        )

    def _wait(self, name: str, done: Any, what: str) -> Obj:
        def check() -> Obj | None:
            predictor = _predictor(self.cluster.get(ISVC, name))
            return predictor if done(predictor) else None

        return self.cluster.wait(check, self.timeout_s, f"inferenceservice {name}: {what}")


def _predictor(isvc: Obj | None) -> Obj:
    components = ((isvc or {}).get("status") or {}).get("components") or {}
    return dict(components.get("predictor") or {})


def _full(predictor: Obj, revision: str | None) -> bool:
    traffic = predictor.get("traffic") or []
    return any(t.get("revisionName") == revision and t.get("percent") == 100 for t in traffic)
