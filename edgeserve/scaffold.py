"""`edgeserve init`: a new function folder that builds and serves with no edits.

The skeleton lives in the package (`edgeserve/templates/function/`, read through
importlib.resources so it works from an installed wheel); files ending in `.tmpl` are rendered
with the function's name. The model is generated, not shipped, so the package holds no binaries.
"""

from __future__ import annotations

import re
from importlib.resources import files
from importlib.resources.abc import Traversable
from pathlib import Path, PurePosixPath
from string import Template

from pydantic import ValidationError

from edgeserve.errors import ConfigError
from edgeserve.manifest import FunctionInfo
from edgeserve.modelgen import mlp_model

TEMPLATE = "function"


def template_root(kind: str = TEMPLATE) -> Traversable:
    """The packaged skeleton folder for `kind`."""
    return files("edgeserve").joinpath("templates", kind)


def render_templates(name: str, kind: str = TEMPLATE) -> dict[PurePosixPath, str]:
    """Every file of the skeleton as text, keyed by its path in the new folder (pure: no writes)."""
    rendered: dict[PurePosixPath, str] = {}
    for relative, resource in _walk(template_root(kind), PurePosixPath()):
        text = resource.read_text(encoding="utf-8")
        if relative.suffix == ".tmpl":
            relative, text = relative.with_suffix(""), Template(text).substitute(name=name)
        rendered[relative] = text
    return rendered


def function_name(dest: Path, name: str | None = None) -> str:
    """The given name, or the folder's name made to fit the manifest's name pattern."""
    if name is None:
        name = re.sub(r"[^a-z0-9_-]+", "-", dest.resolve().name.lower()).strip("-_")[:63]
        name = name or "function"
    try:
        FunctionInfo(name=name)
    except ValidationError:
        raise ConfigError(
            f"function name {name!r}: expected lowercase letters, digits, '-' or '_', "
            "starting with a letter or digit, at most 63 characters"
        ) from None
    return name


def init_function(dest: Path, name: str | None = None) -> Path:
    """Scaffold a working function (manifest, handler, generated model, samples) into `dest`."""
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise ConfigError(
            f"{dest}: already exists and is not an empty folder; "
            "Hint: choose a new path, edgeserve init never overwrites files"
        )
    rendered = render_templates(function_name(dest, name))
    for relative, text in rendered.items():
        target = dest.joinpath(*relative.parts)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
    mlp_model(dest / "model.onnx")
    return dest


def _walk(folder: Traversable, prefix: PurePosixPath) -> list[tuple[PurePosixPath, Traversable]]:
    found: list[tuple[PurePosixPath, Traversable]] = []
    for entry in sorted(folder.iterdir(), key=lambda item: item.name):
        if entry.name == "__pycache__":
            continue
        if entry.is_dir():
            found += _walk(entry, prefix / entry.name)
        else:
            found.append((prefix / entry.name, entry))
    return found
