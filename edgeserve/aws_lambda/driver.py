"""The aws-lambda driver: package, then deploy with boto3; status and rollback through the alias.

Deploy, in order: a local preflight (preflight.py: the bundle answers its readiness check as
Lambda runs it; nothing reaches AWS when it fails), create or update the function (and wait,
with the v2 waiters), publish a version guarded by the CodeSha256 just uploaded, move the
alias, then the function URL (url.py: a `Cors` on it removed where the app answers CORS),
reserved and provisioned concurrency, and last the removal of a URL `url_auth_type = "off"` no
longer wants. Until the alias moves,
traffic stays on the old version; a later step that fails moves the alias back and puts the
function URL, its permissions and the reserved concurrency back as they were. The alias
description records the version it replaced, which is where `rollback` returns to.
"""

from __future__ import annotations

import base64
import hashlib
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgeserve.aws_lambda.environment import Limits
from edgeserve.aws_lambda.package import needs_s3, package_image, package_zip, requirements
from edgeserve.aws_lambda.preflight import preflight
from edgeserve.aws_lambda.s3 import upload_to_s3
from edgeserve.aws_lambda.sam import sam_template
from edgeserve.aws_lambda.settings import LambdaSettings, for_bundle
from edgeserve.aws_lambda.translate import translated
from edgeserve.aws_lambda.url import FunctionUrl, found
from edgeserve.errors import ConfigError, DeployError
from edgeserve.http.cors import load_cors
from edgeserve.targets import DeployResult

if TYPE_CHECKING:
    from edgeserve.bundle import Bundle
    from edgeserve.profiles import TargetProfile

PREVIOUS = re.compile(r"previous=(\d+)")


class AwsLambda:
    """The Driver for `driver = "aws-lambda"` profiles."""

    def package(self, bundle: Bundle, profile: TargetProfile, out: Path) -> Path:
        """Zip or image context (by `package_type`), with a SAM template.yaml beside it."""
        settings = for_bundle(profile, bundle)
        code = (
            package_zip(bundle, settings, out)
            if settings.package_type == "zip"
            else package_image(bundle, settings, out)
        )
        (out / "template.yaml").write_text(sam_template(bundle.name, settings, code.name))
        return code

    def deploy(self, bundle: Bundle, profile: TargetProfile) -> DeployResult:
        settings = for_bundle(profile, bundle)
        name = settings.name_for(bundle.name)
        own_cors = load_cors(bundle.manifest.cors, settings.environment) is not None
        deployment = Deployment(settings, name, own_cors)  # checks boto3 first
        limits = Limits(settings.memory_mb, settings.timeout_s)
        preflight(bundle.root, name, limits, settings.environment)
        with tempfile.TemporaryDirectory(prefix="edgeserve-deploy-") as scratch:
            code = self._code(bundle, settings, Path(scratch))
            return deployment.run(code, bundle.content_hash)

    def status(self, name: str, profile: TargetProfile) -> dict[str, Any]:
        settings = profile.settings_as(LambdaSettings)
        return Deployment(settings, settings.name_for(name)).status()

    def rollback(self, name: str, profile: TargetProfile) -> DeployResult:
        settings = profile.settings_as(LambdaSettings)
        return Deployment(settings, settings.name_for(name)).rollback()

    @staticmethod
    def _code(bundle: Bundle, settings: LambdaSettings, scratch: Path) -> dict[str, Any]:
        if settings.package_type == "zip":
            archive = package_zip(bundle, settings, scratch)
            if needs_s3(archive):
                return upload_to_s3(archive, settings, f"{bundle.name}/{bundle.content_hash}.zip")
            return {"ZipFile": archive.read_bytes()}
        if not settings.image_repository:
            raise ConfigError(
                'package_type = "image" needs settings.image_repository: the ECR repository URI '
                "deploy pushes the image to (log in first: aws ecr get-login-password | podman "
                "login --username AWS --password-stdin <registry>)"
            )
        from edgeserve.aws_lambda.image import push_lambda_image

        return {"ImageUri": push_lambda_image(bundle, settings, requirements(bundle, settings))}


class Deployment:
    """One function's deploy, status and rollback against the Lambda API."""

    def __init__(self, settings: LambdaSettings, name: str, own_cors: bool = False) -> None:
        """`own_cors`: the app answers CORS itself, so its URL must not (url.py)."""
        try:
            import boto3
        except ModuleNotFoundError:
            raise ConfigError(
                "the aws-lambda target needs boto3. Hint: pip install 'edgeserve[aws]'"
            ) from None

        self.settings = settings
        self.name = name
        self.client = boto3.client(
            "lambda", region_name=settings.region, endpoint_url=settings.resolved_endpoint()
        )
        self.own_cors = own_cors
        self.function_url = FunctionUrl(self.client, name, settings.alias)

    def run(self, code: dict[str, Any], content_hash: str) -> DeployResult:
        with translated(self.name, self.settings, "create or update"):
            sha = self._upload(code)
        with translated(self.name, self.settings, "publish version"):
            version = self.client.publish_version(
                FunctionName=self.name, CodeSha256=sha, Description=f"edgeserve {content_hash}"
            )["Version"]
            self.client.get_waiter("published_version_active").wait(
                FunctionName=self.name, Qualifier=version, WaiterConfig={"Delay": 1}
            )
        with translated(self.name, self.settings, "read alias and settings"):
            before = self._alias()
            settings_before = self._settings()
        live = before["FunctionVersion"] if before else None
        # Lambda publishes nothing new for unchanged code and configuration: keep the record
        previous = _previous(before) if live == version else live
        self._move_alias(version, previous)
        try:
            url = self._after_alias()
        except DeployError as exc:
            if live is not None:
                self._move_alias(live, _previous(before))
            self._restore(settings_before, exc)
            raise
        return DeployResult("aws-lambda", self.name, version, url, previous)

    def status(self) -> dict[str, Any]:
        with translated(self.name, self.settings, "status"):
            config = self.client.get_function_configuration(FunctionName=self.name)
            versions = self.client.list_versions_by_function(FunctionName=self.name)["Versions"]
            alias = self._alias()
            return {
                "function": self.name,
                "region": self.settings.region,
                "state": config.get("State"),
                "last_update": config.get("LastUpdateStatus"),
                "alias": self.settings.alias,
                "live_version": alias["FunctionVersion"] if alias else None,
                "previous_version": _previous(alias),
                "versions": [v["Version"] for v in versions if v["Version"] != "$LATEST"],
                "url": self.function_url.url(),
                "reserved_concurrency": self._reserved(),
                "memory_mb": config.get("MemorySize"),
                "timeout_s": config.get("Timeout"),
            }

    def rollback(self) -> DeployResult:
        with translated(self.name, self.settings, "rollback"):
            alias = self._alias()
        previous = _previous(alias)
        if alias is None or previous is None:
            raise DeployError(
                f"lambda {self.name} ({self.settings.region}): alias "
                f"{self.settings.alias!r} has no "
                "previous version to return to; deploy at least twice first"
            )
        current = alias["FunctionVersion"]
        self._move_alias(previous, current)
        return DeployResult("aws-lambda", self.name, previous, self.function_url.url(), current)

    def _upload(self, code: dict[str, Any]) -> str:
        if self._exists():  # the code is built for the profile's architecture and Python
            self.client.update_function_code(
                FunctionName=self.name, **code, Architectures=[self.settings.architecture]
            )
            self._wait("function_updated_v2")
            self.client.update_function_configuration(
                FunctionName=self.name, **self._config(), **self._runtime(code)
            )
            self._wait("function_updated_v2")
        else:
            self.client.create_function(
                FunctionName=self.name,
                Code=code,
                Publish=False,
                **self._config(),
                **self._kind(code),
            )
            self._wait("function_active_v2")
        if "ZipFile" in code:
            return base64.b64encode(hashlib.sha256(code["ZipFile"]).digest()).decode()
        sha: str = self.client.get_function_configuration(FunctionName=self.name)["CodeSha256"]
        return sha

    def _config(self) -> dict[str, Any]:
        settings = self.settings
        role = settings.resolved_role()
        if not role:
            raise ConfigError(
                "aws-lambda target: settings.role_arn is empty; set it to the function's execution "
                "role (or EDGESERVE_AWS_ROLE_ARN)"
            )
        return {
            "Role": role,
            "MemorySize": settings.memory_mb,
            "Timeout": settings.timeout_s,
            "EphemeralStorage": {"Size": settings.ephemeral_storage_mb},
            "Environment": {"Variables": dict(settings.environment)},
        }

    def _kind(self, code: dict[str, Any]) -> dict[str, Any]:
        """What create_function sets once: the package type, the architecture, the runtime."""
        return {
            "PackageType": "Image" if "ImageUri" in code else "Zip",
            "Architectures": [self.settings.architecture],
            **self._runtime(code),
        }

    def _runtime(self, code: dict[str, Any]) -> dict[str, Any]:
        """What runs the code, as the configuration sets it: an image's command, a zip's Python."""
        if "ImageUri" in code:
            return {"ImageConfig": {"Command": ["app.handler"]}}
        return {"Runtime": self.settings.runtime, "Handler": "app.handler"}

    def _after_alias(self) -> str | None:
        settings, alias = self.settings, self.settings.alias
        with translated(self.name, settings, "function URL"):
            auth = settings.url_auth_type  # "off": removed last, below
            url = None if auth == "off" else self.function_url.ensure(auth, self.own_cors)
        with translated(self.name, settings, "reserved concurrency"):
            if settings.reserved_concurrency is None:
                self.client.delete_function_concurrency(FunctionName=self.name)
            else:
                self.client.put_function_concurrency(
                    FunctionName=self.name,
                    ReservedConcurrentExecutions=settings.reserved_concurrency,
                )
        if settings.provisioned_concurrency:
            with translated(self.name, settings, "provisioned concurrency"):
                self.client.put_provisioned_concurrency_config(
                    FunctionName=self.name,
                    Qualifier=alias,
                    ProvisionedConcurrentExecutions=settings.provisioned_concurrency,
                )
        if settings.url_auth_type == "off":  # last: a URL deleted may not come back the same
            with translated(self.name, settings, "remove function URL"):
                self.function_url.remove()
        return url

    def _settings(self) -> FunctionSettings:
        url = self.function_url
        return FunctionSettings(url.config(), self._reserved(), url.granted())

    def _restore(self, before: FunctionSettings, cause: DeployError) -> None:
        """Put the URL, its permissions and the reserved concurrency back as `before` had them:
        a failed deploy leaves the function as it found it."""
        try:
            with translated(self.name, self.settings, "restore settings after the failure"):
                self.function_url.restore(before.url, before.granted)
                if before.reserved is None:
                    self.client.delete_function_concurrency(FunctionName=self.name)
                else:
                    self.client.put_function_concurrency(
                        FunctionName=self.name, ReservedConcurrentExecutions=before.reserved
                    )
        except DeployError as failed:
            raise DeployError(f"{cause.message}; and then {failed.message}") from None

    def _move_alias(self, version: str, previous: str | None) -> None:
        description = f"edgeserve previous={previous}" if previous else "edgeserve"
        fields = {"FunctionName": self.name, "Name": self.settings.alias}
        with translated(self.name, self.settings, f"alias {self.settings.alias} -> {version}"):
            if self._alias() is None:
                self.client.create_alias(**fields, FunctionVersion=version, Description=description)
            else:
                self.client.update_alias(**fields, FunctionVersion=version, Description=description)

    def _alias(self) -> dict[str, Any] | None:
        return self._get(self.client.get_alias, FunctionName=self.name, Name=self.settings.alias)

    def _reserved(self) -> int | None:
        reserved = self._get(self.client.get_function_concurrency, FunctionName=self.name)
        return reserved.get("ReservedConcurrentExecutions") if reserved else None

    def _exists(self) -> bool:
        return self._get(self.client.get_function, FunctionName=self.name) is not None

    def _get(self, call: Any, **kwargs: Any) -> dict[str, Any] | None:
        return found(self.client, call, **kwargs)

    def _wait(self, waiter: str) -> None:
        self.client.get_waiter(waiter).wait(FunctionName=self.name, WaiterConfig={"Delay": 1})


@dataclass(frozen=True)
class FunctionSettings:
    """What a deploy changes beyond the alias, as it was before the deploy."""

    url: dict[str, Any] | None  # the alias's function URL config (None: no URL)
    reserved: int | None
    granted: frozenset[str]  # statement ids on the alias's policy


def _previous(alias: dict[str, Any] | None) -> str | None:
    match = PREVIOUS.search((alias or {}).get("Description", ""))
    return match.group(1) if match else None


DRIVER = AwsLambda()
