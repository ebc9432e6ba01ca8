"""A SAM `template.yaml` for one function: the same settings `edgeserve deploy` applies.

Rendered to a string first (pure), written by the packager. The YAML is emitted by a small
writer of dicts, lists and JSON-quoted scalars, so no YAML library is needed.
"""

from __future__ import annotations

import json
from typing import Any

from edgeserve.aws_lambda.settings import LambdaSettings

LOGICAL_ID = "Function"


def sam_template(function: str, settings: LambdaSettings, code: str) -> str:
    """`code`: the zip (zip) or the image's build context folder (image), relative to it."""
    properties: dict[str, Any] = {
        "FunctionName": settings.name_for(function),
        "MemorySize": settings.memory_mb,
        "Timeout": settings.timeout_s,
        "EphemeralStorage": {"Size": settings.ephemeral_storage_mb},
        "Architectures": [settings.architecture],
        "AutoPublishAlias": settings.alias,
        **_package(settings, code),
        **_optional(settings),
    }
    resource: dict[str, Any] = {"Type": "AWS::Serverless::Function", "Properties": properties}
    if settings.package_type == "image":
        resource["Metadata"] = {
            "Dockerfile": "Containerfile",
            "DockerContext": code,
            "DockerTag": "latest",
        }
    template: dict[str, Any] = {
        "AWSTemplateFormatVersion": "2010-09-09",
        "Transform": "AWS::Serverless-2016-10-31",
        "Description": f"edgeserve function {function}",
        "Resources": {LOGICAL_ID: resource},
    }
    if settings.url_auth_type != "off":
        template["Outputs"] = {
            "FunctionUrl": {"Value": {"Fn::GetAtt": [f"{LOGICAL_ID}Url", "FunctionUrl"]}}
        }
    return to_yaml(template)


def _package(settings: LambdaSettings, code: str) -> dict[str, Any]:
    if settings.package_type == "image":
        return {"PackageType": "Image"}
    return {
        "PackageType": "Zip",
        "CodeUri": code,
        "Runtime": settings.runtime,
        "Handler": "app.handler",
    }


def _optional(settings: LambdaSettings) -> dict[str, Any]:
    extra: dict[str, Any] = {}
    if role := settings.resolved_role():
        extra["Role"] = role
    if settings.environment:
        extra["Environment"] = {"Variables": dict(settings.environment)}
    if settings.url_auth_type != "off":
        extra["FunctionUrlConfig"] = {"AuthType": settings.url_auth_type}
    if settings.reserved_concurrency is not None:
        extra["ReservedConcurrentExecutions"] = settings.reserved_concurrency
    if settings.provisioned_concurrency:
        extra["ProvisionedConcurrencyConfig"] = {
            "ProvisionedConcurrentExecutions": settings.provisioned_concurrency
        }
    return extra


def to_yaml(value: Any, indent: int = 0) -> str:
    """Block-style YAML for dicts and lists; scalars as JSON (a subset of YAML)."""
    pad = "  " * indent
    lines: list[str] = []
    items = value.items() if isinstance(value, dict) else ((None, item) for item in value)
    for key, item in items:
        head = f"{pad}{key}:" if key is not None else f"{pad}-"
        if isinstance(item, dict | list) and item:
            lines.append(head)
            lines.append(to_yaml(item, indent + 1).rstrip("\n"))
        else:
            lines.append(f"{head} {json.dumps(item)}")
    return "\n".join(lines) + "\n"
