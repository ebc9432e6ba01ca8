"""What of a function's source folder its bundle carries: the model (and its external
weights), the handler with its own modules and their data files, and the samples; editor and
OS litter stays out."""

from __future__ import annotations

from pathlib import Path

from edgeserve.errors import ConfigError, did_you_mean
from edgeserve.imports import hidden, own_data, own_modules
from edgeserve.manifest import MANIFEST_NAME, Manifest
from edgeserve.modelfile import external_data


def model_file(source: Path, manifest: Manifest) -> Path:
    """The model `[model] path` names, or an error that says which file was looked for."""
    model = source / manifest.model.path
    if model.is_file():
        return model
    present = sorted(
        path.relative_to(source).as_posix() for path in source.rglob("*.onnx") if path.is_file()
    )
    hint = did_you_mean(manifest.model.path, present) or (
        f"; the folder holds {present}" if present else "; the folder holds no .onnx file"
    )
    problem = "is a folder, not a file" if model.is_dir() else "does not exist"
    raise ConfigError(
        f"{source / MANIFEST_NAME}: field `model.path`: found {manifest.model.path!r}, but "
        f"{model} {problem}; expected the ONNX model's path in the function folder{hint}"
    )


def external_data_copies(model: Path) -> list[tuple[str, Path]]:
    """Weights an ONNX model keeps in side files (models over 2 GB must) travel beside it."""
    return [(f"model/{location}", model.parent / location) for location in external_data(model)]


def handler_copies(source: Path, manifest: Manifest) -> list[tuple[str, Path]]:
    module = manifest.handler.module
    if module is None:
        return []
    path = source / f"{module}.py"
    if not path.is_file():
        raise ConfigError(
            f"{source / MANIFEST_NAME}: field `handler.module`: {module!r} names {path}, "
            "which does not exist; Hint: create it or remove the [handler] module key"
        )
    modules = own_modules(path)  # imports.py: the modules it imports, and the data they read
    own = [(f"handler/{name}", source / name) for name in [*modules, *own_data(path, modules)]]
    return [(f"handler/{module}.py", path), *own]


def sample_copies(source: Path) -> list[tuple[str, Path]]:
    samples = source / "samples"
    if not samples.is_dir():
        return []
    return [
        (path.relative_to(source).as_posix(), path)
        for path in samples.rglob("*")
        if path.is_file() and not hidden(path.relative_to(samples).parts)
    ]
