"""`edgeserve init`: a new function folder that builds and serves with no edits.

Two ways in. With a model of the user's (`--model`, or a folder holding only one .onnx file),
the manifest and a sample request are written from the model's own signature: names, datatypes
and dims, so the sample fits the model and `/invoke` speaks its tensors. Without one, the
skeleton in the package (`edgeserve/templates/function/`, read through importlib.resources so it
works from an installed wheel; `.tmpl` files rendered with the function's name) gives a demo
MLP with a handler; its model is generated, not shipped, so the package holds no binaries.
"""

from __future__ import annotations

import json
import logging
import re
import shlex
import shutil
import socket
from importlib.resources import files
from importlib.resources.abc import Traversable
from pathlib import Path, PurePosixPath
from string import Template

from pydantic import ValidationError

from edgeserve.adopted import DimNames, adopted_manifest
from edgeserve.backends.sessions import dim_names
from edgeserve.dryrun import NotABatchAxis, SkippedCheck, batch_axis_verdict, runnable_sample
from edgeserve.errors import ConfigError
from edgeserve.manifest import DEFAULT_PORT, MANIFEST_NAME, FunctionInfo, ModelSection
from edgeserve.modelfile import external_data
from edgeserve.modelgen import mlp_model
from edgeserve.samples import sample_request, sample_v2_request
from edgeserve.signature import read_signature, unbatchable
from edgeserve.types import Signature, TensorDict

log = logging.getLogger("edgeserve")

TEMPLATE = "function"
INVOKE_SAMPLE = PurePosixPath("samples/request.json")
"""init's /invoke request: the model's tensors by name (or the demo handler's payload)."""
V2_SAMPLE = PurePosixPath("samples/v2.json")
"""init's KServe v2 infer request of the same tensors, for /v2/models/<name>/infer."""


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
    """The given name, or the folder's name made to fit the manifest's name pattern and the
    cluster targets' DNS labels too (`_` and `.` become `-`)."""
    if name is None:
        name = re.sub(r"[^a-z0-9-]+", "-", dest.resolve().name.lower()).strip("-")[:63]
        name = name or "function"
    try:
        FunctionInfo(name=name)
    except ValidationError:
        raise ConfigError(
            f"function name {name!r}: expected lowercase letters, digits, '-' or '_', "
            "starting with a letter or digit, at most 63 characters"
        ) from None
    return name


def init_function(dest: Path, name: str | None = None, model: Path | None = None) -> Path:
    """Scaffold a working function into `dest`: around `model` (or the one .onnx `dest` holds),
    else the demo (manifest, handler, generated MLP, sample)."""
    if model is not None and not model.is_file():
        found = "a folder" if model.is_dir() else "no such file"
        raise ConfigError(f"--model {model}: {found}; expected an ONNX model file")
    present = _folder_model(dest)
    if model is not None and present is not None and present.name != model.name:
        raise ConfigError(f"{dest}: already holds {present.name}; expected only {model.name}")
    adopted = model or present
    if adopted is None:
        _refuse_unless_empty(dest, allowed=())
        _write(dest, render_templates(function_name(dest, name)))
        mlp_model(dest / "model.onnx")
        return dest
    weights = external_data(adopted)  # side files of weights: they go with the model
    _refuse_unless_empty(dest, allowed=(adopted.name, *weights))
    signature = read_signature(adopted, ModelSection())
    if model is not None and present is None:
        dest.mkdir(parents=True, exist_ok=True)
        log.info("copying %s into %s", model.name, dest)
        _copy_all([(model.parent / file, dest / file) for file in (model.name, *weights)])
    dims = dim_names(adopted, outputs=True)
    if signature.batched:  # seconds for a large model: the CLI shows this line meanwhile
        log.info(
            "running %s on random rows to check that its first axis is a batch axis", adopted.name
        )
    checked = batch_axis_verdict(adopted, signature) if signature.batched else None
    if not signature.batched:  # said as a comment in function.toml alone, where few look
        tensors = (*signature.inputs, *signature.outputs)
        axes = ", ".join(f"{spec.name!r}: {{0: 'batch'}}" for spec in tensors)
        log.warning(
            "batching off: no batch axis (%s), so every request runs alone. Hint: export the "
            "model with a dynamic batch axis to batch (PyTorch: torch.onnx.export(..., "
            "dynamic_axes={%s}))",
            unbatchable(signature),
            axes,
        )
    elif isinstance(checked, NotABatchAxis):
        log.warning("batching off: a run showed %s", checked.finding)
    if isinstance(checked, SkippedCheck):  # it was written on in silence; build then refused
        log.warning(
            "the batch-axis check did not run: ONNX Runtime %s; batching is written on, "
            "unchecked. `edgeserve build` says whether a backend serves the model",
            checked.reason,
        )
    sample = runnable_sample(adopted, signature)
    named = function_name(dest, name)
    _write(dest, adopted_files(named, adopted.name, signature, dims, checked, sample))
    return dest


def adopted_files(
    name: str,
    model_file: str,
    signature: Signature,
    dims: DimNames | None = None,
    checked: NotABatchAxis | SkippedCheck | None = None,
    sample: TensorDict | None = None,
) -> dict[PurePosixPath, str]:
    """The manifest and sample request for a model of the user's (pure: no writes); `dims`:
    the model's named dims ({tensor: {axis: name}}), which tie an output's length to an
    input's; `checked`: what the batch-axis check found (dryrun.batch_axis_verdict; None:
    a batch axis, or none to check); `sample`: the request's tensors
    (`dryrun.runnable_sample`), else random ones."""
    manifest = adopted_manifest(name, model_file, signature, dims or {}, checked)
    written = {
        PurePosixPath(MANIFEST_NAME): manifest,
        INVOKE_SAMPLE: json.dumps(sample_request(signature, sample)) + "\n",
    }
    if (v2 := sample_v2_request(signature, sample)) is not None:
        written[V2_SAMPLE] = json.dumps(v2) + "\n"
    return written


def suggested_port(preferred: int = DEFAULT_PORT, tries: int = 20) -> int:
    """`preferred`, else the first port after it free on 127.0.0.1 (where `serve` listens by
    default), so that the next steps init prints work as written here (8080 taken by another
    server made them fail: "address already in use")."""
    for port in range(preferred, preferred + tries):
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    return preferred


def next_steps(dest: Path, port: int = DEFAULT_PORT) -> str:
    """The folder made and what to run next: build or serve it, then send each sample init
    wrote the way that sample goes (`edgeserve invoke` posts to /invoke; a v2 request goes to
    the model's route)."""
    folder = shlex.quote(str(dest))
    lines = [f"{dest}  (next: edgeserve build {folder})"]
    if (dest / "handler.py").is_file():  # the demo's: an adopted model gets none
        lines.append(
            "a demo: a generated MLP and its handler (no --model given). To adopt your model: "
            "edgeserve init NEW --model path/to/model.onnx"
        )
    taken = f" ({DEFAULT_PORT} is in use here)" if port != DEFAULT_PORT else ""
    lines.append(f"try it: edgeserve serve {folder} --port {port}{taken}, then from another shell:")
    if (dest / INVOKE_SAMPLE).is_file():
        sample = shlex.quote(str(dest / INVOKE_SAMPLE))
        lines.append(f"  edgeserve invoke 127.0.0.1:{port} --file {sample}")
    if (dest / V2_SAMPLE).is_file():
        sample = shlex.quote(f"@{dest / V2_SAMPLE}")
        route = f"127.0.0.1:{port}/v2/models/{function_name(dest)}/infer"
        lines.append(
            f"  curl -s -H 'Content-Type: application/json' --data-binary {sample} {route}"
        )
    return "\n".join(lines)


def _folder_model(dest: Path) -> Path | None:
    """The model a folder holds when it holds only that: one .onnx file, and the side files
    of its weights if it keeps them apart."""
    if not dest.is_dir():
        return None
    models = [entry for entry in dest.iterdir() if entry.suffix == ".onnx" and entry.is_file()]
    if len(models) != 1:
        return None
    others = set(_files(dest)) - {models[0].name}
    if others and others != set(external_data(models[0])):
        return None
    return models[0]


def _files(dest: Path) -> list[str]:
    """Every file under `dest`, as a POSIX path relative to it (weights may lie in a subfolder:
    `location="weights/model.bin"`)."""
    return sorted(path.relative_to(dest).as_posix() for path in dest.rglob("*") if path.is_file())


def _refuse_unless_empty(dest: Path, allowed: tuple[str, ...]) -> None:
    if dest.exists() and not dest.is_dir():
        raise ConfigError(f"{dest}: exists and is not a folder; Hint: choose a new path")
    kept = {PurePosixPath(name).parts[0] for name in allowed}  # a subfolder of weights too
    others = (
        sorted(
            {p.name for p in dest.iterdir() if p.name not in kept}
            | {name for name in _files(dest) if name not in allowed and name.split("/")[0] in kept}
        )
        if dest.exists()
        else []
    )
    if others:
        raise ConfigError(
            f"{dest}: already exists and holds {others[:5]}; expected a new or empty folder, or "
            "one holding only a model. Hint: choose a new path (edgeserve init never overwrites "
            "files), or `edgeserve init NEW --model path/to/model.onnx`"
        )


def _copy_all(pairs: list[tuple[Path, Path]]) -> None:
    """Copy the model and its weights whole or not at all: an init stopped mid-copy (Ctrl-C on
    a large model) left a cut model, which the next init of the folder took for the one to
    adopt. Each file goes to a `.part` beside its place, and all are moved in once copied."""
    parts = [(source, target.with_name(f".{target.name}.part"), target) for source, target in pairs]
    try:
        for source, part, _ in parts:
            part.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, part)
        for _, part, target in parts:
            part.replace(target)
    finally:
        for _, part, _ in parts:
            part.unlink(missing_ok=True)


def _write(dest: Path, rendered: dict[PurePosixPath, str]) -> None:
    for relative, text in rendered.items():
        target = dest.joinpath(*relative.parts)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")


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
