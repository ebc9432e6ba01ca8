"""AWS Lambda's `package_type = "image"`: the function's image, built by edgeserve.image.

The layers are the Kubernetes image's (wheels for the base's Python and architecture, their
.pyc, edgeserve, the bundle) plus the task root `/var/task/app.py` (handler `app.handler`).
On AWS's Lambda base images the runtime interface client is already the entry point; on any
other glibc Python base, awslambdaric is installed and made the entry point. Lambda runs the
image as its own user, so the image sets none. Lambda refuses multi-arch manifest lists: the
builders here make a single-architecture image.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from edgeserve.aws_lambda.adapter import BUNDLE_ENV
from edgeserve.aws_lambda.settings import AWS_BASE, LambdaSettings
from edgeserve.image import BuiltImage, build_image, find_tool, push_image
from edgeserve.image.plan import BUNDLE, SERVE_LAYERS, ImagePlan, Layer

if TYPE_CHECKING:
    from edgeserve.bundle import Bundle

TASK_ROOT = "/var/task"
APP_DIR = Path(__file__).parent.parent / "templates" / "aws-lambda"
"""The folder holding app.py, the task root's one file."""


def lambda_image_plan(
    bundle: Bundle, settings: LambdaSettings, requirements: list[str]
) -> ImagePlan:
    """The image: tag `<version>-<hash12>` in `image_repository` (`localhost/<name>` without)."""
    aws_base = settings.image_base.startswith(AWS_BASE)
    repository = settings.image_repository or f"localhost/{bundle.name}"
    return ImagePlan(
        repository=repository,
        tag=f"{bundle.version}-{bundle.content_hash[:12]}",
        base=settings.image_base,
        requirements=tuple(requirements if aws_base else [*requirements, "awslambdaric"]),
        layers=(*SERVE_LAYERS, Layer("app", TASK_ROOT)),
        command=("app.handler",),
        entrypoint=() if aws_base else ("python3", "-m", "awslambdaric"),
        workdir=TASK_ROOT,
        platform=settings.docker_platform,
        user=None,
        env=(("LAMBDA_TASK_ROOT", TASK_ROOT), (BUNDLE_ENV, BUNDLE)),
        labels=(
            ("org.opencontainers.image.title", bundle.name),
            ("dev.edgeserve.content-hash", bundle.content_hash),
        ),
    )


def build_lambda_image(
    bundle: Bundle, settings: LambdaSettings, requirements: list[str], context: Path | None
) -> BuiltImage:
    plan = lambda_image_plan(bundle, settings, requirements)
    sources = {"bundle": bundle.root, "app": APP_DIR}
    return build_image(plan, find_tool(settings.image_tool), sources, context=context)


def push_lambda_image(bundle: Bundle, settings: LambdaSettings, requirements: list[str]) -> str:
    """Build and push to `image_repository`; the ImageUri by digest."""
    built = build_lambda_image(bundle, settings, requirements, None)
    tool = find_tool(settings.image_tool)
    return push_image(tool, built.reference, tls_verify=settings.registry_tls_verify)
