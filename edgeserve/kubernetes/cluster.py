"""The user's cluster through the kubernetes client: the kubeconfig and context kubectl uses.

Objects are plain dicts; a `Resource` names the REST collection. Writes are server-side apply
(field manager `edgeserve`, forced: edgeserve owns what it renders) and JSON merge patches for
traffic. The client's ApiException becomes a DeployError here and nowhere else.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from edgeserve.errors import ConfigError, DeployError
from edgeserve.kubernetes.settings import KubernetesSettings

Obj = dict[str, Any]
T = TypeVar("T")
FIELD_MANAGER = "edgeserve"
POLL_S = 0.25


@dataclass(frozen=True)
class Resource:
    """A namespaced collection: `serving.knative.dev/v1` + `services`."""

    api_version: str
    plural: str

    def path(self, namespace: str, name: str | None = None) -> str:
        root = "/api/v1" if self.api_version == "v1" else f"/apis/{self.api_version}"
        tail = f"/{name}" if name else ""
        return f"{root}/namespaces/{namespace}/{self.plural}{tail}"


KSERVICE = Resource("serving.knative.dev/v1", "services")
REVISION = Resource("serving.knative.dev/v1", "revisions")
ISVC = Resource("serving.kserve.io/v1beta1", "inferenceservices")
DEPLOYMENT = Resource("apps/v1", "deployments")
REPLICASET = Resource("apps/v1", "replicasets")
SERVICE = Resource("v1", "services")
HPA = Resource("autoscaling/v2", "horizontalpodautoscalers")
KINDS = {
    "Service/serving.knative.dev/v1": KSERVICE,
    "InferenceService": ISVC,
    "Deployment": DEPLOYMENT,
    "Service/v1": SERVICE,
    "HorizontalPodAutoscaler": HPA,
}


def resource_of(manifest: Obj) -> Resource:
    kind, api = manifest["kind"], manifest["apiVersion"]
    return KINDS.get(f"{kind}/{api}") or KINDS[kind]


DEFAULT_KUBECONFIG = Path("~/.kube/config")
"""Where the client and kubectl look when neither the profile nor $KUBECONFIG names one."""


class Cluster:
    """One namespace of the cluster the profile's kubeconfig and context name."""

    def __init__(self, settings: KubernetesSettings) -> None:
        try:
            from kubernetes import config
        except ModuleNotFoundError:
            raise ConfigError(
                "Kubernetes targets need the kubernetes client. "
                "Hint: pip install 'edgeserve[kubernetes]'"
            ) from None
        import yaml

        path = settings.kubeconfig_path()
        where = f"kubeconfig {path or '~/.kube/config'}"
        if not (path or DEFAULT_KUBECONFIG).expanduser().is_file():  # the client: "Invalid"
            raise ConfigError(
                f"{where}: no such file; deploy, status and rollback talk to the cluster a "
                "kubeconfig names. Hint: set $KUBECONFIG or `kubeconfig` in the target profile; "
                "without a cluster, `edgeserve build SOURCE --target knative` (or kserve, "
                "kubernetes) builds the image and writes its manifests.yaml"
            )
        try:
            self._api = config.new_client_from_config(
                config_file=str(path) if path else None, context=settings.context
            )
        except (config.ConfigException, OSError) as exc:
            raise ConfigError(f"{where}: {exc}") from None
        except (yaml.YAMLError, TypeError, AttributeError, KeyError, ValueError) as exc:
            # the client indexes the parsed file as a mapping: invalid YAML, a list or a scalar
            # fails inside it with one of these
            raise ConfigError(
                f"{where}: not a kubeconfig (a YAML mapping of clusters, contexts and users): "
                f"{' '.join(str(exc).split())}"
            ) from None
        self.namespace = settings.namespace
        self.request_timeout_s = settings.request_timeout_s
        self.where = f"{self._api.configuration.host} namespace {self.namespace}"

    def get(self, resource: Resource, name: str) -> Obj | None:
        """The object, or None when there is none."""
        return self._call("GET", resource.path(self.namespace, name), missing_ok=True)

    def select(self, resource: Resource, selector: str) -> list[Obj]:
        found = self._call(
            "GET", resource.path(self.namespace), query=[("labelSelector", selector)]
        )
        return list((found or {}).get("items", []))

    def apply(self, manifest: Obj) -> Obj:
        """Server-side apply: creates or updates, edgeserve owning the fields it renders."""
        path = resource_of(manifest).path(self.namespace, manifest["metadata"]["name"])
        query = [("fieldManager", FIELD_MANAGER), ("force", "true")]
        return (
            self._call(
                "PATCH",
                path,
                body=manifest,
                query=query,
                content_type="application/apply-patch+yaml",
            )
            or {}
        )

    def merge(self, resource: Resource, name: str, patch: Obj) -> Obj:
        path = resource.path(self.namespace, name)
        return (
            self._call("PATCH", path, body=patch, content_type="application/merge-patch+json") or {}
        )

    def wait(self, check: Callable[[], T | None], timeout_s: float, what: str) -> T:
        """Poll `check` until it returns a value (bounded); DeployError naming `what`."""
        deadline = time.monotonic() + timeout_s
        while True:
            if (found := check()) is not None:
                return found
            if time.monotonic() >= deadline:
                raise DeployError(f"{self.where}: {what} within {timeout_s:.0f}s")
            time.sleep(min(POLL_S, max(0.0, deadline - time.monotonic())))

    def _call(
        self,
        method: str,
        path: str,
        *,
        body: Obj | None = None,
        query: list[tuple[str, str]] | None = None,
        content_type: str = "application/json",
        missing_ok: bool = False,
    ) -> Obj | None:
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError, TimeoutError

        headers = {"Accept": "application/json", "Content-Type": content_type}
        try:
            answer = self._api.call_api(
                path,
                method,
                query_params=query or [],
                header_params=headers,
                body=body,
                auth_settings=["BearerToken"],
                _preload_content=False,
                _request_timeout=self.request_timeout_s,
            )
        except ApiException as exc:
            if missing_ok and exc.status == 404:
                return None
            raise DeployError(f"{self.where}: {method} {path}: {_reason(exc)}") from None
        except HTTPError as exc:
            if isinstance(exc, TimeoutError) or isinstance(
                getattr(exc, "reason", None), TimeoutError
            ):
                raise DeployError(
                    f"{self.where}: {method} {path}: no answer within {self.request_timeout_s:g} "
                    "s (request_timeout_s). Hint: check that the API server is up (kubectl get ns)"
                ) from None
            raise DeployError(f"{self.where}: {method} {path}: {exc}") from None
        data: Obj = json.loads(answer.data or b"{}")
        return data


def _reason(exc: Any) -> str:
    """The API server's Status message when it sent one, else the HTTP status."""
    try:
        return str(json.loads(exc.body)["message"])
    except (TypeError, ValueError, KeyError):
        return f"HTTP {exc.status} {exc.reason}"


def condition(obj: Obj | None, kind: str = "Ready") -> Obj:
    """A status condition (`{}` when absent)."""
    conditions = ((obj or {}).get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c.get("type") == kind), {})


def is_true(obj: Obj | None, kind: str = "Ready") -> bool:
    return condition(obj, kind).get("status") == "True"


def failure(obj: Obj | None, kind: str = "Ready") -> str | None:
    """`reason: message` when the condition is False (the controller gave up), else None."""
    found = condition(obj, kind)
    if found.get("status") != "False":
        return None
    return f"{found.get('reason', '')}: {found.get('message', '')}".strip(": ")
