"""Precision as a user choice: build measures the drift of `auto` against fp32 and bounds it."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import httpx
import numpy as np
import pytest

from edgeserve.builder import build
from edgeserve.cli import main
from edgeserve.errors import ConfigError
from edgeserve.manifest import load_manifest
from edgeserve.precision import PrecisionCheck, check_precision
from edgeserve.signature import read_signature
from tests.models import conv_model, quantized_model, reshaping_model, write_function
from tests.server import running

MANIFEST = """\
[function]
name = "conv"

[backend]
prefer = ["openvino", "onnxruntime"]
precision = "{precision}"
{limit}
"""


def source(tmp_path: Path, precision: str, limit: float | None = None, samples: int = 2) -> Path:
    folder = tmp_path / "conv"
    conv_model(folder / "model.onnx")
    text = MANIFEST.format(precision=precision, limit=f"max_abs_diff = {limit}" if limit else "")
    (folder / "function.toml").write_text(text)
    rng = np.random.default_rng(3)
    (folder / "samples").mkdir(exist_ok=True)
    for index in range(samples):
        image = rng.normal(0, 4, (1, 3, 16, 16)).round(3)
        tensor = {"name": "image", "datatype": "FP32", "shape": [1, 3, 16, 16]}
        request = {"inputs": [tensor | {"data": image.ravel().tolist()}]}
        (folder / "samples" / f"s{index}.json").write_text(json.dumps(request))
    return folder


def measured(folder: Path) -> float:
    manifest = load_manifest(folder)
    check = check_precision(folder, manifest, read_signature(folder / "model.onnx", manifest.model))
    assert check is not None
    return check.max_abs_diff


def test_fp32_needs_no_check(tmp_path: Path) -> None:
    folder = source(tmp_path, "fp32")
    manifest = load_manifest(folder)
    assert (
        check_precision(folder, manifest, read_signature(folder / "model.onnx", manifest.model))
        is None
    )


def test_auto_is_measured_on_the_samples_and_described(tmp_path: Path) -> None:
    folder = source(tmp_path, "auto", samples=3)
    manifest = load_manifest(folder)
    check = check_precision(folder, manifest, read_signature(folder / "model.onnx", manifest.model))
    assert check is not None
    assert check.inputs == "3 samples"
    assert 0 <= check.max_abs_diff < 0.5
    assert "differ from fp32 by at most" in check.describe()


def test_without_samples_random_inputs_are_used(tmp_path: Path) -> None:
    folder = source(tmp_path, "auto", samples=0)
    manifest = load_manifest(folder)
    check = check_precision(folder, manifest, read_signature(folder / "model.onnx", manifest.model))
    assert check is not None and check.inputs.startswith("random inputs")


def test_build_refuses_drift_over_max_abs_diff_and_accepts_it_under(tmp_path: Path) -> None:
    drift = measured(source(tmp_path / "probe", "auto"))
    if drift == 0:
        pytest.skip("this CPU computes `auto` in fp32 (no bf16): nothing drifts")
    strict = source(tmp_path / "strict", "auto", limit=drift / 2)
    with pytest.raises(ConfigError, match="over max_abs_diff") as info:
        build(strict, tmp_path / "out-strict")
    assert 'precision = "fp32"' in info.value.message
    assert not (tmp_path / "out-strict").exists()
    loose = source(tmp_path / "loose", "auto", limit=drift * 2)
    assert build(loose, tmp_path / "out-loose").manifest.backend.max_abs_diff == drift * 2


def test_edgeserve_build_prints_the_measured_drift_and_the_inputs_it_used(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = source(tmp_path, "auto", samples=2)
    drift = measured(folder)
    capsys.readouterr()
    assert main(["build", str(folder), "--out", str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out
    assert f"outputs differ from fp32 by at most {drift:.3g} on 2 samples" in printed
    assert "precision auto (openvino)" in printed


def test_int8_on_a_model_without_quantization_warns_that_it_is_not_int8(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`precision = "int8"` computes in int8 only what the model quantizes: on a float model
    OpenVINO chose its precision as for "auto", and build said only its drift, so the user
    believed the bundle ran in int8. It warns now, naming the quantizers to run first; a model
    quantized by ONNX Runtime's quantize_static builds without the warning."""
    plain = source(tmp_path / "plain", "int8")
    assert main(["build", str(plain), "--out", str(tmp_path / "out-plain")]) == 0
    printed = capsys.readouterr().out
    assert "warning: precision int8 (openvino): outputs differ from fp32" in printed
    assert "the model carries no quantization" in printed and "quantize_static" in printed
    quantized = source(tmp_path / "quantized", "int8")
    quantized_model(tmp_path / "made" / "model.onnx")
    shutil.copy(tmp_path / "made" / "model.onnx", quantized / "model.onnx")
    assert main(["build", str(quantized), "--out", str(tmp_path / "out-quantized")]) == 0
    printed = capsys.readouterr().out
    assert "precision int8 (openvino): outputs differ from fp32" in printed
    assert "warning" not in printed and "no quantization" not in printed


def test_the_default_is_auto_and_only_targets_running_openvino_are_measured(
    tmp_path: Path,
) -> None:
    folder = source(tmp_path, "auto")
    (folder / "function.toml").write_text('[function]\nname = "conv"\n')
    assert load_manifest(folder).backend.precision == "auto"
    reported: list[PrecisionCheck] = []
    build(folder, tmp_path / "local", report=reported.append)
    assert [check.precision for check in reported] == ["auto"]
    build(folder, tmp_path / "lambda", targets=("aws-lambda",), report=reported.append)
    build(folder, tmp_path / "ort", backend="onnxruntime", report=reported.append)
    assert len(reported) == 1  # ONNX Runtime alone: nothing to compare


def test_the_invoke_sample_init_writes_is_what_the_check_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`init` writes samples/request.json as an /invoke payload; the check ran random inputs
    beside it, "no usable samples/". Without a handler that payload is the model's inputs;
    with one it is the handler's, and the line says why the samples were not used. (init's
    samples/v2.json is the model's inputs either way: v2 requests skip the handler. It holds
    request.json's tensors: one sample, run once.)"""
    folder = tmp_path / "conv"
    assert main(["init", str(folder), "--model", str(conv_model(tmp_path / "conv.onnx"))]) == 0
    assert main(["build", str(folder), "--out", str(tmp_path / "out")]) == 0
    printed = " ".join(capsys.readouterr().out.split())
    assert re.search(r"outputs differ from fp32 by at most \S+ on 1 sample \(", printed), printed
    (folder / "samples" / "v2.json").unlink()
    (folder / "handler.py").write_text(
        "import numpy as np\n\ndef preprocess(payload, ctx):\n"
        '    return [{"image": np.asarray(row, np.float32)} for row in payload["image"]]\n'
    )
    with (folder / "function.toml").open("a") as manifest_file:
        manifest_file.write('\n[handler]\nmodule = "handler"\n')
    assert main(["build", str(folder), "--out", str(tmp_path / "out")]) == 0
    printed = " ".join(capsys.readouterr().out.split())
    assert "on random inputs (no file in samples/ holds the model's inputs)" in printed


def test_a_model_failing_on_random_inputs_is_served_the_check_saying_it_did_not_run(
    tmp_path: Path,
) -> None:
    """Random `cols` (up to 15) make the model's Reshape fail: the precision check failed the
    build ("openvino: inference failed") and, now that serving a source runs build's checks,
    would have refused `serve` too, though real requests (cols 6) run. It says it did not
    run, why and what to do, and the function serves."""
    folder = write_function(tmp_path / "fn", reshaping_model, '[function]\nname = "fn"\n')
    with running(folder, "--workers", "1") as (url, server):
        tensors = [
            {"name": "x", "datatype": "FP32", "shape": [1, 6], "data": [0, 1, 2, 3, 4, 5]},
            {"name": "cols", "datatype": "INT64", "shape": [1, 1], "data": [6]},
        ]
        answer = httpx.post(f"{url}/v2/models/fn/infer", json={"inputs": tensors}, timeout=30)
    assert answer.json()["outputs"][0]["data"] == [0, 1, 2, 3, 4, 5]
    said = " ".join("".join(server.output).split())
    assert (
        "WARNING: the precision check did not run: on random inputs (no samples/), "
        "openvino: the model failed on the request's values: "
    ) in said
    assert "Hint: add a sample of a real request to samples/, or set [backend] precision" in said


def test_serving_a_source_logs_the_measured_drift_once(tmp_path: Path) -> None:
    """`serve` of a source folder printed the drift twice: check_precision logged it, and so
    did the report that serve passes to the build. The report alone says it now."""
    folder = source(tmp_path, "auto", samples=1)
    with running(folder, "--workers", "1") as (_url, server):
        said = "".join(server.output)
    assert said.count("outputs differ from fp32 by at most") == 1, said
