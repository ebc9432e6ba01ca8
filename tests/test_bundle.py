"""Bundle.open: verified folders and archives; altered or unsafe ones are refused."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

from edgeserve.builder import build
from edgeserve.bundle import Bundle, canonical_json, content_hash
from edgeserve.errors import BundleError
from tests.models import mlp_model, write_function


@pytest.fixture(autouse=True)
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("EDGESERVE_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A bundle with an archive, built once; tests copy it before changing anything."""
    root = tmp_path_factory.mktemp("built")
    folder = write_function(root / "src", mlp_model, '[function]\nname = "mlp"\n')
    build(folder, root / "out" / "mlp", backend="onnxruntime", archive=True)
    return root / "out"


@pytest.fixture
def bundle_dir(built: Path, tmp_path: Path) -> Path:
    import shutil

    return Path(shutil.copytree(built / "mlp", tmp_path / "mlp"))


def altered_message(root: Path, what: str) -> str:
    return f"bundle at {root} was altered: {what}; rebuild with `edgeserve build`"


def test_an_intact_bundle_opens_with_its_paths(bundle_dir: Path) -> None:
    bundle = Bundle.open(bundle_dir)

    assert bundle.model_path == bundle_dir / "model" / "model.onnx"
    assert bundle.model_path.is_file()
    assert (bundle.ir_path, bundle.handler_path, bundle.samples_dir) == (None, None, None)
    assert bundle.targets == ("local",)
    assert bundle.backends("local") == ("onnxruntime",)
    assert bundle.manifest.function.name == "mlp"


def test_an_altered_model_is_refused_by_name(bundle_dir: Path) -> None:
    model = bundle_dir / "model" / "model.onnx"
    model.write_bytes(model.read_bytes()[:-1] + b"\x00")

    with pytest.raises(BundleError) as caught:
        Bundle.open(bundle_dir)
    assert caught.value.message == altered_message(bundle_dir, "model/model.onnx hash mismatch")


def test_an_edited_edgeserve_json_is_refused(bundle_dir: Path) -> None:
    meta = json.loads((bundle_dir / "edgeserve.json").read_text())
    meta["signature"]["batched"] = False
    (bundle_dir / "edgeserve.json").write_text(json.dumps(meta))

    with pytest.raises(BundleError) as caught:
        Bundle.open(bundle_dir)
    assert caught.value.message == altered_message(
        bundle_dir, "edgeserve.json content hash mismatch"
    )


def test_missing_and_extra_files_are_refused(bundle_dir: Path) -> None:
    (bundle_dir / "requirements" / "local.txt").rename(bundle_dir / "local.txt")

    with pytest.raises(BundleError, match=r"altered: requirements/local.txt is missing"):
        Bundle.open(bundle_dir)
    (bundle_dir / "local.txt").rename(bundle_dir / "requirements" / "local.txt")
    (bundle_dir / "model" / "extra.onnx").write_bytes(b"")
    with pytest.raises(BundleError, match=r"altered: unexpected file model/extra.onnx"):
        Bundle.open(bundle_dir)


def test_bytecode_caches_next_to_an_imported_handler_are_ignored(bundle_dir: Path) -> None:
    (bundle_dir / "handler" / "__pycache__").mkdir(parents=True)
    (bundle_dir / "handler" / "__pycache__" / "handler.cpython-311.pyc").write_bytes(b"\x00")

    assert Bundle.open(bundle_dir).root == bundle_dir


def test_a_function_source_is_not_a_bundle_and_the_error_says_what_to_do(tmp_path: Path) -> None:
    folder = write_function(tmp_path / "src", mlp_model, '[function]\nname = "s"\n')

    with pytest.raises(BundleError) as caught:
        Bundle.open(folder)
    assert "is a function source" in caught.value.message
    assert f"Hint: `edgeserve build {folder}`" in caught.value.message
    with pytest.raises(BundleError, match="no such file or folder"):
        Bundle.open(tmp_path / "nowhere")


def test_an_unknown_target_names_the_built_ones(bundle_dir: Path) -> None:
    with pytest.raises(BundleError, match=r"built for targets \['local'\], not 'jetson'"):
        Bundle.open(bundle_dir).requirements("jetson")


def test_an_archive_opens_into_the_cache_keyed_by_its_hash(built: Path, cache_dir: Path) -> None:
    archive = built / "dist" / "mlp-1-local.tar.gz"
    first = Bundle.open(archive)
    again = Bundle.open(archive)

    assert first.root == cache_dir / "bundles" / f"mlp-{first.content_hash}"
    assert again.root == first.root
    assert first.content_hash == Bundle.open(built / "mlp").content_hash
    assert sorted(p.name for p in (cache_dir / "bundles").iterdir()) == [first.root.name]


def test_a_damaged_cache_entry_is_replaced_from_the_archive(built: Path) -> None:
    archive = built / "dist" / "mlp-1-local.tar.gz"
    cached = Bundle.open(archive)
    (cached.root / "function.toml").write_text("tampered")

    assert Bundle.open(archive).root == cached.root
    assert (cached.root / "function.toml").read_text() != "tampered"


def test_a_file_that_is_not_an_archive_is_refused(tmp_path: Path) -> None:
    fake = tmp_path / "fake.tar.gz"
    fake.write_bytes(b"plain text")

    with pytest.raises(BundleError, match="not a readable bundle archive"):
        Bundle.open(fake)


def archive_with(path: Path, built: Path, evil: tarfile.TarInfo, data: bytes = b"") -> Path:
    """The real archive's members plus one crafted member."""
    with (
        tarfile.open(built / "dist" / "mlp-1-local.tar.gz") as source,
        tarfile.open(path, "w:gz") as out,
    ):
        for member in source.getmembers():
            out.addfile(member, source.extractfile(member))
        out.addfile(evil, io.BytesIO(data) if evil.isfile() else None)
    return path


def member(
    name: str, kind: bytes = tarfile.REGTYPE, link: str = "", size: int = 4
) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.size = kind, link, size if kind == tarfile.REGTYPE else 0
    return info


@pytest.mark.parametrize(
    ("evil", "problem"),
    [
        (member("../evil"), "would land outside the bundle"),
        (member("model/../../evil"), "would land outside the bundle"),
        (member("/tmp/evil-absolute"), "has an absolute path"),
        (member("escape", tarfile.SYMTYPE, "../../../evil"), "is a link"),
        (member("hard", tarfile.LNKTYPE, "/etc/passwd"), "is a link"),
        (member("dev", tarfile.CHRTYPE), "is a device, fifo or other special file"),
        (member("pipe", tarfile.FIFOTYPE), "is a device, fifo or other special file"),
    ],
)
def test_unsafe_archive_members_are_refused_before_anything_is_written(
    built: Path, tmp_path: Path, cache_dir: Path, evil: tarfile.TarInfo, problem: str
) -> None:
    workdir = tmp_path / "a" / "b"
    workdir.mkdir(parents=True)
    archive = archive_with(workdir / "evil.tar.gz", built, evil, b"evil")

    with pytest.raises(BundleError) as caught:
        Bundle.open(archive)
    assert f"member {evil.name!r} {problem}" in caught.value.message
    assert not list(tmp_path.rglob("evil")) and not Path("/tmp/evil-absolute").exists()
    assert list((cache_dir / "bundles").iterdir()) == []  # not even the safe members stay


def test_an_archive_with_an_altered_member_is_refused(
    built: Path, tmp_path: Path, cache_dir: Path
) -> None:
    source = built / "dist" / "mlp-1-local.tar.gz"
    altered = tmp_path / "altered.tar.gz"
    with tarfile.open(source) as tar, tarfile.open(altered, "w:gz") as out:
        for info in tar.getmembers():
            data = tar.extractfile(info).read()  # type: ignore[union-attr]
            if info.name == "function.toml":
                data = data.replace(b"mlp", b"mlq")
            out.addfile(info, io.BytesIO(data))

    with pytest.raises(BundleError, match=r"altered: function.toml hash mismatch"):
        Bundle.open(altered)
    assert list((cache_dir / "bundles").iterdir()) == []


def test_a_resealed_edgeserve_json_without_a_signature_is_refused(bundle_dir: Path) -> None:
    meta = json.loads((bundle_dir / "edgeserve.json").read_text())
    del meta["signature"]
    meta["content_hash"] = content_hash(meta)
    (bundle_dir / "edgeserve.json").write_bytes(canonical_json(meta))

    with pytest.raises(BundleError, match=r"edgeserve\.json: no valid signature or manifest"):
        Bundle.open(bundle_dir)
