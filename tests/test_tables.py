"""The two tables every list is derived from: backends (edgeserve.backends.BACKENDS) and target
kinds (edgeserve.kinds.KINDS). What build plans, what bundles pin and ship, and what deploy
loads must follow them, checked here through the public paths that read them."""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import replace
from pathlib import Path

import pytest

from edgeserve import build
from edgeserve.backends import BACKENDS, BY_NAME, MODULES, probe, suited
from edgeserve.backends.openvino import DEFAULTS, INPUTS_IR
from edgeserve.hardware import Cpu, Gpu, Platform
from edgeserve.kinds import KINDS
from edgeserve.manifest import BACKEND_NAMES
from edgeserve.profiles import SHIPPED_DIR, load_target
from tests.models import mlp_model, write_function


def test_the_manifest_schema_names_the_backends_of_the_table_in_its_order() -> None:
    assert tuple(backend.name for backend in BACKENDS) == BACKEND_NAMES


def test_each_platform_plans_its_suited_backends_best_first() -> None:
    assert {p: suited(p) for p in ("cpu", "lambda", "jetson", "nvidia-gpu")} == {
        "cpu": ("openvino", "onnxruntime"),
        "lambda": ("onnxruntime",),
        "jetson": ("tensorrt", "onnxruntime"),
        "nvidia-gpu": ("tensorrt", "onnxruntime"),
    }


def test_the_probe_looks_for_the_modules_each_backend_declares() -> None:
    """A backend's modules are probed (none listed elsewhere), and a machine lacking one of
    them is told which, and how to install it."""
    assert probe(nvml=False).modules & set(MODULES) == {m for m in MODULES if _findable(m)}
    gpu = Gpu(0, "NVIDIA H100", (9, 0), 80 * 2**30, "550.54")
    whole = Platform("nvidia-gpu", Cpu("x", 16, frozenset()), (gpu,), None, frozenset(MODULES))
    for backend in BACKENDS:
        assert backend.modules, backend.name
        assert backend.available(whole) is None, backend.name
        for module, how in backend.modules.items():
            lacking = replace(whole, modules=whole.modules - {module})
            assert backend.available(lacking) == how, (backend.name, module)


def _findable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:  # a dotted name whose parent package is missing
        return False


def test_every_kind_runs_somewhere_and_every_driver_implements_the_protocol() -> None:
    for kind in KINDS.values():
        assert kind.backends, kind.name
        if kind.driver is None:
            continue
        module, _, attribute = kind.driver.partition(":")
        driver = getattr(importlib.import_module(module), attribute)
        for verb in ("package", "deploy", "status", "rollback"):
            assert callable(getattr(driver, verb)), f"{kind.name}: no {verb}"


def test_every_shipped_profile_names_a_kind() -> None:
    shipped = sorted(SHIPPED_DIR.glob("*.toml"))
    assert shipped
    for path in shipped:
        assert load_target(path.stem).driver in KINDS


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_bundle_plans_and_pins_what_the_tables_say(kind: str, tmp_path: Path) -> None:
    source = write_function(tmp_path / "fn", mlp_model, '[function]\nname = "mlp"\n')
    bundle = build(source, tmp_path / "out", targets=(kind,))

    planned = KINDS[kind].backends
    assert bundle.backends(kind) == planned
    pinned = {line.split("==")[0] for line in bundle.requirements(kind)}
    packages = {BY_NAME[name].package for name in planned} - {None}
    assert packages | set(KINDS[kind].server) <= pinned
    unplanned = {b.package for b in BACKENDS if b.name not in planned} - {None} - packages
    assert not unplanned & pinned
    prepared = {name for b in BACKENDS if b.name in planned for name in b.prepared}
    only_for_optional_inputs = {INPUTS_IR, INPUTS_IR.replace(".xml", ".bin"), DEFAULTS}
    assert {name for b in BACKENDS for name in b.prepared} & set(bundle.metadata["files"]) == (
        prepared - only_for_optional_inputs  # the MLP has none
    )
