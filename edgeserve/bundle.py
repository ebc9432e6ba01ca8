"""A built function, read back safely: every file and the content hash are checked on open.

Layout of a bundle folder (written by build.py):

    edgeserve.json            resolved manifest, signature, per-target backend plan, file hashes,
                              edgeserve version, content hash
    function.toml             the source manifest, as written
    model/<file>.onnx         the model; beside it, what a planned backend `prepare`s (OpenVINO:
                              model/model.xml + .bin, its IR), listed in backends.BACKENDS
    handler/<module>.py       the handler, when [handler] module is set, and beside it the
                              modules of the function folder it imports (lines.py, helpers/...)
                              and the data files they read (vocabulary.txt)
    samples/...               the function's samples, when it has some
    requirements/<target>.txt pinned runtime requirements per target

The content hash is the sha256 of edgeserve.json without its `content_hash` field, written
canonically; since that JSON lists every other file with its sha256, it covers the whole bundle.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from edgeserve.archive import Limits, SafeArchive, is_archive
from edgeserve.cache import bundles_dir, prune, touch
from edgeserve.errors import BundleError
from edgeserve.manifest import MANIFEST_NAME, Manifest, no_manifest_here, parse_manifest
from edgeserve.pathhints import model_hint
from edgeserve.types import Signature, SummedDim, TensorSpec, TiedDim

BUNDLE_FILE = "edgeserve.json"
FORMAT = 1
_INDEX_MAX_BYTES = 16 << 20
_HASH = re.compile(r"^[0-9a-f]{64}$")


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as source:
        for chunk in iter(lambda: source.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def canonical_json(data: Mapping[str, Any]) -> bytes:
    """The one way edgeserve writes JSON it hashes: sorted keys, fixed indent, final newline."""
    return (json.dumps(data, sort_keys=True, indent=2, ensure_ascii=False) + "\n").encode()


def content_hash(metadata: Mapping[str, Any]) -> str:
    unsealed = {key: value for key, value in metadata.items() if key != "content_hash"}
    return hashlib.sha256(canonical_json(unsealed)).hexdigest()


def list_files(root: Path) -> list[str]:
    """Every file under `root` as a sorted POSIX relative path, edgeserve.json excepted.

    Nothing is skipped (not even __pycache__): a file the content hash does not cover must make
    the bundle fail verification, or a smuggled .pyc would run with the handler.
    """
    found = []
    for folder, dirs, names in os.walk(root):
        dirs.sort()
        for name in names:
            relative = (Path(folder) / name).relative_to(root).as_posix()
            if relative != BUNDLE_FILE:
                found.append(relative)
    return sorted(found)


def signature_to_json(signature: Signature) -> dict[str, Any]:
    def spec(tensor: TensorSpec) -> dict[str, Any]:
        return {
            "name": tensor.name,
            "datatype": tensor.datatype,
            "dims": list(tensor.dims),
            "pad_axis": tensor.pad_axis,
            "pad_value": tensor.pad_value,
            "follows": tensor.follows,
            "ratio": tensor.ratio,
            "index_range": None if tensor.index_range is None else list(tensor.index_range),
            "index_table": tensor.index_table,
            "min_dims": None if tensor.min_dims is None else list(tensor.min_dims),
            "max_dims": None if tensor.max_dims is None else list(tensor.max_dims),
            "labels": list(tensor.labels),
            "ranked": tensor.ranked,
            "optional": tensor.optional,
        }

    return {
        "batched": signature.batched,
        "inputs": [spec(tensor) for tensor in signature.inputs],
        "outputs": [spec(tensor) for tensor in signature.outputs],
        "tied": [{"name": tie.name, "axes": [list(a) for a in tie.axes]} for tie in signature.tied],
        "summed": [dataclasses.asdict(summed) for summed in signature.summed],
    }


def signature_from_json(data: Mapping[str, Any]) -> Signature:
    def spec(tensor: Mapping[str, Any]) -> TensorSpec:
        return TensorSpec(
            tensor["name"],
            tensor["datatype"],
            tuple(tensor["dims"]),
            tensor["pad_axis"],
            tensor["pad_value"],
            tensor.get("follows"),
            tensor.get("ratio", 1.0),
            _index_range(tensor.get("index_range")),
            _dims(tensor.get("min_dims")),
            _dims(tensor.get("max_dims")),
            tuple(tensor.get("labels", ())),
            tensor.get("ranked", True),  # bundles built before unranked outputs had none
            tensor.get("optional", False),  # nor optional inputs
            index_table=tensor.get("index_table"),  # nor the name of an index range's table
        )

    return Signature(
        inputs=tuple(spec(tensor) for tensor in data["inputs"]),
        outputs=tuple(spec(tensor) for tensor in data["outputs"]),
        batched=data["batched"],
        tied=tuple(  # none in bundles built before inputs' shared dims were read
            TiedDim(tie["name"], tuple((name, axis) for name, axis in tie["axes"]))
            for tie in data.get("tied", ())
        ),
        summed=tuple(_summed(summed) for summed in data.get("summed", ())),  # nor sums
    )


def _summed(data: Mapping[str, Any]) -> SummedDim:
    name, axis = data["place"]
    terms = tuple((term, at) for term, at in data["terms"])
    return SummedDim(data["name"], (name, axis), terms, data["constant"])


def _dims(value: list[int] | None) -> tuple[int, ...] | None:
    """Bundles built before inputs had size bounds have none."""
    return None if value is None else tuple(value)


def _index_range(value: list[int] | None) -> tuple[int, int] | None:
    """Bundles built before inputs had an index range have none (no bound is kept)."""
    return None if value is None else (value[0], value[1])


@dataclass(frozen=True)
class Bundle:
    """A verified bundle folder: what the runtime loads and the deploy drivers ship."""

    root: Path
    manifest: Manifest
    signature: Signature
    content_hash: str
    metadata: Mapping[str, Any]
    source: Path | None = None  # the function folder a cached bundle was built from

    @classmethod
    def open(cls, path: Path) -> Bundle:
        """Open a bundle folder or a .tar.gz archive of one; raise BundleError unless intact."""
        if path.is_file() and is_archive(path):
            return _open_archive(path)
        if not (path / BUNDLE_FILE).is_file():
            raise BundleError(_not_a_bundle(path))
        metadata = _verified_metadata(path)
        try:
            signature = signature_from_json(metadata["signature"])
            manifest = metadata["manifest"]
        except (KeyError, TypeError, ValueError) as exc:
            raise BundleError(
                f"{path / BUNDLE_FILE}: no valid signature or manifest ({exc!r})"
            ) from None
        return cls(
            root=path,
            manifest=parse_manifest(manifest, source=str(path / BUNDLE_FILE)),
            signature=signature,
            content_hash=metadata["content_hash"],
            metadata=metadata,
        )

    @property
    def name(self) -> str:
        return self.manifest.function.name

    @property
    def version(self) -> str:
        return self.manifest.function.version

    @property
    def model_path(self) -> Path:
        return self.root / self.manifest.model.path

    def file(self, name: str) -> Path | None:
        """A file of the bundle by its relative path (`model/model.xml`), None when it has none."""
        return self.root / name if name in self.metadata["files"] else None

    @property
    def handler_path(self) -> Path | None:
        module = self.manifest.handler.module
        return self.root / "handler" / f"{module}.py" if module else None

    @property
    def handler_modules(self) -> tuple[str, ...]:
        """The handler's own modules in the bundle beside it (`lines.py`, `helpers/__init__.py`)
        and their data files: the files of its function folder that it imports or reads
        (edgeserve/imports.py)."""
        handler = f"handler/{self.manifest.handler.module}.py"
        return tuple(
            name.removeprefix("handler/")
            for name in sorted(self.metadata["files"])
            if name.startswith("handler/") and name != handler
        )

    @property
    def handler_source(self) -> Path | None:
        """The handler as its author knows it: in the source folder when built from one."""
        if self.source is None or self.handler_path is None:
            return self.handler_path
        return self.source / self.handler_path.name

    @property
    def samples_dir(self) -> Path | None:
        has_samples = any(name.startswith("samples/") for name in self.metadata["files"])
        return self.root / "samples" if has_samples else None

    @property
    def targets(self) -> tuple[str, ...]:
        return tuple(self.metadata["targets"])

    def backends(self, target: str) -> tuple[str, ...]:
        """The backends planned for `target`, best first."""
        return tuple(self._target(target)["backends"])

    def planned_backends(self) -> tuple[str, ...]:
        """The backends the bundle was built for, best first (the manifest's `prefer` already cut
        to its targets' platforms): a bundle built for Jetson or with `--backend onnxruntime`,
        served on a laptop, computes as it will where it is going, not on whatever else is
        installed."""
        planned = (name for target in self.targets for name in self.backends(target))
        return tuple(dict.fromkeys(planned))

    def requirements(self, target: str) -> list[str]:
        """The pinned pip requirements of `target` (comments and blank lines left out)."""
        self._target(target)
        text = (self.root / "requirements" / f"{target}.txt").read_text(encoding="utf-8")
        stripped = (line.strip() for line in text.splitlines())
        return [line for line in stripped if line and not line.startswith("#")]

    def _target(self, target: str) -> Mapping[str, Any]:
        try:
            plan: Mapping[str, Any] = self.metadata["targets"][target]
        except KeyError:
            raise BundleError(
                f"bundle at {self.root} was built for targets {list(self.targets)}, "
                f"not {target!r}; Hint: rebuild with `edgeserve build --target {target}`"
            ) from None
        return plan


def is_function_source(path: Path) -> bool:
    """A function source folder, not a bundle (reading a bundle never builds)."""
    return (path / MANIFEST_NAME).is_file() and not (path / BUNDLE_FILE).exists()


def _not_a_bundle(path: Path) -> str:
    if (path / MANIFEST_NAME).is_file():
        return (
            f"{path} is a function source (it has {MANIFEST_NAME} but no {BUNDLE_FILE}), "
            f"not a bundle; Hint: `edgeserve build {path}` makes one "
            "(`edgeserve serve` builds it for you)"
        )
    expected = (
        f"expected a function folder (holding {MANIFEST_NAME}) or a bundle (`edgeserve build`)"
    )
    if not path.exists():
        return f"{path}: no such file or folder; {expected}"
    if path.suffix.lower() == ".onnx":  # the newcomer's first try: serve the model itself
        return f"{path} is an ONNX model, not a function; {expected}. {model_hint(path, 'serve')}"
    said = f"{path} is not a bundle: no {BUNDLE_FILE}; {expected}, or a bundle's .tar.gz"
    if not path.is_dir():
        return said
    if any(path.glob("*.onnx")):  # a folder of a model, not yet a function: as build says
        return f"{path}: {no_manifest_here(path)}"
    inside = sorted(sub.name for sub in path.iterdir() if (sub / MANIFEST_NAME).is_file())
    if inside:  # the parent of several functions: each serves on its own
        shown = ", ".join(inside[:5]) + (", ..." if len(inside) > 5 else "")
        first = path / inside[0]
        return (
            f"{said}. It holds functions ({shown}): each serves on its own, as "
            f"`edgeserve serve {first}`"
        )
    return said


def recorded_build(root: Path) -> tuple[str, tuple[str, ...]] | None:
    """The content hash and the targets a bundle folder's edgeserve.json records, unverified
    (a build about to replace it names them): None where there is no bundle, "" and () where
    it records none."""
    try:
        metadata = json.loads((root / BUNDLE_FILE).read_bytes())
    except (FileNotFoundError, NotADirectoryError):
        return None
    except (OSError, ValueError):
        return "", ()
    if not isinstance(metadata, dict):
        return "", ()
    recorded, targets = metadata.get("content_hash"), metadata.get("targets")
    content_hash = recorded if isinstance(recorded, str) and _HASH.match(recorded) else ""
    return content_hash, tuple(targets) if isinstance(targets, dict) else ()


def _verified_metadata(root: Path) -> dict[str, Any]:
    def altered(what: str) -> BundleError:
        return BundleError(f"bundle at {root} was altered: {what}; rebuild with `edgeserve build`")

    try:
        metadata = json.loads((root / BUNDLE_FILE).read_text(encoding="utf-8"))
        recorded, files = metadata["content_hash"], metadata["files"]
    except (ValueError, KeyError, TypeError) as exc:
        raise altered(f"{BUNDLE_FILE} is unreadable ({exc})") from None
    if metadata.get("format") != FORMAT:
        raise BundleError(f"bundle at {root}: format {metadata.get('format')!r}, expected {FORMAT}")
    if content_hash(metadata) != recorded:
        raise altered(f"{BUNDLE_FILE} content hash mismatch")
    present = list_files(root)
    for name in sorted(files):
        if name not in present:
            raise altered(f"{name} is missing")
        if sha256_file(root / name) != files[name]:
            raise altered(f"{name} hash mismatch")
    extra = sorted(set(present) - set(files))
    if extra:
        raise altered(f"unexpected file {extra[0]}")
    return dict(metadata)


def _open_archive(archive: Path) -> Bundle:
    """Extract into a scratch folder, verify, then keep it under the cache, keyed by its hash."""
    bundles = bundles_dir()
    bundles.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".extract-", dir=bundles))
    try:
        with SafeArchive.open(archive, Limits.from_env()) as members:
            _check_covered(members)
            members.extract_to(scratch)
        bundle = Bundle.open(scratch)
        if not _HASH.match(bundle.content_hash):
            raise BundleError(f"{archive}: content hash {bundle.content_hash!r} is not a sha256")
        final = bundles / f"{bundle.name}-{bundle.content_hash}"
        kept = _keep(scratch, final)
        touch(final)
        prune(keep=final)
        return kept
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _check_covered(archive: SafeArchive) -> None:
    """Refuse, before extracting, any member the archive's own content hash does not cover."""
    try:
        listed = set(json.loads(archive.read(BUNDLE_FILE, _INDEX_MAX_BYTES))["files"])
    except (ValueError, KeyError, TypeError) as exc:
        raise BundleError(f"{archive.path}: {BUNDLE_FILE} is unreadable ({exc})") from None
    folders = {str(parent) for name in listed for parent in PurePosixPath(name).parents}
    for member in archive.members:
        name = member.name.rstrip("/")
        covered = name in folders if member.isdir() else name in listed | {BUNDLE_FILE}
        if not covered:
            raise BundleError(
                f"{archive.path}: member {member.name!r} is not covered by the bundle's content "
                "hash; refusing to extract. Hint: only open archives made by `edgeserve build`"
            )


def _keep(scratch: Path, final: Path) -> Bundle:
    """Move a verified scratch folder to `final`, unless an intact copy is already there."""
    if final.exists():
        try:
            return Bundle.open(final)
        except BundleError:  # a damaged cache entry: replace it
            shutil.rmtree(final, ignore_errors=True)
    with contextlib.suppress(OSError):  # another process kept the same bundle first
        scratch.rename(final)
    return Bundle.open(final)
