"""A STAND-IN for a Kubernetes API server with Knative, KServe and Deployment controllers.

No kube-apiserver can run on these machines, so the deploy / status / rollback code is driven
against this: a real HTTP server on 127.0.0.1 speaking the REST paths, bearer-token check,
server-side apply and JSON merge patch that the kubernetes client sends, with controllers
reduced to the rules edgeserve relies on:

- Knative: each new template name creates a Revision (labels `serving.knative.dev/service`
  and `configurationGeneration`); the route sends traffic only to Ready revisions.
- Revisions report `actualReplicas` (1 once ready) and `desiredReplicas` (1 unless failed).
- KServe (Knative mode): the predictor's revisions belong to the Knative Service
  `<name>-predictor` (its serving.knative.dev/service label); ksvc traffic from
  canaryTrafficPercent and the rolled-out revisions, ported from kserve's ksvc_reconciler.go
  and PropagateStatus (inference_service_status.go).
- Deployment: a ReplicaSet per pod template with `deployment.kubernetes.io/revision`.

Readiness is decided by the image name (the stand-in runs no containers): an image containing
`never-ready` stays not ready, `crash` fails, anything else is ready `READY_AFTER_S` after its
revision appears. What this cannot show is whether real controllers behave this way.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

Obj = dict[str, Any]
TOKEN = "stand-in-token"
READY_AFTER_S = 0.3
PATH = re.compile(
    r"^/apis?/(?P<api>.+?)/namespaces/(?P<ns>[^/]+)/(?P<plural>[^/]+)(?:/(?P<name>[^/]+))?$"
)


def merge(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge(result.get(key), value)
    return result


class Store:
    """Objects by (api, plural, namespace, name), with the controllers run on every write."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str, str], Obj] = {}
        self.lock = threading.RLock()
        self.born: dict[str, float] = {}  # revision / replicaset name -> when it appeared

    def write(self, key: tuple[str, str, str, str], body: Obj, apply: bool) -> Obj:
        with self.lock:
            old = self.objects.get(key)
            if apply:
                new = merge(old or {}, {k: v for k, v in body.items() if k != "spec"})
                new["spec"] = body.get("spec", {})
            else:
                new = merge(old or {}, body)
            meta = new.setdefault("metadata", {})
            meta.update(name=key[3], namespace=key[2])
            changed = old is None or old.get("spec") != new.get("spec")
            meta["generation"] = meta.get("generation", 0) + (1 if changed else 0)
            meta.setdefault("creationTimestamp", time.time())
            self.objects[key] = new
            if changed:  # controllers act on spec changes only
                self._reconcile(key, new)
            return new

    def read(self, key: tuple[str, str, str, str]) -> Obj | None:
        with self.lock:
            found = self.objects.get(key)
            if found is not None:
                self._status(key, found)
            return found

    def items(self, api: str, plural: str, ns: str, selector: str) -> list[Obj]:
        wanted = dict(part.split("=", 1) for part in selector.split(",") if part)
        keys = [k for k in list(self.objects) if k[:3] == (api, plural, ns)]
        found = [self.read(k) for k in keys]
        return [
            o
            for o in found
            if o and all(o["metadata"].get("labels", {}).get(k) == v for k, v in wanted.items())
        ]

    # controllers ---------------------------------------------------------------------------

    def _reconcile(self, key: tuple[str, str, str, str], obj: Obj) -> None:
        api, plural, ns, name = key
        if (api, plural) == ("serving.knative.dev/v1", "services"):
            self._revision_for(ns, name, obj["spec"]["template"], obj["metadata"]["generation"])
        elif (api, plural) == ("serving.kserve.io/v1beta1", "inferenceservices"):
            predictor = obj["spec"]["predictor"]
            spec = {"containers": predictor["containers"]}
            revisions = self._revisions(ns, f"{name}-predictor")
            if revisions and revisions[-1]["spec"] == spec:
                return  # only the traffic changed (canaryTrafficPercent): no new revision
            number = len(revisions) + 1
            template = {
                "metadata": {
                    "name": f"{name}-predictor-{number:05d}",
                    "labels": predictor.get("labels", {}),
                },
                "spec": spec,
            }
            self._revision_for(ns, f"{name}-predictor", template, number)
        elif (api, plural) == ("apps/v1", "deployments"):
            self._replicaset_for(ns, name, obj)

    def _revision_for(self, ns: str, service: str, template: Obj, generation: int) -> None:
        rev = template["metadata"].get("name") or f"{service}-{generation:05d}"
        key = ("serving.knative.dev/v1", "revisions", ns, rev)
        if key in self.objects:
            return
        labels = {
            **template["metadata"].get("labels", {}),
            "serving.knative.dev/service": service,
            "serving.knative.dev/configurationGeneration": str(generation),
        }
        self.objects[key] = {
            "metadata": {"name": rev, "namespace": ns, "labels": labels},
            "spec": template["spec"],
        }
        self.born[rev] = time.monotonic()

    def _replicaset_for(self, ns: str, name: str, deployment: Obj) -> None:
        template = deployment["spec"]["template"]
        sets = [
            o
            for k, o in self.objects.items()
            if k[1] == "replicasets"
            and k[2] == ns
            and o["metadata"]["labels"].get("app.kubernetes.io/name") == name
        ]
        same = [s for s in sets if s["spec"]["template"] == template]
        revision = 1 + max(
            (int(s["metadata"]["annotations"]["deployment.kubernetes.io/revision"]) for s in sets),
            default=0,
        )
        if same:  # kubectl rollout undo: the old ReplicaSet gets the next revision number
            same[0]["metadata"]["annotations"]["deployment.kubernetes.io/revision"] = str(revision)
            rs_name = same[0]["metadata"]["name"]
        else:
            rs_name = f"{name}-{revision:05d}"
            self.objects[("apps/v1", "replicasets", ns, rs_name)] = {
                "metadata": {
                    "name": rs_name,
                    "namespace": ns,
                    "labels": {"app.kubernetes.io/name": name},
                    "annotations": {"deployment.kubernetes.io/revision": str(revision)},
                },
                "spec": {"template": template},
            }
            self.born[rs_name] = time.monotonic()
        deployment["metadata"].setdefault("annotations", {})[
            "deployment.kubernetes.io/revision"
        ] = str(revision)

    def _ready(self, name: str, spec: Obj) -> str:
        """'True', 'False' or 'Unknown' for a revision / ReplicaSet, by its image."""
        image = spec["containers"][0]["image"]
        if "crash" in image:
            return "False"
        if "never-ready" in image or time.monotonic() - self.born[name] < READY_AFTER_S:
            return "Unknown"
        return "True"

    def _status(self, key: tuple[str, str, str, str], obj: Obj) -> None:
        api, plural, ns, name = key
        if plural == "revisions":
            state = self._ready(name, obj["spec"])
            obj["status"] = {
                "conditions": [_condition(state, "ExitCode1")],
                "actualReplicas": 1 if state == "True" else 0,
                "desiredReplicas": 0 if state == "False" else 1,  # a failed one is scaled down
            }
        elif plural == "replicasets":
            state = self._ready(name, obj["spec"]["template"]["spec"])
            obj["status"] = {"readyReplicas": 1 if state == "True" else 0}
        elif (api, plural) == ("serving.knative.dev/v1", "services"):
            obj["status"] = self._route(
                ns,
                name,
                obj["spec"].get("traffic") or [{"latestRevision": True, "percent": 100}],
                obj,
            )
        elif plural == "inferenceservices":
            self._kserve_status(ns, name, obj)
        elif plural == "deployments":
            self._deployment_status(ns, name, obj)

    def _revisions(self, ns: str, service: str) -> list[Obj]:
        found = [
            self.read(k) or {}
            for k in list(self.objects)
            if k[1] == "revisions"
            and k[2] == ns
            and self.objects[k]["metadata"]["labels"]["serving.knative.dev/service"] == service
        ]
        return sorted(
            found,
            key=lambda r: int(
                r["metadata"]["labels"]["serving.knative.dev/configurationGeneration"]
            ),
        )

    def _route(self, ns: str, service: str, wanted: list[Obj], obj: Obj) -> Obj:
        revisions = self._revisions(ns, service)
        ready = [r["metadata"]["name"] for r in revisions if _is_ready(r)]
        latest_ready = ready[-1] if ready else None
        targets = [
            {**t, "revisionName": latest_ready if t.get("latestRevision") else t["revisionName"]}
            for t in wanted
        ]
        routable = all(t["revisionName"] in ready for t in targets if t.get("percent"))
        previous = (obj.get("status") or {}).get("traffic", [])
        return {
            "url": f"http://{service}.{ns}.example.com",
            "latestCreatedRevisionName": revisions[-1]["metadata"]["name"] if revisions else None,
            "latestReadyRevisionName": latest_ready,
            # the route keeps its last traffic until every target it is given is ready
            "traffic": targets if routable else previous,
            "conditions": [_condition("True" if routable else "Unknown", "RevisionMissing")],
            "observedGeneration": obj["metadata"]["generation"],
        }

    def _kserve_status(self, ns: str, name: str, isvc: Obj) -> None:
        predictor = isvc["spec"]["predictor"]
        component = (isvc.get("status") or {}).get("components", {}).get("predictor", {})
        rolled = component.get("latestRolledoutRevision")
        canary = predictor.get("canaryTrafficPercent")
        # ksvc_reconciler.go: canary split only once something has rolled out
        if canary is not None and rolled:
            wanted = [{"latestRevision": True, "percent": canary}]
            if canary < 100:
                wanted.append(
                    {"revisionName": rolled, "latestRevision": False, "percent": 100 - canary}
                )
        else:
            wanted = [{"latestRevision": True, "percent": 100}]
        ksvc = self._route(
            ns, f"{name}-predictor", wanted, {"metadata": isvc["metadata"], "status": component}
        )
        _propagate(component, ksvc)
        ready = ksvc["conditions"][0]["status"]
        isvc["status"] = {
            "url": f"http://{name}.{ns}.example.com",
            "components": {"predictor": component},
            "conditions": [_condition(ready, "PredictorNotReady")],
        }

    def _deployment_status(self, ns: str, name: str, deployment: Obj) -> None:
        revision = deployment["metadata"]["annotations"]["deployment.kubernetes.io/revision"]
        sets = [
            self.read(k) or {}
            for k in list(self.objects)
            if k[1] == "replicasets"
            and k[2] == ns
            and self.objects[k]["metadata"]["labels"].get("app.kubernetes.io/name") == name
        ]
        current = next(
            s
            for s in sets
            if s["metadata"]["annotations"]["deployment.kubernetes.io/revision"] == revision
        )
        ready = current["status"]["readyReplicas"]
        failed = self._ready(current["metadata"]["name"], current["spec"]["template"]["spec"])
        progressing = _condition(
            "False" if failed == "False" else "True", "ProgressDeadlineExceeded"
        )
        progressing["type"] = "Progressing"
        deployment["status"] = {
            "observedGeneration": deployment["metadata"]["generation"],
            "replicas": deployment["spec"].get("replicas", 1),
            "updatedReplicas": ready,
            "readyReplicas": ready,
            "availableReplicas": ready,
            "conditions": [progressing],
        }


def _propagate(component: Obj, ksvc: Obj) -> None:
    """kserve PropagateStatus: track the latest and previous fully rolled-out revisions."""
    component["latestCreatedRevision"] = ksvc["latestCreatedRevisionName"]
    totals: dict[str, int] = {}
    for t in ksvc["traffic"]:
        totals[t["revisionName"]] = totals.get(t["revisionName"], 0) + t["percent"]
    latest_ready = ksvc["latestReadyRevisionName"]
    for t in ksvc["traffic"]:
        if t["revisionName"] != latest_ready or not t.get("latestRevision"):
            continue
        if component.get("latestRolledoutRevision") != latest_ready:
            if t["percent"] == 100:
                component["previousRolledoutRevision"] = component.get("latestRolledoutRevision")
                component["latestRolledoutRevision"] = latest_ready
        elif (
            latest_ready == ksvc["latestCreatedRevisionName"]
            and t["percent"] < 100
            and totals.get(latest_ready) == 100
            and component.get("previousRolledoutRevision")
        ):
            component["latestRolledoutRevision"] = component["previousRolledoutRevision"]
    component["latestReadyRevision"] = latest_ready
    component["traffic"] = ksvc["traffic"]


def _condition(state: str, reason: str) -> Obj:
    return {
        "type": "Ready",
        "status": state,
        **({"reason": reason, "message": "stand-in"} if state != "True" else {}),
    }


def _is_ready(obj: Obj) -> bool:
    return obj.get("status", {}).get("conditions", [{}])[0].get("status") == "True"


class _Handler(BaseHTTPRequestHandler):
    store: Store

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        return

    def _key(self) -> tuple[tuple[str, str, str, str | None], str] | None:
        path, _, query = self.path.partition("?")
        match = PATH.match(path)
        if not match or self.headers.get("Authorization") != f"Bearer {TOKEN}":
            return None
        api = match["api"]
        return (api, match["plural"], match["ns"], match["name"]), query

    def _send(self, code: int, body: Obj) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        found = self._key()
        if found is None:
            return self._send(401, {"kind": "Status", "message": "Unauthorized"})
        (api, plural, ns, name), query = found
        if name is None:
            selector = dict(p.split("=", 1) for p in query.split("&") if "=" in p)
            from urllib.parse import unquote

            items = self.store.items(api, plural, ns, unquote(selector.get("labelSelector", "")))
            return self._send(200, {"items": items})
        obj = self.store.read((api, plural, ns, name))
        if obj is None:
            return self._send(404, {"kind": "Status", "message": f"{plural} {name} not found"})
        return self._send(200, obj)

    def do_PATCH(self) -> None:
        found = self._key()
        if found is None or found[0][3] is None:
            return self._send(401, {"kind": "Status", "message": "Unauthorized"})
        (api, plural, ns, name), _ = found
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        apply = self.headers.get("Content-Type") == "application/apply-patch+yaml"
        if not apply and self.store.read((api, plural, ns, name)) is None:
            return self._send(404, {"kind": "Status", "message": f"{plural} {name} not found"})
        self._send(200, self.store.write((api, plural, ns, str(name)), body, apply))


@contextmanager
def stand_in_api_server(folder: Path) -> Iterator[tuple[Path, Store]]:
    """The stand-in on 127.0.0.1:0; yields (a kubeconfig pointing at it, its store)."""
    store = Store()
    handler = type("Handler", (_Handler,), {"store": store})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    kubeconfig = folder / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "stand-in",
                "clusters": [
                    {
                        "name": "stand-in",
                        "cluster": {"server": f"http://127.0.0.1:{server.server_port}"},
                    }
                ],
                "users": [{"name": "edgeserve", "user": {"token": TOKEN}}],
                "contexts": [
                    {"name": "stand-in", "context": {"cluster": "stand-in", "user": "edgeserve"}}
                ],
            }
        )
    )
    try:
        yield kubeconfig, store
    finally:
        server.shutdown()
        server.server_close()
