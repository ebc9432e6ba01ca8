"""Bundle.open: verified folders and archives; altered or unsafe ones are refused."""

from __future__ import annotations

import io
import json
import py_compile
import sys
import tarfile
from pathlib import Path

import pytest

from edgeserve.builder import build
from edgeserve.bundle import Bundle, canonical_json, content_hash
from edgeserve.errors import BundleError, ConfigError
from edgeserve.runtime import Runtime
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
    assert (bundle.file("model/model.xml"), bundle.handler_path, bundle.samples_dir) == (
        None,
        None,
        None,
    )
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


def test_a_bytecode_cache_beside_the_handler_fails_verification(bundle_dir: Path) -> None:
    (bundle_dir / "handler" / "__pycache__").mkdir(parents=True)
    (bundle_dir / "handler" / "__pycache__" / "handler.cpython-311.pyc").write_bytes(b"\x00")

    with pytest.raises(BundleError, match=r"unexpected file handler/__pycache__/handler"):
        Bundle.open(bundle_dir)


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


HANDLER = "def postprocess(items, ctx):\n    return {'rows': len(items)}\n"
EVIL = "import pathlib\npathlib.Path(MARKER).write_text('ran')\n" + HANDLER


@pytest.fixture(scope="module")
def with_handler(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The archive of a function with a handler, and a bytecode file that would run EVIL."""
    root = tmp_path_factory.mktemp("handler")
    manifest = '[function]\nname = "hmlp"\n[handler]\nmodule = "handler"\n'
    folder = write_function(root / "src", mlp_model, manifest, HANDLER)
    build(folder, root / "out" / "hmlp", backend="onnxruntime", archive=True)
    return root / "out" / "dist" / "hmlp-1-local.tar.gz"


def smuggled_pyc(tmp_path: Path) -> tuple[bytes, Path]:
    """An unchecked-hash .pyc: Python's default loader runs it whatever the source says."""
    marker = tmp_path / "marker"
    evil = tmp_path / "evil.py"
    evil.write_text(EVIL.replace("MARKER", repr(str(marker))))
    compiled = py_compile.compile(
        str(evil),
        cfile=str(tmp_path / "evil.pyc"),
        invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH,
    )
    return Path(compiled).read_bytes(), marker


PYC_NAME = f"handler/__pycache__/handler.{sys.implementation.cache_tag}.pyc"


def test_an_archive_smuggling_bytecode_is_refused_before_extraction(
    with_handler: Path, tmp_path: Path, cache_dir: Path
) -> None:
    pyc, _ = smuggled_pyc(tmp_path)
    evil = tarfile.TarInfo(PYC_NAME)
    evil.size = len(pyc)
    archive = tmp_path / "evil.tar.gz"
    with tarfile.open(with_handler) as source, tarfile.open(archive, "w:gz") as out:
        for info in source.getmembers():
            out.addfile(info, source.extractfile(info))
        out.addfile(evil, io.BytesIO(pyc))

    with pytest.raises(BundleError, match=rf"member '{PYC_NAME}' is not covered by the bundle's"):
        Bundle.open(archive)
    assert list((cache_dir / "bundles").iterdir()) == []


def test_bytecode_left_in_a_cached_bundle_never_runs(with_handler: Path, tmp_path: Path) -> None:
    """The cached copy of a clean archive is verified on every open: a .pyc planted there makes
    it damaged, so it is replaced from the archive; and loading the handler writes no .pyc."""
    cached = Bundle.open(with_handler)
    pyc, marker = smuggled_pyc(tmp_path)
    (cached.root / PYC_NAME).parent.mkdir()
    (cached.root / PYC_NAME).write_bytes(pyc)

    bundle = Bundle.open(with_handler)
    runtime = Runtime.load(bundle, backend="onnxruntime")

    assert runtime.handler is not None and not marker.exists()
    assert not (bundle.root / "handler" / "__pycache__").exists()
    assert Bundle.open(bundle.root).content_hash == cached.content_hash


def bomb(path: Path, member_size: int) -> Path:
    """A tiny archive whose one member declares `member_size` bytes of zeros."""
    info = tarfile.TarInfo("model/model.onnx")
    info.size = member_size
    with tarfile.open(path, "w:gz") as out:
        out.addfile(info, io.BytesIO(bytes(member_size)))
    return path


def test_a_compression_bomb_is_refused_before_a_byte_is_written(
    tmp_path: Path, cache_dir: Path
) -> None:
    archive = bomb(tmp_path / "bomb.tar.gz", 200 << 20)

    with pytest.raises(BundleError) as caught:
        Bundle.open(archive)
    assert archive.stat().st_size < 1 << 20
    assert "declare 209715200 unpacked (over 100:1)" in caught.value.message
    assert sum(f.stat().st_size for f in cache_dir.rglob("*") if f.is_file()) == 0


def test_the_size_caps_are_configurable_and_named_in_the_error(
    tmp_path: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EDGESERVE_MAX_BUNDLE_MB", "1")
    archive = bomb(tmp_path / "big.tar.gz", 2 << 20)

    with pytest.raises(BundleError) as caught:
        Bundle.open(archive)
    assert "member 'model/model.onnx' declares 2097152 bytes, over 1048576" in caught.value.message
    assert "EDGESERVE_MAX_BUNDLE_MB" in caught.value.message
    monkeypatch.setenv("EDGESERVE_MAX_BUNDLE_MB", "lots")
    with pytest.raises(ConfigError, match="EDGESERVE_MAX_BUNDLE_MB='lots': expected whole MB"):
        Bundle.open(archive)
