"""What a path given where a function was expected is, and what to give instead: a model
file is told the function it lies in, or `init`; build's and serve's messages share this."""

from __future__ import annotations

from pathlib import Path

from edgeserve.manifest import MANIFEST_NAME


def model_hint(path: Path, verb: str) -> str:
    """What to do with a model file given to `edgeserve VERB` where a function was expected:
    the function folder it lies in, else `init` to make one around it."""
    folder = path.parent
    if (folder / MANIFEST_NAME).is_file():
        return f"Hint: it belongs to the function {folder}: `edgeserve {verb} {folder}`"
    return (
        f"Hint: `edgeserve init {path.stem} --model {path}` makes a function of it, then "
        f"`edgeserve {verb} {path.stem}`"
    )


def not_a_source(path: Path) -> str:
    """Why `path`, given to build, is not a function source folder, and what to give."""
    expected = f"expected a function folder holding {MANIFEST_NAME}"
    if not path.exists():
        return f"{path}: no such folder; {expected}"
    if path.suffix.lower() == ".onnx":  # the newcomer's first try: build the model itself
        return f"{path} is an ONNX model, not a function; {expected}. {model_hint(path, 'build')}"
    return f"{path}: not a folder; {expected}"
