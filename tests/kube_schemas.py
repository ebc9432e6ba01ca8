"""Check manifests the way a cluster would: the published CRD schemas (unknown fields
rejected, as `kubectl apply --validate=strict` does) and the Knative admission rules those
schemas do not hold. The schemas are in tests/fixtures/kubernetes/ (see the README there)."""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema

FIXTURES = Path(__file__).parent / "fixtures" / "kubernetes"
DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
# knative/serving pkg/apis/serving/k8s_validation.go
RESERVED_PORTS = {8012, 8013, 8022, 9090, 9091, 8008}
PORT_NAMES = {"", "http1", "h2c"}
RESERVED_ENV = {"PORT", "K_SERVICE", "K_CONFIGURATION", "K_REVISION"}


def _closed(node: Any) -> Any:
    """Every object schema with `properties` refuses other keys (strict field validation),
    except where the CRD says x-kubernetes-preserve-unknown-fields."""
    if isinstance(node, list):
        return [_closed(item) for item in node]
    if not isinstance(node, dict):
        return node
    closed = {key: _closed(value) for key, value in node.items()}
    if "properties" in node and not node.get("x-kubernetes-preserve-unknown-fields"):
        closed.setdefault("additionalProperties", False)
    return closed


@cache
def crd_validator(name: str) -> jsonschema.Draft7Validator:
    schema = json.loads((FIXTURES / f"{name}.schema.json").read_text())
    return jsonschema.Draft7Validator(_closed(schema))


def schema_errors(name: str, manifest: dict[str, Any]) -> list[str]:
    errors = crd_validator(name).iter_errors(manifest)
    found = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in errors]
    if not DNS_1035.match(manifest.get("metadata", {}).get("name", "")):
        found.append("metadata.name: not a DNS-1035 label")
    return found


def knative_admission_errors(pod_spec: dict[str, Any], service: str | None = None) -> list[str]:
    """The webhook's rules for a revision's pod spec that the CRD schema cannot express."""
    errors = []
    ports = [port for c in pod_spec["containers"] for port in c.get("ports", [])]
    if len(ports) != 1:
        errors.append(f"exactly one container port is allowed, found {len(ports)}")
    for port in ports:
        if port.get("name", "") not in PORT_NAMES:
            errors.append(f"port name {port['name']!r} is not allowed (http1, h2c or none)")
        if port["containerPort"] in RESERVED_PORTS:
            errors.append(f"{port['containerPort']} is a reserved port")
        if port.get("protocol", "TCP") != "TCP":
            errors.append("port protocol must be TCP")
    for container in pod_spec["containers"]:
        for env in container.get("env", []):
            if env["name"] in RESERVED_ENV:
                errors.append(f"env {env['name']} is reserved")
        own = {p["containerPort"] for p in ports} | {p.get("name") for p in ports}
        for probe in ("readinessProbe", "livenessProbe"):
            for way in ("httpGet", "tcpSocket"):
                probe_port = container.get(probe, {}).get(way, {}).get("port")
                if probe_port is not None and probe_port not in own:
                    errors.append(f"{probe} port {probe_port} is not the container port")
    return errors
