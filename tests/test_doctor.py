"""`edgeserve doctor FUNCTION` as a user runs it: what serving that function here would do, a
row per step (manifest, model, build, backend, handler, warm-up and samples, layout) with its
verdict, and an exit code from the error tree for the worst problem found."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from edgeserve.backends import choose, probe
from edgeserve.manifest import load_manifest
from tests.models import determinant_model, mlp_model, write_function

ROOT = Path(__file__).resolve().parents[1]
OCR = ROOT / "functions" / "ocr"
Rows = dict[str, tuple[str, str]]


def doctor(*argv: str, cwd: Path | None = None) -> tuple[int, Rows, str]:
    """Run `edgeserve doctor ARGV` (wide enough that no row wraps but for its hint): the exit
    status, the function's rows {check: (verdict, found and hint)}, stderr."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "COLUMNS": "400", "PYTHONPATH": path}  # this checkout's first
    done = subprocess.run(
        [sys.executable, "-m", "edgeserve", "doctor", *argv],
        capture_output=True, text=True, timeout=180, env=env, cwd=cwd, check=False,
    )  # fmt: skip
    return done.returncode, _rows(done.stdout), done.stderr


def _rows(out: str) -> Rows:
    """The rows of the table after the machine's, a row's continued lines joined to it."""
    rows: Rows = {}
    check = ""
    _, titled, table = out.partition(" on this machine")
    assert titled, f"no table of the function in:\n{out}"
    for line in table.splitlines():
        cells = [cell.strip() for cell in line.split("│")[1:-1]]
        if len(cells) != 3 or cells[0] == "check":
            continue
        if cells[0]:
            check = cells[0]
            rows[check] = (cells[1], cells[2])
        else:
            verdict, found = rows[check]
            rows[check] = (verdict, f"{found} {cells[2]}")
    return rows


def test_the_ocr_function_gets_a_clean_report_with_its_backend_and_each_samples_latency() -> None:
    status, rows, err = doctor(str(OCR))
    assert status == 0, err
    assert "error:" not in err
    assert [check for check in rows if not check.startswith("samples/")] == [
        "manifest", "model", "build", "backend", "handler", "requirements", "warm-up", "layout"
    ]  # fmt: skip
    assert {verdict for verdict, _ in rows.values()} == {"ok"}
    assert rows["model"][1].startswith("inputs image FP32 [-1, 1, 32, -1] (pads axis 3 with 0)")
    assert "batch axis 0, up to 32 rows a batch" in rows["model"][1]
    chosen = choose(probe(), prefer=load_manifest(OCR).backend.prefer).name
    assert re.match(rf"{chosen}: .*; loads the model in [\d.]+ ms$", rows["backend"][1])
    assert rows["requirements"][1] == "installed: pillow>=10"
    pages = sorted(path.name for path in (OCR / "samples").glob("*.png"))
    assert sorted(check.removeprefix("samples/") for check in rows if "/" in check) == pages
    for page in pages:
        assert re.match(r'/invoke: 200 in [\d.]+ ms: \{"text":', rows[f"samples/{page}"][1])
    assert rows["layout"][1].startswith("serve: ")


def test_a_broken_manifest_key_gets_the_builds_error_and_its_exit_code(tmp_path: Path) -> None:
    manifest = '[function]\nname = "broken"\n[batching]\nmax_batchsize = 4\n'
    folder = write_function(tmp_path / "broken", mlp_model, manifest)
    built = subprocess.run(
        [sys.executable, "-m", "edgeserve", "build", str(folder), "--out", str(tmp_path / "b")],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    status, rows, err = doctor(str(folder))
    assert status == built.returncode == 2  # ConfigError's
    verdict, found = rows["manifest"]
    assert verdict == "fail"
    assert "field `batching.max_batchsize`" in found
    assert built.stderr.strip() == f"error: {found}"
    assert {check: verdict for check, (verdict, _) in rows.items() if check != "manifest"} == {
        step: "skipped" for step in ("model", "build", "backend", "handler", "warm-up", "layout")
    }
    assert "doctor: 1 problem with" in err


def test_a_handler_requirement_not_installed_is_named_with_the_pip_command(tmp_path: Path) -> None:
    manifest = (
        '[function]\nname = "needy"\n[backend]\nprefer = ["onnxruntime"]\n'
        '[handler]\nmodule = "handler"\nrequirements = ["numpy>=1", "edgeserve-no-such-dep>=2.1"]\n'
    )
    handler = "def postprocess(items, ctx):\n    return items\n"
    folder = write_function(tmp_path / "needy", mlp_model, manifest, handler)
    status, rows, _ = doctor(str(folder))
    assert status == 1  # a failure of this machine, not of the function (2)
    assert rows["handler"] == ("ok", f"{folder / 'handler.py'} imports; it defines postprocess")
    verdict, found = rows["requirements"]
    assert verdict == "fail"
    assert "edgeserve-no-such-dep>=2.1 (not installed)" in found
    assert "numpy>=1" not in found.partition("hint:")[0]  # installed: met
    assert found.endswith("hint: pip install 'edgeserve-no-such-dep>=2.1'")
    assert rows["warm-up"][0] == "ok"  # the handler imports: serve would start


def test_a_model_the_chosen_backend_refuses_is_reported_with_one_that_loads_it(
    tmp_path: Path,
) -> None:
    folder = write_function(tmp_path / "det", determinant_model, '[function]\nname = "det"\n')
    status, rows, err = doctor(str(folder), "--backend", "openvino")
    assert status != 0
    verdict, found = rows["backend"]
    assert verdict == "fail"
    assert found.startswith("openvino: set by the explicit override. It fails on the model: ")
    assert "Det" in found  # OpenVINO's own words: no conversion for the op
    assert "serve stops here: it does not fall back to another backend" in found
    assert 'onnxruntime loads this model here (tried): [backend] prefer = ["onnxruntime"]' in found
    assert rows["warm-up"] == ("skipped", "needs the model loaded")
    assert "backend" in err


def test_a_model_alone_is_examined_as_the_function_init_makes_of_it(tmp_path: Path) -> None:
    mlp_model(tmp_path / "scorer.onnx")
    status, rows, err = doctor("scorer.onnx", cwd=tmp_path)
    assert status == 0, err
    verdict, found = rows["manifest"]
    assert verdict == "note"
    assert "hint: edgeserve init scorer --model scorer.onnx, then edgeserve serve scorer" in found
    assert rows["model"] == (
        "ok", "inputs x FP32 [-1, 16]; outputs y FP32 [-1, 4]; batch axis 0, up to 32 rows a batch"
    )  # fmt: skip
    assert re.match(r'/invoke: 200 in [\d.]+ ms: \{"y":\[\[', rows["samples/request.json"][1])
    assert not (tmp_path / "scorer").exists()  # nothing written beside the model


def test_a_built_bundle_is_examined_on_the_backend_forced(tmp_path: Path) -> None:
    backend = "onnxruntime"  # not the one a CPU machine would choose
    folder = write_function(tmp_path / "mlp", mlp_model, '[function]\nname = "mlp"\n')
    subprocess.run(
        [sys.executable, "-m", "edgeserve", "build", str(folder), "--out", str(tmp_path / "b")],
        capture_output=True, timeout=120, check=True,
    )  # fmt: skip
    status, rows, err = doctor(str(tmp_path / "b"), "--backend", backend)
    assert status == 0, err
    assert rows["manifest"][1].startswith("the bundle of mlp version 1, built for local")
    assert rows["backend"][1].startswith(f"{backend}: set by the explicit override; loads")
    assert "build" not in rows  # a bundle is built already
    assert rows["handler"] == ("ok", "none: /invoke takes and answers the model's tensors")


def test_a_load_slower_than_the_bound_is_reported_not_waited_for(tmp_path: Path) -> None:
    folder = write_function(tmp_path / "mlp", mlp_model, '[function]\nname = "mlp"\n')
    status, rows, _ = doctor(str(folder), "--load-timeout", "1e-6")
    assert status == 1  # BackendError's
    verdict, found = rows["backend"]
    assert verdict == "fail"
    assert "It is still loading the model after 1e-06 s" in found
    assert "doctor --load-timeout S" in found  # the hint
    assert rows["warm-up"] == ("skipped", "needs the model loaded")
    assert rows["layout"][0] == "ok"


def test_a_forced_backend_this_machine_lacks_fails_the_backend_row_of_the_function(
    tmp_path: Path,
) -> None:
    folder = write_function(tmp_path / "mlp", mlp_model, '[function]\nname = "mlp"\n')
    status, rows, err = doctor(str(folder), "--backend", "tensorrt")  # no NVIDIA GPU here
    assert status == 2
    assert rows["build"][0] == "ok"
    verdict, found = rows["backend"]
    assert verdict == "fail"
    assert "backend 'tensorrt' (from the explicit override) cannot run here" in found
    assert rows["warm-up"] == ("skipped", "needs a backend")
    assert "backend" in err
