"""Target kinds, each declared once: where it runs, what its server needs, who deploys it.

`build` plans a target from its kind (the platform picks the backends, from the backend table,
and the server packages join the pinned requirements); a target profile names its kind as its
`driver`; `deploy` imports the kind's driver on first use, so boto3 (aws-lambda) or ssh
(jetson) load only for the command that needs them. Adding a kind is one row here, one driver
module and one profile in edgeserve/templates/targets/.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from edgeserve.errors import ConfigError, did_you_mean

UVICORN = ("uvicorn", "uvloop", "httptools")
"""The server of every kind that runs an HTTP process: uvloop and httptools are uvicorn's fast
loop and parser (about 1.25x the served items/s with 600 KB binary tensors on an H200 host)."""
IMAGE_SERVER = (*UVICORN, "rich")
"""Images start `edgeserve serve`, whose command line prints with rich."""
DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
MAX_NAME = 63


@dataclass(frozen=True)
class TargetKind:
    """One kind of target. `platform` is what the backend table's `platforms` name (cpu, lambda,
    jetson); `driver` is the "module:attribute" of its deploy `Driver`, None when there is
    nothing to deploy (`local` runs with `edgeserve serve`). `derived_name`: the longest name
    a cluster kind derives from the function's name, each a DNS-1035 label (None: any name)."""

    name: str
    platform: str
    server: tuple[str, ...] = UVICORN
    driver: str | None = None
    derived_name: str | None = None

    def check_name(self, name: str) -> None:
        """Refuse, before anything is built, a function name the cluster cannot use: the
        names it derives from it must be DNS-1035 labels too (63 characters at most)."""
        if self.derived_name is None:
            return
        if not DNS_LABEL.match(name):
            raise ConfigError(
                f"function name {name!r}: Knative, KServe and Kubernetes services need a "
                "DNS-1035 label (lowercase letters, digits and '-', starting with a letter). "
                "Hint: rename it in function.toml [function] name"
            )
        derived = self.derived_name.format(name=name)
        if len(derived) > MAX_NAME:
            longest = MAX_NAME - (len(derived) - len(name))
            raise ConfigError(
                f"function name {name!r} ({len(name)} characters): {self.name} names a "
                f"{derived!r} after it, which must stay within {MAX_NAME} characters; expected "
                f"a name of at most {longest}. Hint: shorten function.toml [function] name"
            )

    @property
    def backends(self) -> tuple[str, ...]:
        """The backends a bundle for this kind plans, best first (from the backend table)."""
        from edgeserve.backends import suited

        return suited(self.platform)


KINDS = {
    kind.name: kind
    for kind in (
        TargetKind("local", "cpu"),
        # Lambda runs ONNX Runtime alone: OpenVINO (180 MB installed) would push a zip past 250 MB
        TargetKind("aws-lambda", "lambda", ("mangum",), "edgeserve.aws_lambda.driver:DRIVER"),
        TargetKind("jetson", "jetson", driver="edgeserve.targets.jetson:DRIVER"),
        # the revision, `<service>-<hash10>` (kubernetes/manifests.py)
        TargetKind(
            "knative",
            "cpu",
            IMAGE_SERVER,
            "edgeserve.kubernetes.driver:KNATIVE",
            "{name}-0123456789",
        ),
        # the predictor's Knative revisions
        TargetKind(
            "kserve",
            "cpu",
            IMAGE_SERVER,
            "edgeserve.kubernetes.driver:KSERVE",
            "{name}-predictor-00001",
        ),
        # Deployment, Service and HPA take the name as it is
        TargetKind(
            "kubernetes", "cpu", IMAGE_SERVER, "edgeserve.kubernetes.driver:KUBERNETES", "{name}"
        ),
    )
}


def kind_named(name: str, where: str) -> TargetKind:
    """The kind a profile's `driver` names, or a ConfigError saying `where` it was named."""
    try:
        return KINDS[name]
    except KeyError:
        raise ConfigError(
            f"{where}: unknown driver {name!r}; expected one of {sorted(KINDS)}"
            f"{did_you_mean(name, KINDS)}"
        ) from None
