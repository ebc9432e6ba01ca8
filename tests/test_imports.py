"""A handler of several modules, as its author writes it: `from lines import scale` and a helper
package beside handler.py build into the bundle (those, and nothing else of the folder), serve
in one process and behind front processes, name their own files when they fail, and never meet
another function's module of the same name."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import httpx
import numpy as np
import onnxruntime as ort
import pytest

from edgeserve.builder import build
from edgeserve.bundle import Bundle
from edgeserve.cli import main
from edgeserve.http import create_app
from edgeserve.runtime import Runtime
from tests.models import mlp_model, write_function
from tests.server import running
from tests.threaded_server import serving

MANIFEST = (
    '[function]\nname = "{name}"\n[handler]\nmodule = "handler"\n'
    '[backend]\nprefer = ["onnxruntime"]\n'
)
HANDLER = """\
import numpy as np

from helpers import tag
from lines import scale


def preprocess(payload, ctx):
    return [{"x": np.asarray(payload["x"], dtype=np.float32) * scale(payload)}]


def postprocess(items, ctx):
    return {"y": items[0]["y"].tolist(), "tag": tag.TAG}
"""
LINES = """\
FACTOR = {factor}

def scale(payload):
    return FACTOR * payload["times"]
"""
TAG = """\
import lines

from . import names

TAG = f"{names.NAME} x{lines.FACTOR}"
"""
X = [0.5] * 16
SHIPPED = ["handler.py", "helpers/__init__.py", "helpers/names.py", "helpers/tag.py", "lines.py"]


def _function(folder: Path, name: str = "split", factor: float = 2.0) -> Path:
    """A function whose handler imports a module and a package of its folder, beside files
    the handler does not import: tests, a training script, a demo, data."""
    write_function(folder, mlp_model, MANIFEST.format(name=name), HANDLER)
    files = {
        "lines.py": LINES.format(factor=factor),
        "helpers/__init__.py": "",
        "helpers/tag.py": TAG,
        "helpers/names.py": f"NAME = {name!r}\n",
        "test_lines.py": "import lines\n",
        "training/train.py": "import lines\n",
        "demo.py": "import httpx\n",
        "notes.bin": "x" * 100_000,
        "samples/request.json": json.dumps({"x": X, "times": 1}),
    }
    for path, text in files.items():
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        (folder / path).write_text(text)
    return folder


def _expected(folder: Path, factor: float) -> list[float]:
    session = ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
    x = np.asarray([X], dtype=np.float32) * np.float32(factor)
    return session.run(None, {"x": x})[0][0].tolist()


def _build(folder: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(["build", str(folder), "--out", str(folder.parent / f"{folder.name}-out")])
    captured = capsys.readouterr()
    return code, " ".join((captured.out + captured.err).split())


def _handler_files(bundle: Path) -> list[str]:
    listed = json.loads((bundle / "edgeserve.json").read_text())["files"]
    return [name.removeprefix("handler/") for name in listed if name.startswith("handler/")]


def test_build_ships_the_modules_the_handler_imports_and_nothing_else(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Only handler.py was copied: the bundle failed to import `lines` wherever it ran."""
    folder = _function(tmp_path / "split")
    code, said = _build(folder, capsys)
    assert code == 0, said
    assert "handler: ran samples/request.json through preprocess, model, postprocess" in said
    shipped = "handler.py with helpers/__init__.py, helpers/names.py, helpers/tag.py, lines.py"
    assert f"handler: {shipped} built split" in said
    assert _handler_files(tmp_path / "split-out") == SHIPPED


def test_editing_a_module_of_the_handler_builds_a_new_bundle(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = _function(tmp_path / "split")

    def built_hash() -> str:
        code, said = _build(folder, capsys)
        assert code == 0, said
        return said.split(" hash ")[1].split()[0]

    first = built_hash()
    (folder / "demo.py").write_text("import rich\n")  # not the handler's: the same bundle
    (folder / "test_lines.py").write_text("import lines, helpers\n")
    assert built_hash() == first
    (folder / "helpers" / "names.py").write_text("NAME = 'renamed'\n")
    assert built_hash() != first


@pytest.mark.parametrize("workers", ["1", "2"], ids=["one process", "front processes"])
def test_serve_runs_a_handler_of_several_modules_and_names_their_files(
    tmp_path: Path, workers: str
) -> None:
    folder = _function(tmp_path / "split", factor=2.0)
    with running(folder, "--workers", workers) as (url, server):
        answer = httpx.post(f"{url}/invoke", json={"x": X, "times": 1}, timeout=30)
        failed = httpx.post(f"{url}/invoke", json={"x": X}, timeout=30)  # KeyError in lines.py
    assert answer.status_code == 200, answer.text
    assert answer.json()["tag"] == "split x2.0"
    np.testing.assert_allclose(answer.json()["y"], _expected(folder, 2.0), rtol=1e-5)
    assert failed.status_code == 500
    log = "".join(server.output)
    assert f'File "{folder}/lines.py", line 4, in scale' in log  # the user's file
    assert "/bundles/" not in log


def test_serving_a_source_again_after_editing_a_module_serves_the_edit(tmp_path: Path) -> None:
    folder = _function(tmp_path / "split", factor=2.0)
    with running(folder) as (url, _):
        before = httpx.post(f"{url}/invoke", json={"x": X, "times": 1}, timeout=30).json()
    (folder / "lines.py").write_text(LINES.format(factor=3.0))
    with running(folder) as (url, _):
        after = httpx.post(f"{url}/invoke", json={"x": X, "times": 1}, timeout=30).json()
    assert (before["tag"], after["tag"]) == ("split x2.0", "split x3.0")
    np.testing.assert_allclose(after["y"], _expected(folder, 3.0), rtol=1e-5)


def test_two_functions_with_modules_of_the_same_name_never_meet(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Both build and serve in this one process, each with its own `lines` and `helpers`, and
    neither is importable as `lines` by anyone else."""
    sources = {
        name: _function(tmp_path / name, name, factor)
        for name, factor in (("first", 2.0), ("second", 3.0))
    }
    for folder in sources.values():
        assert _build(folder, capsys)[0] == 0
    runtimes = [Runtime.load(Bundle.open(tmp_path / f"{name}-out")) for name in sources]
    with serving(create_app(runtimes[0])) as one, serving(create_app(runtimes[1])) as two:
        answers = [
            httpx.post(f"{url}/invoke", json={"x": X, "times": 1}, timeout=30).json()
            for url in (one, two)
        ]
    assert [answer["tag"] for answer in answers] == ["first x2.0", "second x3.0"]
    np.testing.assert_allclose(answers[1]["y"], _expected(sources["second"], 3.0), rtol=1e-5)
    loaded = {name for name, module in sys.modules.items() if _from(module, tmp_path)}
    assert {name.partition(".")[2] for name in loaded} == {  # in packages, none bare
        "handler",
        "lines",
        "helpers",
        "helpers.tag",
        "helpers.names",
    }
    assert len({name.partition(".")[0] for name in loaded}) == 4  # build's two, the bundles' two


def _from(module: object, folder: Path) -> bool:
    return str(getattr(module, "__file__", None) or "").startswith(f"{folder}/")


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        (
            {"lines.py": None},
            "{folder}/helpers/tag.py:1: the handler failed to import: ModuleNotFoundError: No "
            "module named 'lines'. Hint: install it, and list it in [handler] requirements so that "
            "targets get it; a module of your own goes in the function folder ({folder}/lines.py, "
            "or a package folder {folder}/lines/ with __init__.py)",
        ),
        (
            {"helpers/__init__.py": None},
            "{folder}/handler.py:3: the handler failed to import: ModuleNotFoundError: No module "
            "named 'helpers'. Hint: {folder}/helpers is a folder without __init__.py; add one",
        ),
        (
            {"helpers/names.py": "NAME = \n"},
            "{folder}/helpers/names.py:1: syntax error in the handler: invalid syntax: NAME =",
        ),
        (
            {"lines.py": "FACTOR = 1 / 0\n"},
            "{folder}/lines.py:1: the handler failed to import: ZeroDivisionError: division by "
            "zero",
        ),
        (
            {"samples/request.json": json.dumps({"x": X})},
            "{folder}/lines.py:4: handler.preprocess raised KeyError: 'times'",
        ),
    ],
    ids=["missing module", "folder without __init__", "syntax", "raises at import", "raises"],
)
def test_build_names_the_module_and_the_line_that_failed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], files: dict[str, str | None], expected: str
) -> None:
    folder = _function(tmp_path / "split")
    for path, text in files.items():
        if text is None:
            (folder / path).unlink()
        else:
            (folder / path).write_text(text)
    code, said = _build(folder, capsys)
    assert code == 2
    assert expected.format(folder=folder) in said
    assert "edgeserve_handler_" not in said
    assert "built" not in said


def test_a_bundle_of_several_modules_runs_without_its_source(tmp_path: Path) -> None:
    """The bundle alone: its source folder gone, the modules come from the bundle's copy."""
    folder = _function(tmp_path / "split", factor=2.0)
    bundle = build(folder, tmp_path / "bundle")
    for path in sorted(folder.rglob("*"), reverse=True):
        path.unlink() if path.is_file() else path.rmdir()
    with running(bundle.root) as (url, _):
        answer = httpx.post(f"{url}/invoke", json={"x": X, "times": 1}, timeout=30)
    assert answer.json()["tag"] == "split x2.0"


PLUGIN_HANDLER = """\
import importlib
from pathlib import Path

import numpy as np

WORDS = (Path(__file__).parent / "vocabulary.txt").read_text().split()


def preprocess(payload, ctx):
    scale = importlib.import_module("plugins.scale")
    return [{"x": np.asarray(payload["x"], dtype=np.float32) * scale.FACTOR}]


def postprocess(items, ctx):
    return {"y": items[0]["y"].tolist(), "words": WORDS, "unit": scale_unit()}


def scale_unit():
    from importlib import import_module

    return import_module("plugins").UNIT
"""
PLUGIN_FILES = {
    "vocabulary.txt": "alpha beta\n",
    "plugins/__init__.py": "UNIT = 'cm'\n",
    "plugins/scale.py": (
        "import os\n\n"
        "HERE = os.path.dirname(__file__)\n"
        "with open(os.path.join(HERE, 'data', 'factor.txt')) as file:\n"
        "    FACTOR = float(file.read())\n"
    ),
    "plugins/data/factor.txt": "3\n",
    "notes.txt": "not the handler's\n",
}


@pytest.mark.parametrize("workers", ["1", "2"], ids=["one process", "front processes"])
def test_a_bundle_finds_the_modules_importlib_imports_and_the_files_beside_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], workers: str
) -> None:
    """Neither `plugins` (imported by `importlib.import_module` alone) nor vocabulary.txt (read
    through `Path(__file__).parent` at import) went into the bundle, and importlib looked for
    `plugins` on sys.path, not among the handler's modules: once the source folder moved away,
    the bundle did not start. Both now travel in the bundle, with the data of the package
    (plugins/data/factor.txt) but nothing the modules do not name, importlib finds the
    bundle's copies, and the bundle serves from wherever it is."""
    folder = write_function(tmp_path / "plug", mlp_model, MANIFEST.format(name="plug"))
    (folder / "handler.py").write_text(PLUGIN_HANDLER)
    for path, text in PLUGIN_FILES.items():
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        (folder / path).write_text(text)
    code, said = _build(folder, capsys)
    assert code == 0, said
    bundle = tmp_path / "plug-out"
    assert _handler_files(bundle) == [
        "handler.py", "plugins/__init__.py", "plugins/data/factor.txt", "plugins/scale.py",
        "vocabulary.txt",
    ]  # fmt: skip
    folder.rename(tmp_path / "moved-away")
    with running(bundle, "--workers", workers) as (url, _):
        answer = httpx.post(f"{url}/invoke", json={"x": X}, timeout=30)
    assert answer.status_code == 200, answer.text
    assert (answer.json()["words"], answer.json()["unit"]) == (["alpha", "beta"], "cm")
    np.testing.assert_allclose(
        answer.json()["y"], _expected(tmp_path / "moved-away", 3.0), rtol=1e-5
    )
