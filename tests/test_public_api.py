"""The public API is `edgeserve/__init__.py`: a sorted `__all__`, every name in it real, nothing
public left out, and importing it stays light (names load on first use)."""

from __future__ import annotations

import importlib
import inspect
import subprocess
import sys
import types

import edgeserve

HEAVY = ("numpy", "onnx", "onnxruntime", "openvino", "starlette", "uvicorn", "boto3", "mangum")


def test_all_is_sorted_and_complete() -> None:
    for name in edgeserve.__all__:
        getattr(edgeserve, name)  # loads every lazy name
    public = [
        name
        for name, value in vars(edgeserve).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    ]
    assert edgeserve.__all__ == sorted(edgeserve.__all__)
    assert sorted(public) == [name for name in edgeserve.__all__ if name != "__version__"]
    assert set(edgeserve.__all__) <= set(dir(edgeserve))


def test_every_name_is_edgeserve_own_and_documented() -> None:
    for name in edgeserve.__all__:
        if name == "__version__":
            continue
        value = getattr(edgeserve, name)
        assert value.__module__.startswith("edgeserve."), name
        assert inspect.getdoc(value), f"{name} has no docstring"


def test_the_verbs_stay_functions_after_their_modules_are_imported() -> None:
    for module in ("edgeserve.builder", "edgeserve.server", "edgeserve.targets"):
        importlib.import_module(module)
    assert all(inspect.isfunction(getattr(edgeserve, v)) for v in ("build", "serve", "deploy"))
    assert [edgeserve.build.__name__, edgeserve.serve.__name__, edgeserve.deploy.__name__] == [
        "build",
        "serve",
        "deploy",
    ]
    assert issubclass(edgeserve.InvalidInput, edgeserve.EdgeserveError)


def test_unknown_names_raise_attribute_error() -> None:
    try:
        edgeserve.no_such_thing  # noqa: B018
    except AttributeError as exc:
        assert "no_such_thing" in str(exc)
    else:
        raise AssertionError("edgeserve.no_such_thing did not raise")


def test_import_and_cli_help_load_no_heavy_module() -> None:
    code = (
        "import sys, edgeserve, edgeserve.cli\n"
        "try:\n"
        "    edgeserve.cli.main(['--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.splitlines()[-1] == "[]"
