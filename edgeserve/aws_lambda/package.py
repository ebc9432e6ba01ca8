"""Packaging for AWS Lambda: a zip with manylinux wheels, or an image (aws_lambda/image.py).

Both layouts are the same task root: `app.py` (handler `app.handler`), the `edgeserve`
package, the bundle under `bundle/`, and the runtime requirements. The zip is deterministic
(sorted entries, fixed timestamps and modes): same bundle and wheels, same bytes.
"""

from __future__ import annotations

import re
import tempfile
import zipfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import edgeserve
from edgeserve.aws_lambda.adapter import BUNDLE_DIR
from edgeserve.aws_lambda.settings import (
    UNZIPPED_LIMIT_BYTES,
    ZIP_LIMIT_BYTES,
    LambdaSettings,
)
from edgeserve.errors import DeployError
from edgeserve.wheels import install_wheels

if TYPE_CHECKING:
    from edgeserve.bundle import Bundle

TARGET = "aws-lambda"
APP_TEMPLATE = Path(edgeserve.__file__).parent / "templates" / "aws-lambda" / "app.py"
_ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)
_SKIPPED_PARTS = frozenset({"__pycache__"})
_EXACT = re.compile(r"^[A-Za-z0-9._-]+==[^,;\s]+$")


def package_zip(bundle: Bundle, settings: LambdaSettings, out: Path) -> Path:
    """Write `<out>/<name>-aws-lambda.zip` and check it against Lambda's zip limits.

    The requirements are the bundle's pinned aws-lambda ones unless the profile lists its own;
    with a `wheelhouse`, pip installs from that folder only (no index). A pinned version with no
    wheel for the runtime's OS gives way to the newest older one that has one (numpy 2.3 and
    later ship no wheel Amazon Linux 2's glibc loads, for instance).
    """
    with tempfile.TemporaryDirectory(prefix="edgeserve-lambda-") as scratch:
        staging = Path(scratch)
        _pip_install(requirements(bundle, settings), staging, settings)
        members = [*_task_root(bundle), *_tree("", staging)]
        check_size(sum(path.stat().st_size for _, path in members), bundle.name)
        out.mkdir(parents=True, exist_ok=True)
        return write_zip(out / f"{bundle.name}-{TARGET}.zip", members)


def package_image(bundle: Bundle, settings: LambdaSettings, out: Path) -> Path:
    """Build the function's image (aws_lambda/image.py); its build context stays at
    `<out>/image` (SAM builds from it too) and its size per layer goes to `<out>/image.txt`."""
    from edgeserve.aws_lambda.image import build_lambda_image

    built = build_lambda_image(bundle, settings, requirements(bundle, settings), out / "image")
    (out / "image.txt").write_text("\n".join(built.describe()) + "\n", encoding="utf-8")
    return out / "image"


def requirements(bundle: Bundle, settings: LambdaSettings) -> list[str]:
    """The profile's own requirements if it lists them, else the bundle's pinned ones."""
    own = settings.requirements
    return bundle.requirements(TARGET) if own is None else list(own)


def check_size(unzipped: int, function: str) -> None:
    """Refuse, before the zip is written, one over 250 MB unzipped, pointing at the image
    package type. (Over 50 MB zipped is fine: Lambda takes those from S3, which is how `deploy`
    sends them.)"""
    mb = 1024 * 1024
    if unzipped > UNZIPPED_LIMIT_BYTES:
        raise DeployError(
            f"{function}: its zip package would be {unzipped / mb:.1f} MB unzipped, over Lambda's "
            f"{UNZIPPED_LIMIT_BYTES // mb} MB limit for zip packages. Hint: set package_type = "
            '"image" in the target profile\'s [settings] (container images may be up to 10 GB)'
        )


def needs_s3(archive: Path) -> bool:
    """Lambda takes a zip inline up to 50 MB; a larger one must come from an S3 object."""
    return archive.stat().st_size > ZIP_LIMIT_BYTES


def write_zip(dest: Path, members: Iterable[tuple[str, Path]]) -> Path:
    """A reproducible zip: sorted names, fixed timestamp, 0644 (0755 if executable) modes."""
    with zipfile.ZipFile(dest, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=9) as zf:
        for name, path in sorted(members):
            info = zipfile.ZipInfo(name, date_time=_ZIP_EPOCH)
            mode = 0o755 if path.stat().st_mode & 0o111 else 0o644
            info.external_attr = (0o100000 | mode) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, path.read_bytes(), compresslevel=9)
    return dest


def _task_root(bundle: Bundle) -> list[tuple[str, Path]]:
    package = Path(edgeserve.__file__).parent
    # templates included: the app reads templates/openapi/docs.html when it is created
    sources = [(name, path) for name, path in _tree("edgeserve/", package) if path.suffix != ".pyc"]
    return [("app.py", APP_TEMPLATE), *sources, *_tree(f"{BUNDLE_DIR}/", bundle.root)]


def _tree(prefix: str, root: Path) -> list[tuple[str, Path]]:
    return [
        (prefix + path.relative_to(root).as_posix(), path)
        for path in sorted(root.rglob("*"))
        if path.is_file() and not _SKIPPED_PARTS.intersection(path.relative_to(root).parts)
    ]


def _pip_install(requirements: Sequence[str], staging: Path, settings: LambdaSettings) -> None:
    install_wheels(
        [at_most(line) for line in requirements],
        staging,
        platforms=settings.pip_platforms,
        python_version=settings.python_version,
        find_links=settings.wheelhouse,
        hint="each pinned version needs a wheel for this platform and Python (match "
        'python_version to the build\'s Python), or set package_type = "image"',
    )


def at_most(requirement: str) -> str:
    """`name==1.2` -> `name<=1.2`: the pinned version where the platform has a wheel for it."""
    return requirement.replace("==", "<=", 1) if _EXACT.match(requirement) else requirement
