"""init_function: a new function folder that builds, opens, runs and serves with no edits."""

from __future__ import annotations

import asyncio
import json
import pickle
import re
import shutil
import subprocess
import sys
import zipfile
from importlib.resources import files
from pathlib import Path, PurePosixPath
from types import ModuleType

import httpx
import numpy as np
import onnx
import onnxruntime as ort
import openvino as ov
import pytest
from onnx import numpy_helper

from edgeserve.backends.openvino import IR_PATH
from edgeserve.builder import build, open_or_build
from edgeserve.bundle import Bundle
from edgeserve.cli import main
from edgeserve.errors import ConfigError, InvalidInput
from edgeserve.runtime import Runtime
from edgeserve.scaffold import init_function, render_templates, template_root
from edgeserve.types import Context
from tests.models import (
    bert_like_model,
    centered_model,
    classifier_model,
    exported_names_model,
    nonzero_model,
    pair_model,
    sequence_model,
    shapeless_model,
    total_model,
    zipmap_model,
)
from tests.server import running, served

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("EDGESERVE_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def numpy_mlp(model_path: Path, x: np.ndarray) -> np.ndarray:
    """The scaffolded MLP computed by hand from its own weights."""
    weights = {
        w.name: numpy_helper.to_array(w) for w in onnx.load(str(model_path)).graph.initializer
    }
    hidden = np.maximum(x @ weights["w1"] + weights["b1"], 0)
    return hidden @ weights["w2"] + weights["b2"]


def load_handler(path: Path) -> ModuleType:
    import importlib.util

    spec = importlib.util.spec_from_file_location("scaffolded_handler", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_init_then_build_then_open_runs_the_model(tmp_path: Path) -> None:
    source = init_function(tmp_path / "hello")
    built = build(source, tmp_path / "out" / "hello")
    bundle = Bundle.open(built.root)

    assert sorted(p.relative_to(source).as_posix() for p in source.rglob("*") if p.is_file()) == [
        "README.md",
        "function.toml",
        "handler.py",
        "model.onnx",
        "samples/request.json",
    ]
    assert bundle.manifest.function.name == "hello"
    assert bundle.signature.batched
    x = np.random.default_rng(1).standard_normal((3, 16)).astype(np.float32)
    session = ort.InferenceSession(str(bundle.model_path), providers=["CPUExecutionProvider"])
    (y,) = session.run(None, {"x": x})
    assert y.shape == (3, 4) and y.dtype == np.float32
    np.testing.assert_allclose(y, numpy_mlp(bundle.model_path, x), rtol=1e-5, atol=1e-5)
    ir = bundle.file(IR_PATH)
    assert ir is not None
    compiled = ov.Core().compile_model(str(ir), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    np.testing.assert_allclose(compiled({"x": x})["y"], y, rtol=1e-5, atol=1e-5)


def test_the_handler_takes_the_sample_and_answers_y(tmp_path: Path) -> None:
    bundle = build(init_function(tmp_path / "hello"), tmp_path / "out" / "hello")
    assert bundle.handler_path is not None and bundle.samples_dir is not None
    handler = load_handler(bundle.handler_path)
    sample = json.loads((bundle.samples_dir / "request.json").read_text())
    ctx = Context("application/json", {}, bundle.root)

    items = handler.preprocess(sample, ctx)
    x = np.stack([item["x"] for item in items])
    y = numpy_mlp(bundle.model_path, x).astype(np.float32)
    answer = handler.postprocess(
        [{**item, "y": row} for item, row in zip(items, y, strict=True)], ctx
    )

    assert answer == {"y": y[0].tolist()}
    many = Context("application/json", {}, bundle.root)
    assert len(handler.preprocess([sample, sample], many)) == 2
    assert handler.postprocess([{"y": y[0]}, {"y": y[0]}], many) == [{"y": y[0].tolist()}] * 2
    with pytest.raises(InvalidInput, match=r'item 0: expected \{"x": \[16 numbers\]\}'):
        handler.preprocess({"x": [1.0, 2.0]}, ctx)


def test_the_scaffolded_function_serves_with_no_edits(tmp_path: Path) -> None:
    source = init_function(tmp_path / "hello")
    sample = json.loads((source / "samples" / "request.json").read_text())
    expected = numpy_mlp(source / "model.onnx", np.asarray([sample["x"]], np.float32))[0]

    async def invoke_once() -> tuple[str, object]:
        runtime = Runtime.load(open_or_build(source))  # the path `edgeserve serve` takes
        await runtime.start()
        try:
            return runtime.backend_name, await runtime.invoke(sample, "application/json")
        finally:
            await runtime.stop(drain_timeout_s=5)

    backend, answer = asyncio.run(invoke_once())
    assert backend == "openvino"  # this machine is a CPU: the bundle's IR is what runs
    assert isinstance(answer, dict) and list(answer) == ["y"]
    # precision "auto": bf16 where the CPU has it (8-bit mantissa), about 2e-3 off here
    np.testing.assert_allclose(answer["y"], expected, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize(
    ("folder", "name"),
    [
        ("My Func!", "my-func"),
        ("ocr_v2", "ocr-v2"),  # `_` as `.`: Kubernetes targets take DNS labels only
        ("resnet50-v1.5_int8", "resnet50-v1-5-int8"),
        ("--__", "function"),
        ("Ünïcode", "n-code"),
    ],
)
def test_the_name_comes_from_the_folder_made_to_fit_the_pattern(
    tmp_path: Path, folder: str, name: str
) -> None:
    dest = init_function(tmp_path / folder)

    assert f'name = "{name}"' in (dest / "function.toml").read_text()
    assert f"# {name}\n" in (dest / "README.md").read_text()


def test_a_given_name_must_fit_the_pattern(tmp_path: Path) -> None:
    assert (
        'name = "given"'
        in (init_function(tmp_path / "x", name="given") / "function.toml").read_text()
    )
    with pytest.raises(ConfigError, match="function name 'Bad Name'"):
        init_function(tmp_path / "y", name="Bad Name")
    assert not (tmp_path / "y").exists()


def test_init_never_overwrites_a_non_empty_folder(tmp_path: Path) -> None:
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "mine.txt").write_text("mine")
    (tmp_path / "empty").mkdir()
    (tmp_path / "file").write_text("a file")

    with pytest.raises(
        ConfigError, match=r"already exists and holds \['mine.txt'\]; expected a new"
    ):
        init_function(tmp_path / "taken")
    with pytest.raises(ConfigError, match="exists and is not a folder"):
        init_function(tmp_path / "file")
    assert [p.name for p in (tmp_path / "taken").iterdir()] == ["mine.txt"]
    assert (init_function(tmp_path / "empty") / "function.toml").is_file()


def test_the_model_is_generated_the_same_every_time(tmp_path: Path) -> None:
    first = init_function(tmp_path / "a") / "model.onnx"
    second = init_function(tmp_path / "b") / "model.onnx"

    assert first.read_bytes() == second.read_bytes()
    onnx.checker.check_model(onnx.load(str(first)), full_check=True)


def test_templates_load_through_importlib_resources() -> None:
    root = template_root()

    assert root == files("edgeserve").joinpath("templates", "function")
    assert sorted(str(path) for path in render_templates("demo")) == [
        "README.md",
        "function.toml",
        "handler.py",
        "samples/request.json",
    ]
    assert all(isinstance(path, PurePosixPath) for path in render_templates("demo"))


@pytest.mark.slow
def test_init_works_from_a_built_wheel(tmp_path: Path) -> None:
    project = tmp_path / "project"
    shutil.copytree(
        REPO / "edgeserve", project / "edgeserve", ignore=shutil.ignore_patterns("__pycache__")
    )
    shutil.copy(REPO / "pyproject.toml", project)
    (project / "README.md").write_text("edgeserve\n")
    wheels = tmp_path / "wheels"
    pip = [
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--no-deps",
        "--no-build-isolation",
        "-q",
        "-w",
        str(wheels),
    ]
    built = subprocess.run([*pip, str(project)], capture_output=True, text=True, timeout=120)
    assert built.returncode == 0, built.stderr
    (wheel,) = wheels.glob("edgeserve-*.whl")
    assert "edgeserve/templates/function/handler.py" in zipfile.ZipFile(wheel).namelist()

    # import edgeserve from the wheel itself (a zip: no relative file paths can work there)
    script = (
        "import sys, pathlib; sys.path.insert(0, sys.argv[1]); import edgeserve.scaffold as s; "
        "assert s.__file__.startswith(sys.argv[1]), s.__file__; "
        "s.init_function(pathlib.Path(sys.argv[2]))"
    )
    subprocess.run(
        [sys.executable, "-c", script, str(wheel), str(tmp_path / "fn")], check=True, timeout=60
    )
    assert sorted(p.name for p in (tmp_path / "fn").iterdir()) == [
        "README.md",
        "function.toml",
        "handler.py",
        "model.onnx",
        "samples",
    ]


BERT_INPUTS = ("input_ids", "token_type_ids", "attention_mask")
ADOPTED = {  # model -> (its inputs in the manifest, the outputs /invoke answers with their shapes)
    "sequence": (sequence_model, ["tokens INT64 [-1, -1]"], {"pooled": (1, 8)}),
    "pair": (pair_model, ["features FP32 [1, 4]", "mask INT32 [1, 4]"],
             {"masked": (1, 4), "total": (1,)}),
    "classifier": (classifier_model, ["pixels FP32 [-1, 3, 32, 32]"], {"probabilities": (1, 10)}),
    # the sample's token_type_ids index a table of 2 rows: they were 0..15, refused by the server
    "bert": (bert_like_model, [f"{name} INT64 [-1, -1]" for name in BERT_INPUTS],
             {"hidden": (1, 32, 8), "pooled": (1, 8)}),
}  # fmt: skip


@pytest.mark.parametrize("kind", list(ADOPTED))
@pytest.mark.parametrize("how", ["--model", "folder holding the model"])
def test_init_adopts_a_model_and_its_sample_fits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str, how: str
) -> None:
    """`edgeserve init DIR --model M` (or DIR holding only M), serve, `edgeserve invoke` the
    sample it wrote: the answer has the model's own outputs, of the model's own shapes."""
    builder, inputs, outputs = ADOPTED[kind]
    dest = tmp_path / "fn"
    if how == "--model":
        model = builder(tmp_path / "mine" / f"{kind}.onnx")
        assert main(["init", str(dest), "--model", str(model)]) == 0
    else:
        builder(dest / f"{kind}.onnx")
        assert main(["init", str(dest)]) == 0
    assert sorted(p.name for p in dest.iterdir()) == sorted([f"{kind}.onnx", "function.toml",
                                                             "samples"])  # fmt: skip
    manifest = (dest / "function.toml").read_text()
    assert f'path = "{kind}.onnx"' in manifest and "help manifest" in manifest
    assert all(f"# input {spec}" in " ".join(manifest.split()) for spec in inputs)
    assert ("[batching]" in manifest) == (kind != "pair")  # the fixed batch of 1 cannot batch
    with served(dest) as url:
        capsys.readouterr()
        assert main(["invoke", url, "--file", str(dest / "samples" / "request.json")]) == 0
        answer = json.loads(capsys.readouterr().out)
    assert {name: np.shape(value) for name, value in answer.items()} == outputs
    if kind == "classifier":
        assert sum(answer["probabilities"][0]) == pytest.approx(1.0, abs=1e-2)  # the softmax


def test_the_padding_hint_for_an_exported_name_is_valid_toml(tmp_path: Path) -> None:
    """init's hint for `input.1` read `# [model.inputs.input.1]`: uncommented, the build said
    "field `model.inputs.input.1`: unknown key (found {'pad_axis': 1})" (a table `input`
    holding `1`), and for `serving/x:0` the TOML did not parse. The names are quoted."""
    model = exported_names_model(tmp_path / "mine" / "exported.onnx", width="L")
    dest = tmp_path / "fn"
    assert main(["init", str(dest), "--model", str(model)]) == 0
    manifest = dest / "function.toml"
    hinted = re.sub(r"^# (\[model\.\w+\..*\]|pad_axis = 1|pad_value = 0|follows = .*)$", r"\1",
                    manifest.read_text(), flags=re.MULTILINE)  # fmt: skip
    assert '[model.inputs."input.1"]' in hinted and '[model.inputs."serving/x:0"]' in hinted
    manifest.write_text(hinted)
    bundle = build(dest, tmp_path / "out")
    assert [spec.pad_axis for spec in bundle.signature.inputs] == [1, 1]
    assert [spec.follows for spec in bundle.signature.outputs] == ["input.1", "input.1"]


def test_the_padding_hint_has_an_output_of_the_same_named_length_follow_the_input(
    tmp_path: Path,
) -> None:
    """A text model's per-token output `hidden` [batch, sequence, 8] is as long as its inputs
    [batch, sequence]: init hinted padding for the inputs alone, and with the hint taken, serve
    warned that `hidden`'s axis 1 follows no input, so padding stayed off. The hint now has it
    follow the first padded input; `pooled` has no such axis."""
    model = bert_like_model(tmp_path / "mine" / "bert.onnx")
    dest = tmp_path / "fn"
    assert main(["init", str(dest), "--model", str(model)]) == 0
    manifest = dest / "function.toml"
    taken = r"^# (\[model\.\w+\..*\]|pad_axis = \d|pad_value = 0|follows = .*)$"
    manifest.write_text(re.sub(taken, r"\1", manifest.read_text(), flags=re.MULTILINE))
    bundle = build(dest, tmp_path / "out")
    assert {spec.name: spec.pad_axis for spec in bundle.signature.inputs} == dict.fromkeys(
        ("input_ids", "token_type_ids", "attention_mask"), 1
    )
    outputs = {spec.name: (spec.pad_axis, spec.follows) for spec in bundle.signature.outputs}
    assert outputs == {"hidden": (1, "input_ids"), "pooled": (None, None)}


def test_init_names_the_output_that_turns_batching_off(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A batched input and a rank-0 output: the manifest said "No batching: the model's first
    dims are fixed ()", naming nothing (only inputs were listed). init says it too, with the
    export that batches (it was a comment in function.toml alone)."""
    dest = tmp_path / "fn"
    assert main(["init", str(dest), "--model", str(total_model(tmp_path / "total.onnx"))]) == 0
    manifest = " ".join((dest / "function.toml").read_text().split())
    assert (
        "# No batching: the model has no batch axis (total []: no dynamic first dim), so every"
        in manifest
    )
    assert "[batching]" not in manifest
    said = " ".join(capsys.readouterr().err.split())
    assert said.startswith(
        "warning: batching off: no batch axis (total []: no dynamic first dim), so every request "
        "runs alone. Hint: export the model with a dynamic batch axis to batch (PyTorch: "
        "torch.onnx.export(..., dynamic_axes={"
    )


NOT_A_BATCH = {
    "nonzero": (nonzero_model, "outputs {'y': [", "batches cannot be split back into requests"),
    "centered": (centered_model, "output `centered` of row 0 alone differs from its row in a",
                 "the rows of a batch compute together"),
}  # fmt: skip


@pytest.mark.parametrize("kind", list(NOT_A_BATCH))
def test_init_turns_batching_off_where_a_run_shows_the_first_axis_is_no_batch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    """Every first dim dynamic, but no batch axis (NonZero's [K, 2]; points centered on their
    mean): init wrote max_batch_size = 32 and build refused it ("Hint: ... max_batch_size =
    0"), so the newcomer had to edit function.toml. init now runs build's batch-axis check,
    writes batching off and says what the run showed; build and serve take it as written."""
    builder, shown, why = NOT_A_BATCH[kind]
    dest = tmp_path / "fn"
    assert main(["init", str(dest), "--model", str(builder(tmp_path / f"{kind}.onnx"))]) == 0
    text = (dest / "function.toml").read_text()
    said = " ".join(line.removeprefix("# ") for line in text.splitlines() if line.startswith("#"))
    assert shown in said and why in said and "rows are independent" in said
    assert "[batching]\nmax_batch_size = 0\n" in text and "pad_axis" not in text
    assert main(["build", str(dest), "--out", str(tmp_path / "out")]) == 0
    with served(dest) as url:
        capsys.readouterr()
        assert main(["invoke", url, "--file", str(dest / "samples" / "request.json")]) == 0
        assert json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("backend", ["openvino", "onnxruntime"])
def test_an_output_the_model_gives_no_shape_batches_and_its_dims_read_unknown(
    tmp_path: Path, backend: str
) -> None:
    """An output the model declares no shape for (a Loop's, a custom op's) was taken as rank 0:
    metadata said shape [], init turned batching off ("y []") and so did build. Its dims now
    read unknown, -1 as Triton's config gives them, the shape comes from the run, and requests
    batch, split back along axis 0 (build's batch-axis check saw the rows there)."""
    dest = tmp_path / "fn"
    assert main(["init", str(dest), "--model", str(shapeless_model(tmp_path / "sl.onnx"))]) == 0
    manifest = dest / "function.toml"
    text = manifest.read_text()
    assert "#   output  y  FP32 [-1, -1] (no shape in the model)" in text
    text = text.replace(
        "max_queue_delay_ms = 2.0", "preferred_batch_sizes = [3]\nmax_queue_delay_ms = 3000"
    )
    manifest.write_text(text + f'\n[backend]\nprefer = ["{backend}"]\n')
    rows = [np.arange(6, dtype=np.float32)[None], np.arange(12, dtype=np.float32).reshape(2, 6)]

    async def send(url: str) -> list[dict]:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            sent = [client.post("/invoke", json={"x": x.tolist()}) for x in rows]
            return [response.json() for response in await asyncio.gather(*sent)]

    with running(dest, "--workers", "1") as (url, _):
        answers = asyncio.run(send(url))
        metadata = httpx.get(f"{url}/v2/models/fn").json()
        config = httpx.get(f"{url}/v2/models/fn/config").json()
        stats = httpx.get(f"{url}/v2/models/fn/stats").json()["model_stats"][0]
    assert [np.shape(answer["y"]) for answer in answers] == [(1, 2, 3), (2, 2, 3)]
    assert answers[1]["y"] == rows[1].reshape(2, 2, 3).tolist()
    assert metadata["outputs"] == [{"name": "y", "datatype": "FP32", "shape": [-1, -1]}]
    assert (config["max_batch_size"], config["output"][0]["dims"]) == (32, [-1])
    assert (stats["execution_count"], stats["inference_count"]) == (1, 3)  # one batch of 3


def test_init_refuses_a_folder_with_more_than_a_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sequence_model(tmp_path / "fn" / "a.onnx")
    (tmp_path / "fn" / "notes.txt").write_text("mine")
    assert main(["init", str(tmp_path / "fn")]) == 2
    error = " ".join(capsys.readouterr().err.split())
    assert (
        f"{tmp_path / 'fn'}: already exists and holds ['a.onnx', 'notes.txt']; expected a new"
        in error
    )
    assert "`edgeserve init NEW --model path/to/model.onnx`" in error
    assert (tmp_path / "fn" / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("location", ["pair.weights", "weights/pair.bin"])
@pytest.mark.parametrize("how", ["--model", "in the folder"])
def test_init_takes_a_models_external_weights_along(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], how: str, location: str
) -> None:
    """A model keeping its weights in a side file: `init --model` copied the model alone (the
    build then said the weights were missing), and a folder holding both was refused; so was
    a folder holding the model and its weights in a subfolder ("already exists and holds
    ['pair.onnx', 'weights']; expected ... one holding only a model")."""
    home = tmp_path / ("mine" if how == "--model" else "fn")
    model = pair_model(home / "pair.onnx")
    (home / location).parent.mkdir(parents=True, exist_ok=True)
    onnx.save(onnx.load(str(model)), str(model), save_as_external_data=True,
              location=location, size_threshold=0)  # fmt: skip
    dest = tmp_path / "fn"
    argv = ["init", str(dest), *(["--model", str(model)] if how == "--model" else [])]
    assert main(argv) == 0, capsys.readouterr().err
    assert (dest / location).read_bytes() == (home / location).read_bytes()
    bundle = build(dest, tmp_path / "out")
    assert f"model/{location}" in bundle.metadata["files"]


def test_init_refuses_a_folder_holding_more_than_a_model_and_its_weights(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = pair_model(tmp_path / "fn" / "pair.onnx")
    (tmp_path / "fn" / "weights").mkdir()
    onnx.save(onnx.load(str(model)), str(model), save_as_external_data=True,
              location="weights/pair.bin", size_threshold=0)  # fmt: skip
    (tmp_path / "fn" / "weights" / "notes.txt").write_text("mine")
    assert main(["init", str(tmp_path / "fn")]) == 2
    error = " ".join(capsys.readouterr().err.split())
    assert "already exists and holds ['pair.onnx', 'weights']; expected a new" in error


@pytest.mark.parametrize("how", ["--model", "in the folder"])
def test_init_says_a_file_that_is_not_onnx_is_not_a_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], how: str
) -> None:
    """It crashed with protobuf's DecodeError and a traceback; now the line `build` gives."""
    home = tmp_path / ("mine" if how == "--model" else "fn")
    home.mkdir()
    (home / "bad.onnx").write_bytes(b"this is not an ONNX model\n" * 4)
    dest = tmp_path / "fn"
    argv = ["init", str(dest), *(["--model", str(home / "bad.onnx")] if how == "--model" else [])]
    assert main(argv) == 2
    error = " ".join(capsys.readouterr().err.split())
    assert error.startswith(f"error: {home / 'bad.onnx'}: not a readable ONNX model: "), error
    assert not (dest / "function.toml").exists()


@pytest.mark.parametrize(
    ("kind", "said"),
    [
        ("zip", "It is a zip file (as torch.save writes a PyTorch checkpoint): export the model "
         "to ONNX first (torch.onnx.export(model, example_inputs, 'model.onnx'))"),
        ("pickle", "It is a Python pickle (an older PyTorch checkpoint, or a scikit-learn model): "
         "export the model to ONNX first (torch.onnx.export, or skl2onnx for scikit-learn)"),
    ],
)  # fmt: skip
def test_init_says_what_a_checkpoint_of_another_framework_is_and_how_to_export_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str, said: str
) -> None:
    """A newcomer's weights.pt read only "Wire format was corrupt"."""
    weights = tmp_path / "weights.pt"
    if kind == "zip":  # torch.save's format since PyTorch 1.6
        with zipfile.ZipFile(weights, "w") as archive:
            archive.writestr("archive/data.pkl", pickle.dumps({"w": [0.0] * 4}))
    else:
        weights.write_bytes(pickle.dumps({"w": [0.0] * 4}, protocol=2))
    assert main(["init", str(tmp_path / "fn"), "--model", str(weights)]) == 2
    error = " ".join(capsys.readouterr().err.split())
    assert error.startswith(f"error: {weights}: not a readable ONNX model: "), error
    assert error.endswith(said), error


def test_init_samples_keep_ids_in_their_tables_and_masks_at_one(tmp_path: Path) -> None:
    """The sample's ids are what the server accepts (within each input's table) and its
    attention mask attends every token (it was 0..15)."""
    dest = init_function(tmp_path / "fn", model=bert_like_model(tmp_path / "bert.onnx"))
    sample = json.loads((dest / "samples" / "request.json").read_text())
    assert set(np.ravel(sample["token_type_ids"])) == {0, 1}
    assert min(np.ravel(sample["input_ids"])) >= 0 and max(np.ravel(sample["input_ids"])) < 100
    assert set(np.ravel(sample["attention_mask"])) == {1}


def test_init_says_a_zipmap_output_is_not_a_tensor_and_how_to_export_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """skl2onnx's default classifier output, a sequence of maps, read as "ONNX element type 0
    has no KServe v2 datatype": neither the cause nor the fix."""
    model = zipmap_model(tmp_path / "mine" / "clf.onnx")
    assert main(["init", str(tmp_path / "fn"), "--model", str(model)]) == 2
    error = " ".join(capsys.readouterr().err.split())
    assert error == (
        f"error: {model}: output `output_probability` is a sequence of maps (skl2onnx's "
        "ZipMap), not a tensor; KServe v2 serves tensors only. Hint: export it as a tensor; "
        "for skl2onnx classifiers, to_onnx(model, X, options={'zipmap': False})"
    )
