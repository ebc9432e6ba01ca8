"""The `[settings]` of an aws-lambda target profile, and the limits Lambda enforces."""

from __future__ import annotations

import os
import tomllib
from typing import TYPE_CHECKING, Literal

from pydantic import Field

from edgeserve.errors import ConfigError
from edgeserve.manifest import MANIFEST_NAME
from edgeserve.validation import StrictTable

if TYPE_CHECKING:
    from edgeserve.bundle import Bundle
    from edgeserve.profiles import TargetProfile

ZIP_LIMIT_BYTES = 50 * 1024 * 1024
"""Direct-upload zip limit (`ZipFile`), zipped."""
UNZIPPED_LIMIT_BYTES = 250 * 1024 * 1024
"""Zip package limit, unzipped (layers included)."""
PAYLOAD_LIMIT_BYTES = 6 * 1024 * 1024
"""A synchronous invocation's request limit (6,291,456 bytes: "Request must be smaller than
6291456 bytes for the InvokeFunction operation")."""
RESPONSE_LIMIT_BYTES = PAYLOAD_LIMIT_BYTES + 100
"""A synchronous invocation's response limit, 100 bytes above the request's: Lambda fails an
answer past it with "Response payload size exceeded maximum allowed payload size (6291556
bytes)"."""
ALB_RESPONSE_LIMIT_BYTES = 1024 * 1024
"""An ALB takes at most 1 MB of response JSON from a Lambda target (AWS docs, ALB
lambda-functions, Limits); past it the client gets a 502."""
ALB_REQUEST_LIMIT_BYTES = 1024 * 1024
"""An ALB sends a Lambda target request bodies of at most 1 MB (same page); past it the client
gets the ALB's own 413."""

GLIBC_MINOR = 34
"""The python3.12 to 3.14 runtimes run on Amazon Linux 2023, glibc 2.34. (3.10 and 3.11, on
Amazon Linux 2 and deprecated, are left out: its glibc 2.26 loads no wheel of numpy 2.3+ or
onnxruntime 1.17+, and older onnxruntime breaks on the numpy 2 that pip would pair it with.)"""

AWS_BASE = "public.ecr.aws/lambda/python"
"""AWS's Lambda base images: the runtime interface client is their entry point."""
ENDPOINT_ENV = "EDGESERVE_AWS_ENDPOINT_URL"
ROLE_ENV = "EDGESERVE_AWS_ROLE_ARN"


MEMORY_MB = (128, 10240)
"""Lambda's range of memory sizes."""


class LambdaSettings(StrictTable):
    """One function = one Lambda with its own memory, timeout and concurrency."""

    function_name: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_-]{1,64}$")
    region: str = Field(default="us-east-1", pattern=r"^[a-z]{2}(-[a-z]+)+-\d$")
    role_arn: str = ""
    memory_mb: int = Field(default=2048, ge=MEMORY_MB[0], le=MEMORY_MB[1])
    """Where the profile sets none: the function's [resources] memory_mb, if its function.toml
    sets one (`for_bundle`)."""
    timeout_s: int = Field(default=30, ge=1, le=900)
    ephemeral_storage_mb: int = Field(default=512, ge=512, le=10240)
    architecture: Literal["x86_64", "arm64"] = "x86_64"
    python_version: Literal["3.12", "3.13", "3.14"] = "3.12"
    package_type: Literal["zip", "image"] = "zip"
    image_repository: str = ""
    """package_type image: where deploy pushes the image (an ECR repository URI)."""
    base_image: str | None = None
    """package_type image: default public.ecr.aws/lambda/python:<python_version>; another
    glibc Python base gets awslambdaric as its entry point."""
    image_tool: Literal["auto", "podman", "buildah", "docker"] = "auto"
    registry_tls_verify: bool = True
    alias: str = Field(default="live", pattern=r"^[A-Za-z_-][A-Za-z0-9_-]{0,127}$")
    url_auth_type: Literal["NONE", "AWS_IAM", "off"] = "AWS_IAM"
    reserved_concurrency: int | None = Field(default=None, ge=0)
    provisioned_concurrency: int = Field(default=0, ge=0)
    environment: dict[str, str] = {}
    endpoint_url: str | None = None
    requirements: tuple[str, ...] | None = None
    """Replaces the bundle's pinned requirements in the zip (e.g. a slimmer runtime set)."""
    wheelhouse: str | None = None
    """A folder of wheels to install from instead of PyPI (offline builds)."""
    code_bucket: str = Field(default="", pattern=r"^([a-z0-9][a-z0-9.-]{1,61}[a-z0-9])?$")
    """Where zips over 50 MB go (Lambda takes those only from S3); empty: a bucket named
    edgeserve-code-<account>-<region>, created on first use."""

    @property
    def image_base(self) -> str:
        return self.base_image or f"{AWS_BASE}:{self.python_version}"

    def name_for(self, function: str) -> str:
        """The Lambda function name: the profile's, else the bundle's function name."""
        return self.function_name or function

    def resolved_endpoint(self) -> str | None:
        """`EDGESERVE_AWS_ENDPOINT_URL` wins over the profile (tests point it at moto)."""
        return os.environ.get(ENDPOINT_ENV) or self.endpoint_url

    def resolved_role(self) -> str:
        return os.environ.get(ROLE_ENV) or self.role_arn

    @property
    def runtime(self) -> str:
        return f"python{self.python_version}"

    @property
    def pip_platforms(self) -> list[str]:
        """Every wheel platform tag the runtime's OS accepts, newest glibc first: pip matches
        `--platform manylinux_2_N` exactly (numpy ships only manylinux_2_28 wheels since 2.3)."""
        machine = "x86_64" if self.architecture == "x86_64" else "aarch64"
        tags = [f"manylinux_2_{minor}_{machine}" for minor in range(GLIBC_MINOR, 16, -1)]
        return [*tags, f"manylinux2014_{machine}"]

    @property
    def docker_platform(self) -> str:
        return "linux/amd64" if self.architecture == "x86_64" else "linux/arm64"


def for_bundle(profile: TargetProfile, bundle: Bundle) -> LambdaSettings:
    """The profile's [settings] for `bundle`, the function's own `[resources] memory_mb` where
    its function.toml sets one and the profile does not (it was read by the Kubernetes targets
    alone, and Lambda ran at 2048 MB whatever the function said)."""
    settings = profile.settings_as(LambdaSettings)
    written = bundle.root / MANIFEST_NAME
    if "memory_mb" in settings.model_fields_set or not written.is_file():
        return settings
    resources = tomllib.loads(written.read_text(encoding="utf-8")).get("resources", {})
    if "memory_mb" not in resources:
        return settings
    memory_mb = bundle.manifest.resources.memory_mb
    low, high = MEMORY_MB
    if not low <= memory_mb <= high:
        raise ConfigError(
            f"{written}: [resources] memory_mb = {memory_mb}: Lambda sizes a function from "
            f"{low} to {high} MB. Hint: set memory_mb in the {profile.source} [settings], "
            "which Lambda reads over the function's"
        )
    return settings.model_copy(update={"memory_mb": memory_mb})
