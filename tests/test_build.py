"""build(): plan then write, the bundle layout, edgeserve.json, determinism, and build errors."""

from __future__ import annotations

import functools
import hashlib
import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata
from pathlib import Path

import httpx
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgeserve.backends.openvino import IR_PATH
from edgeserve.builder import build, open_or_build, plan_build
from edgeserve.bundle import Bundle, content_hash
from edgeserve.cli import main
from edgeserve.errors import BackendError, ConfigError
from edgeserve.http import create_app
from edgeserve.runtime import Runtime
from edgeserve.scaffold import init_function
from tests.models import (
    bert_like_model,
    centered_model,
    conv_model,
    identity_model,
    mlp_model,
    nonzero_model,
    sequence_model,
    shapeless_model,
    varlen_model,
    write_function,
)
from tests.server import served
from tests.threaded_server import serving

TARGETS = ("local", "aws-lambda", "jetson")


@pytest.fixture(autouse=True)
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("EDGESERVE_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def source(tmp_path: Path) -> Path:
    return init_function(tmp_path / "hello")


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_building_twice_gives_the_same_hash_bytes_and_archives(
    source: Path, tmp_path: Path
) -> None:
    first = build(source, tmp_path / "a" / "hello", targets=TARGETS, archive=True)
    second = build(source, tmp_path / "b" / "hello", targets=TARGETS, archive=True)

    assert first.content_hash == second.content_hash
    assert tree(first.root) == tree(second.root)  # the OpenVINO IR included
    archives = sorted(p.name for p in (tmp_path / "a" / "dist").iterdir())
    assert archives == [
        "hello-1-aws-lambda.tar.gz",
        "hello-1-jetson.tar.gz",
        "hello-1-local.tar.gz",
    ]
    for name in archives:
        assert (tmp_path / "a" / "dist" / name).read_bytes() == (
            tmp_path / "b" / "dist" / name
        ).read_bytes()


def test_ir_export_of_a_conv_model_is_deterministic(tmp_path: Path) -> None:
    folder = write_function(tmp_path / "conv", conv_model, '[function]\nname = "conv"\n')
    first = build(folder, tmp_path / "a" / "conv")
    second = build(folder, tmp_path / "b" / "conv")

    ir, again = first.file(IR_PATH), second.file(IR_PATH)
    assert ir is not None and again is not None
    assert ir.read_bytes() == again.read_bytes()
    assert first.content_hash == second.content_hash


def test_the_bundle_holds_the_layout_and_edgeserve_json_records_it(
    source: Path, tmp_path: Path
) -> None:
    (source / "samples" / ".DS_Store").write_bytes(b"litter")
    bundle = build(source, tmp_path / "out" / "hello", targets=TARGETS)
    meta = json.loads((bundle.root / "edgeserve.json").read_text())

    expected_files = [
        "function.toml",
        "handler/handler.py",
        "model/model.bin",
        "model/model.onnx",
        "model/model.xml",
        "requirements/aws-lambda.txt",
        "requirements/jetson.txt",
        "requirements/local.txt",
        "samples/request.json",
    ]
    assert sorted(meta["files"]) == expected_files
    assert {name: sha256(bundle.root / name) for name in expected_files} == meta["files"]
    assert meta["content_hash"] == content_hash(meta) == bundle.content_hash
    assert meta["format"] == 1
    assert meta["edgeserve_version"] == metadata.version("edgeserve")
    assert meta["manifest"]["function"]["name"] == "hello"
    assert meta["manifest"]["model"]["path"] == "model/model.onnx"
    assert meta["signature"] == {
        "batched": True,
        "inputs": [
            {
                "name": "x",
                "datatype": "FP32",
                "dims": [-1, 16],
                "pad_axis": None,
                "pad_value": 0.0,
                "follows": None,
                "ratio": 1.0,
                "index_range": None,
                "index_table": None,
                "min_dims": None,
                "max_dims": None,
                "labels": [],
                "ranked": True,
                "optional": False,
            }
        ],
        "outputs": [
            {
                "name": "y",
                "datatype": "FP32",
                "dims": [-1, 4],
                "pad_axis": None,
                "pad_value": 0.0,
                "follows": None,
                "ratio": 1.0,
                "index_range": None,
                "index_table": None,
                "min_dims": None,
                "max_dims": None,
                "labels": [],
                "ranked": True,
                "optional": False,
            }
        ],
        "tied": [],
        "summed": [],
    }
    assert meta["targets"] == {
        "local": {"platform": "cpu", "backends": ["openvino", "onnxruntime"]},
        "aws-lambda": {"platform": "lambda", "backends": ["onnxruntime"]},
        "jetson": {"platform": "jetson", "backends": ["tensorrt", "onnxruntime"]},
    }
    assert (bundle.root / "function.toml").read_bytes() == (source / "function.toml").read_bytes()
    assert (bundle.root / "model" / "model.onnx").read_bytes() == (
        source / "model.onnx"
    ).read_bytes()


def test_requirements_are_pinned_per_target_with_the_handler_ones_last(tmp_path: Path) -> None:
    manifest = """
[function]
name = "m"
[handler]
module = "handler"
requirements = ["pillow>=10", "regex"]
"""
    folder = write_function(tmp_path / "m", mlp_model, manifest, handler="")
    bundle = build(folder, tmp_path / "out" / "m", targets=TARGETS)

    def pinned(package: str) -> str:
        return f"{package}=={metadata.version(package)}"

    common = [
        "msgpack",
        "numpy",
        "onnxruntime",
        "orjson",
        "prometheus-client",
        "pydantic",
        "starlette",
    ]
    server = ["uvicorn", "uvloop", "httptools"]
    local = sorted(map(pinned, [*common, "openvino", *server]))
    assert bundle.requirements("local") == [*local, "pillow>=10", "regex"]
    assert bundle.requirements("aws-lambda")[:-2] == sorted(map(pinned, [*common, "mangum"]))
    assert bundle.requirements("jetson")[:-2] == sorted(map(pinned, [*common, *server]))


def test_a_function_serving_grpc_pins_grpcio_where_a_server_runs_not_on_lambda(
    tmp_path: Path,
) -> None:
    """Lambda is reached by events (API Gateway, Function URLs), never by gRPC: the function
    builds for it with the grpc_port unused, and no grpcio in its zip."""
    manifest = '[function]\nname = "m"\n[resources]\ngrpc_port = 8001\n'
    folder = write_function(tmp_path / "m", mlp_model, manifest)
    bundle = build(folder, tmp_path / "out" / "m", targets=TARGETS)
    grpcio = f"grpcio=={metadata.version('grpcio')}"
    assert grpcio in bundle.requirements("local")
    assert grpcio in bundle.requirements("jetson")
    assert not any("grpc" in line for line in bundle.requirements("aws-lambda"))


def test_a_backend_override_plans_only_that_backend_and_skips_the_ir(
    source: Path, tmp_path: Path
) -> None:
    bundle = build(source, tmp_path / "out" / "hello", targets=TARGETS, backend="onnxruntime")

    assert {target: bundle.backends(target) for target in TARGETS} == dict.fromkeys(
        TARGETS, ("onnxruntime",)
    )
    assert bundle.file(IR_PATH) is None
    assert not (bundle.root / "model" / "model.xml").exists()
    assert "openvino" not in " ".join(bundle.requirements("local"))


@pytest.mark.parametrize(
    ("targets", "backend", "message"),
    [
        (
            ("jetson",),
            "openvino",
            "the backend override: ['openvino'] has no backend that runs on target 'jetson'",
        ),
        (  # the hint a newcomer on a laptop needed, with prefer = ["tensorrt"]
            ("local",),
            "tensorrt",
            "on target 'local' .platform cpu: ['openvino', 'onnxruntime'].. Hint: force one of "
            "them, or build for a target whose platform runs ['tensorrt']",
        ),
        (("local",), "tensorflow", "backend 'tensorflow': unknown"),
        (("mars",), None, "target 'mars': no mars.toml"),
    ],
)
def test_targets_and_backends_that_do_not_fit_are_refused(
    source: Path, targets: tuple[str, ...], backend: str | None, message: str
) -> None:
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        plan_build(source, targets=targets, backend=backend)


def test_a_manifest_preferring_no_backend_of_the_target_names_the_field(tmp_path: Path) -> None:
    folder = write_function(
        tmp_path / "g", mlp_model, '[function]\nname = "g"\n[backend]\nprefer = ["tensorrt"]\n'
    )

    with pytest.raises(ConfigError) as caught:
        plan_build(folder, targets=("local",))
    assert f"{folder / 'function.toml'}: field `backend.prefer`" in caught.value.message


def test_a_missing_handler_module_names_the_manifest_field(tmp_path: Path) -> None:
    folder = write_function(
        tmp_path / "h", mlp_model, '[function]\nname = "h"\n[handler]\nmodule = "pre"\n'
    )

    with pytest.raises(ConfigError) as caught:
        build(folder, tmp_path / "out" / "h")
    assert f"{folder / 'function.toml'}: field `handler.module`" in caught.value.message
    assert str(folder / "pre.py") in caught.value.message
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("manifest", "field", "detail"),
    [
        ('[function]\nname = "x"\nnmae = "y"\n', "function.nmae", "unknown key"),
        (
            '[function]\nname = "x"\n[batching]\nmax_batch_size = "big"\n',
            "batching.max_batch_size",
            "integer",
        ),
        (
            '[function]\nname = "x"\n[batching]\nmax_batch_size = 8\n'
            "preferred_batch_sizes = [4, 16]\n",
            "batching",
            "preferred_batch_sizes [4, 16] must lie in 1..max_batch_size (8)",
        ),
        (  # it built, then every request waited for company until its deadline
            '[function]\nname = "x"\n[batching]\nmax_queue_delay_ms = inf\n',
            "batching.max_queue_delay_ms",
            "finite number",
        ),
        (
            '[function]\nname = "x"\n[resources]\nbody_timeout_s = inf\n',
            "resources.body_timeout_s",
            "finite number",
        ),
        (  # it built, then serving refused it
            '[function]\nname = "x"\n[model.inputs.x]\ndims = [-2, 16]\n',
            "model.inputs.x.dims",
            "expected dims that fit the model's [-1, 16]",
        ),
    ],
)
def test_manifest_errors_name_the_file_and_the_field(
    tmp_path: Path, manifest: str, field: str, detail: str
) -> None:
    folder = write_function(tmp_path / "x", mlp_model, manifest)

    with pytest.raises(ConfigError) as caught:
        build(folder, tmp_path / "out" / "x")
    assert f"{folder / 'function.toml'}: field `{field}`" in caught.value.message
    assert detail in caught.value.message


def test_a_model_with_a_fixed_batch_dim_is_recorded_unbatched(tmp_path: Path) -> None:
    folder = write_function(
        tmp_path / "fixed", lambda path: mlp_model(path, batch=1), '[function]\nname = "fixed"\n'
    )
    bundle = build(folder, tmp_path / "out" / "fixed")

    assert bundle.signature.batched is False
    assert bundle.signature.inputs[0].dims == (1, 16)
    assert json.loads((bundle.root / "edgeserve.json").read_text())["signature"]["batched"] is False
    assert Bundle.open(bundle.root).signature == bundle.signature


@pytest.mark.parametrize(
    "written", ["", "max_batch_size = 0\n", "max_batch_size = 8\n"], ids=["left out", "0", "8"]
)
def test_a_max_batch_size_for_a_model_that_cannot_batch_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], written: str
) -> None:
    """Triton refuses max_batch_size > 0 for a model without a dynamic first dim; edgeserve
    built it, said only "batching off", and served every request alone."""
    manifest = f'[function]\nname = "fixed"\n[batching]\n{written}'
    folder = write_function(tmp_path / "fixed", lambda path: mlp_model(path, batch=1), manifest)
    code = main(["build", str(folder), "--out", str(tmp_path / "out")])
    captured = capsys.readouterr()
    if written != "max_batch_size = 8\n":  # left out, or 0: built, batching off, no error
        assert code == 0 and captured.err == ""
        assert (
            "batching off: no batch axis (x [1, 16], y [1, 4]: no dynamic first dim), so every"
            in captured.out
        )
        return
    assert code == 2 and not (tmp_path / "out").exists()
    assert " ".join(captured.err.split()) == (
        f"error: {folder / 'function.toml'}: field `batching.max_batch_size`: found 8, but the "
        "model cannot batch (x [1, 16], y [1, 4]: no dynamic first dim); expected 0. Hint: set "
        "[batching] max_batch_size = 0 (every request runs alone), or export the model with a "
        "dynamic first dim to batch"
    )


def test_a_pad_axis_from_the_manifest_is_recorded(tmp_path: Path) -> None:
    manifest = '[function]\nname = "v"\n[model.inputs.x]\npad_axis = 1\npad_value = -1.0\n'
    bundle = build(write_function(tmp_path / "v", varlen_model, manifest), tmp_path / "out" / "v")

    spec = bundle.signature.input("x")
    assert spec is not None
    assert (spec.pad_axis, spec.pad_value, spec.dims) == (1, -1.0, (-1, -1))
    assert Bundle.open(bundle.root).signature.input("x") == spec


def test_a_failed_build_leaves_the_previous_bundle_and_no_scratch(
    source: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out" / "hello"
    before = build(source, out)
    (source / "model.onnx").write_bytes(b"not onnx")

    with pytest.raises(ConfigError, match="not a readable ONNX model"):
        build(source, out)
    assert Bundle.open(out).content_hash == before.content_hash
    assert sorted(p.name for p in out.parent.iterdir()) == ["hello"]


def mixed_types_model(path: Path) -> Path:
    """Valid protobuf, readable signature, but float32 @ float64: OpenVINO refuses to convert it."""
    weight = numpy_helper.from_array(np.ones((3, 2)), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "mixed",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2])],
        [weight],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.save(model, str(path))
    return path


def test_a_failed_ir_export_leaves_no_half_bundle(tmp_path: Path) -> None:
    """OpenVINO alone planned (with another backend, build plans past its refusal)."""
    manifest = (  # fp32: no precision check
        '[function]\nname = "f"\n[backend]\nprefer = ["openvino"]\nprecision = "fp32"\n'
    )
    folder = write_function(tmp_path / "f", mixed_types_model, manifest)

    with pytest.raises(BackendError, match="cannot convert"):
        build(folder, tmp_path / "out" / "f")
    assert list((tmp_path / "out").iterdir()) == []


def test_rebuilding_replaces_a_bundle_but_never_a_foreign_folder(
    source: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out" / "hello"
    build(source, out)
    (source / "samples" / "second.json").write_text(json.dumps({"x": [1.0] * 16}))
    assert "samples/second.json" in build(source, out).metadata["files"]

    foreign = tmp_path / "project"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    with pytest.raises(ConfigError, match="not a bundle; refusing to replace it"):
        build(source, foreign)
    with pytest.raises(ConfigError, match="not a bundle; refusing to replace it"):
        build(source, foreign / "notes.txt")
    assert (foreign / "notes.txt").read_text() == "keep me"


def test_building_over_an_earlier_build_says_it_replaced_it(
    source: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """`edgeserve build --out` into a folder holding an earlier build replaced it in silence,
    though what was tested or deployed from there changed under it; it now says so, naming
    the earlier build's hash. A first build says nothing of it."""
    out = tmp_path / "out" / "hello"
    assert main(["build", str(source), "--out", str(out)]) == 0
    first, earlier = capfd.readouterr().out, Bundle.open(out).content_hash
    (source / "samples" / "second.json").write_text(json.dumps({"x": [1.0] * 16}))
    assert main(["build", str(source), "--out", str(out)]) == 0
    second = capfd.readouterr().out
    assert "replaced" not in first
    assert f"replaced the earlier build in {out} (hash {earlier[:12]})\n" in second
    assert Bundle.open(out).content_hash != earlier
    assert main(["build", str(source), "--out", str(out)]) == 0  # nothing changed since
    same, third = Bundle.open(out).content_hash, capfd.readouterr().out
    assert f"rebuilt {out}: the same bundle as before (hash {same[:12]})\n" in third


def test_each_archive_holds_only_what_its_target_needs(source: Path, tmp_path: Path) -> None:
    build(source, tmp_path / "out" / "hello", targets=TARGETS, archive=True)
    jetson_only = build(source, tmp_path / "alone" / "hello", targets=("jetson",))

    opened = Bundle.open(tmp_path / "out" / "dist" / "hello-1-jetson.tar.gz")
    assert opened.targets == ("jetson",)
    assert opened.file(IR_PATH) is None
    assert sorted(opened.metadata["files"]) == sorted(jetson_only.metadata["files"])
    assert opened.content_hash == jetson_only.content_hash


def test_open_or_build_builds_a_source_once_into_the_cache(source: Path, cache_dir: Path) -> None:
    first = open_or_build(source)
    again = open_or_build(source)
    (source / "samples" / "another.json").write_text(json.dumps({"x": [0.5] * 16}))
    edited = open_or_build(source)  # an edit, whose sample the handler's dry run accepts

    assert first.root.parent == cache_dir / "bundles"
    assert first.root.name.startswith("hello-")
    assert again.root == first.root
    assert edited.root != first.root
    assert "samples/another.json" in edited.metadata["files"]
    assert open_or_build(first.root).root == first.root  # a bundle opens as it is


def test_a_target_profile_is_planned_by_its_driver(source: Path, tmp_path: Path) -> None:
    (source / "prod.toml").write_text('driver = "aws-lambda"\n')
    bundle = build(source, tmp_path / "out" / "hello", targets=("prod",))

    assert bundle.targets == ("prod",)
    assert bundle.backends("prod") == ("onnxruntime",)
    assert any(line.startswith("mangum==") for line in bundle.requirements("prod"))
    assert not any(line.startswith("uvicorn") for line in bundle.requirements("prod"))


def test_external_weights_travel_beside_the_model(tmp_path: Path) -> None:
    folder = write_function(tmp_path / "ext", mlp_model, '[function]\nname = "ext"\n')
    model = onnx.load(str(folder / "model.onnx"))
    onnx.save(
        model,
        str(folder / "model.onnx"),
        save_as_external_data=True,
        location="weights.bin",
        size_threshold=0,
    )
    bundle = build(folder, tmp_path / "out" / "ext")

    assert "model/weights.bin" in bundle.metadata["files"]
    x = np.ones((2, 16), np.float32)
    session = ort.InferenceSession(str(bundle.model_path), providers=["CPUExecutionProvider"])
    reference = ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(session.run(None, {"x": x})[0], reference.run(None, {"x": x})[0])
    (folder / "weights.bin").unlink()
    with pytest.raises(ConfigError, match=r"external data file .*weights.bin is missing"):
        build(folder, tmp_path / "out" / "ext")


def _build_error(folder: Path, capsys: pytest.CaptureFixture[str]) -> str:
    """What `edgeserve build FOLDER` tells the user, on one line (exit code 2: a config error)."""
    assert main(["build", str(folder), "--out", str(folder.parent / "out")]) == 2
    return " ".join(capsys.readouterr().err.split())


@pytest.mark.parametrize(
    ("builder", "manifest", "expected"),
    [
        (
            mlp_model,
            '[model]\npath = "modle.onnx"',
            "function.toml: field `model.path`: found 'modle.onnx', but {dir}/modle.onnx does not "
            "exist; expected the ONNX model's path in the function folder; did you mean "
            "`model.onnx`?",
        ),
        (
            mlp_model,
            '[model]\npath = "."',
            "function.toml: field `model.path`: found '.', but {dir} is a folder, not a file; "
            "expected the ONNX model's path in the function folder; the folder holds "
            "['model.onnx']",
        ),
        (
            sequence_model,
            "[model.inputs.token]\npad_axis = 1",
            "function.toml: [model.inputs.token]: the model has no input `token`; expected one "
            "of ['tokens']; did you mean `tokens`?",
        ),
        (
            sequence_model,
            "[model.inputs.tokens]\npad_axis = 2",
            "function.toml: field `model.inputs.tokens.pad_axis`: found 2, expected an axis in "
            "1..1 of the dims [-1, -1] (axis 0 is the batch)",
        ),
        (  # built without a word, and padded nothing: a newcomer's classifier [N, 3, H, W]
            mlp_model,
            "[model.inputs.x]\npad_axis = 1",
            "function.toml: field `model.inputs.x.pad_axis`: found 1, but that axis is fixed at "
            "16 in the model (dims [-1, 16]), so no request is shorter: nothing to pad; expected "
            "a dynamic axis (-1), and there is none: remove it",
        ),
        (
            sequence_model,
            "[model.inputs.tokens]\npad_axs = 1",
            "function.toml: field `model.inputs.tokens.pad_axs`: unknown key (found 1); did you "
            "mean `pad_axis`?",
        ),
        (
            mlp_model,
            "[batching]\nmax_batch = 8",
            "function.toml: field `batching.max_batch`: unknown key (found 8); did you mean "
            "`max_batch_size`?",
        ),
        (
            mlp_model,
            "[batching]\ncolour = 8",
            "function.toml: field `batching.colour`: unknown key (found 8); expected one "
            "of ['max_batch_size', 'preferred_batch_sizes', 'max_queue_delay_ms', ",
        ),
        (
            sequence_model,
            "[model.inputs.tokens]\ndims = [-1, 8, 2]",
            "function.toml: field `model.inputs.tokens.dims`: found [-1, 8, 2], expected dims "
            "that fit the model's [-1, -1]",
        ),
    ],
    ids=[
        "model file",
        "model folder",
        "tensor name",
        "pad axis",
        "fixed pad axis",
        "tensor key",
        "near miss",
        "far miss",
        "dims",
    ],
)
def test_manifest_errors_name_the_file_the_field_and_the_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], builder, manifest: str, expected: str
) -> None:
    folder = write_function(tmp_path / "fn", builder, f'[function]\nname = "fn"\n{manifest}\n')
    message = _build_error(folder, capsys)
    assert message.startswith(f"error: {folder}/function.toml: ")
    assert expected.format(dir=folder) in message


def test_an_empty_model_file_is_refused_at_the_build(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """It read as a model of nothing (OpenVINO's frontends then listed themselves)."""
    folder = write_function(
        tmp_path / "fn", lambda path: path.write_bytes(b"") or path, '[function]\nname = "fn"\n'
    )
    message = _build_error(folder, capsys)
    assert "model.onnx: the model has no outputs (an empty or truncated file?)" in message


def test_a_folder_with_only_a_model_points_at_init(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mlp_model(tmp_path / "fn" / "classifier.onnx")
    message = _build_error(tmp_path / "fn", capsys)
    assert f"Hint: `edgeserve init {tmp_path / 'fn'}` writes one for classifier.onnx." in message


WITHOUT_OPENVINO = """
import sys
sys.modules["openvino"] = None  # import openvino now fails, as on a machine without it
from edgeserve.cli import main
sys.exit(main(["build", sys.argv[1], "--out", sys.argv[2]]))
"""


def test_a_machine_without_openvino_is_told_so_or_builds_for_onnxruntime_alone(
    tmp_path: Path,
) -> None:
    """openvino is a dependency, so its absence is simulated (sys.modules, in the child only):
    the build names what is missing and how to do without, and does without when told."""
    import subprocess
    import sys

    folder = write_function(tmp_path / "f", mlp_model, '[function]\nname = "f"\n')
    run = [sys.executable, "-c", WITHOUT_OPENVINO, str(folder), str(tmp_path / "out")]
    failed = subprocess.run(run, capture_output=True, text=True, timeout=120)
    assert failed.returncode == BackendError.exit_code, failed.stderr
    assert "openvino package is not installed" in failed.stderr
    assert 'prefer = ["onnxruntime"]' in failed.stderr and "Traceback" not in failed.stderr
    manifest = folder / "function.toml"
    manifest.write_text(manifest.read_text() + '[backend]\nprefer = ["onnxruntime"]\n')
    built = subprocess.run(run, capture_output=True, text=True, timeout=120)
    assert built.returncode == 0, built.stderr
    assert not (tmp_path / "out" / IR_PATH).exists()


@pytest.mark.parametrize(
    ("datatype", "planned"),
    [("FP32", ["openvino", "onnxruntime"]), ("BYTES", ["onnxruntime"]), ("FP64", ["onnxruntime"])],
)
def test_a_backend_that_would_not_serve_the_model_as_written_is_not_planned(
    tmp_path: Path, datatype: str, planned: list[str]
) -> None:
    """OpenVINO has no string tensors (its warm-up failed the server's start) and computes FP64
    in FP32 without a word: such a model is planned on ONNX Runtime alone, and build says why
    (it said nothing: a machine whose first choice was OpenVINO then served on the next)."""
    folder = write_function(
        tmp_path / "fn", lambda path: identity_model(path, (datatype,)), '[function]\nname = "fn"\n'
    )
    reported: list[str] = []
    bundle = build(folder, tmp_path / "out", report=lambda done: reported.append(done.describe()))
    meta = json.loads((bundle.root / "edgeserve.json").read_text())
    assert meta["targets"]["local"]["backends"] == planned
    passed_over = [line for line in reported if "not openvino" in line]
    if "openvino" in planned:
        assert passed_over == []
    else:  # the plan, not a warning: the reason never goes away
        assert passed_over == [
            f"plan: onnxruntime, not openvino: openvino has no {datatype} tensors (`in_{datatype}`)"
        ]


def test_a_manifest_that_leaves_only_a_declining_backend_says_why(tmp_path: Path) -> None:
    folder = write_function(
        tmp_path / "fn",
        lambda path: identity_model(path, ("BYTES",)),
        '[function]\nname = "fn"\n[backend]\nprefer = ["openvino"]\n',
    )
    with pytest.raises(ConfigError, match=r"openvino has no BYTES tensors \(`in_BYTES`\)"):
        build(folder, tmp_path / "out")


def test_outputs_without_the_batch_axis_first_are_refused_and_serve_unbatched(
    tmp_path: Path,
) -> None:
    """NonZero's [K, 2] looks batched (a dynamic first dim everywhere), and every request was a
    500 (its rows cannot be split back); the build says so, and with batching off it serves."""
    folder = write_function(tmp_path / "fn", nonzero_model, '[function]\nname = "nz"\n')
    with pytest.raises(ConfigError) as refused:
        build(folder, tmp_path / "out")
    assert "outputs {'y': [" in refused.value.message
    assert (
        "Hint: serve it one request a run, [batching] max_batch_size = 0" in refused.value.message
    )
    (folder / "function.toml").write_text(
        '[function]\nname = "nz"\n[batching]\nmax_batch_size = 0\n'
    )
    bundle = build(folder, tmp_path / "out")
    x = np.array([[1, 0, 2, 0], [0, 0, 3, 4]], np.float32)
    with serving(create_app(Runtime.load(bundle))) as url:
        tensor = {"name": "x", "datatype": "FP32", "shape": [2, 4], "data": x.ravel().tolist()}
        answer = httpx.post(f"{url}/v2/models/nz/infer", json={"inputs": [tensor]}, timeout=30)
    assert answer.status_code == 200, answer.text
    assert answer.json()["outputs"][0]["data"] == np.argwhere(x).ravel().tolist()


def test_an_output_of_no_declared_shape_that_loses_the_batch_axis_is_refused_batching(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An output the model gives no shape batches like the others unless a run shows its
    first axis is not the batch's (here flat: [N * 6]); the build says so and names it, and
    with batching off it serves, its dims unknown (-1) in the metadata."""
    model = functools.partial(shapeless_model, shape=(-1,))
    folder = write_function(tmp_path / "fn", model, '[function]\nname = "flat"\n')
    assert main(["build", str(folder), "--out", str(tmp_path / "out")]) == 2
    said = " ".join(capsys.readouterr().err.split())
    assert (
        "outputs {'y': [18]} (y: no shape declared in the model) for a batch of 3 rows: their "
        "first axis is not the batch axis"
    ) in said
    assert "Hint: serve it one request a run, [batching] max_batch_size = 0" in said
    (folder / "function.toml").write_text(
        '[function]\nname = "flat"\n[batching]\nmax_batch_size = 0\n'
    )
    with served(folder) as url:
        metadata = httpx.get(f"{url}/v2/models/flat", timeout=30).json()
        tensor = {"name": "x", "datatype": "FP32", "shape": [2, 6], "data": list(range(12))}
        answer = httpx.post(f"{url}/v2/models/flat/infer", json={"inputs": [tensor]}, timeout=30)
    assert metadata["outputs"] == [{"name": "y", "datatype": "FP32", "shape": [-1]}]
    assert answer.json()["outputs"][0]["shape"] == [12]


def test_a_model_whose_rows_compute_together_is_refused_batching(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """A point cloud [P, 3] centered on its mean looks batched (every first dim dynamic): init
    turned batching on, build passed it, and two requests stacked in one batch were centered
    on their joint mean, each answered wrong with a 200. Build now runs each row alone too and
    refuses batching asked for (init writes it off), and with it off every request gets its
    own answer."""
    model = centered_model(tmp_path / "centered.onnx")
    folder = tmp_path / "cloud"
    assert main(["init", str(folder), "--model", str(model)]) == 0
    manifest = folder / "function.toml"
    manifest.write_text(manifest.read_text().replace("max_batch_size = 0", "max_batch_size = 32"))
    assert main(["build", str(folder), "--out", str(tmp_path / "out")]) == 2
    error = " ".join(capfd.readouterr().err.split())
    assert "output `centered` of row 0 alone differs from its row in a batch of 3" in error
    assert "its first axis is not a batch axis: the rows of a batch compute together" in error
    assert "Hint: serve it one request a run, [batching] max_batch_size = 0" in error
    assert not (tmp_path / "out").exists()
    manifest.write_text(manifest.read_text().replace("max_batch_size = 32", "max_batch_size = 0"))
    assert main(["build", str(folder), "--out", str(tmp_path / "out")]) == 0
    clouds = [np.arange(6, dtype=np.float32).reshape(2, 3) * scale for scale in range(1, 9)]
    with served(tmp_path / "out") as url, ThreadPoolExecutor(8) as pool:
        answers = list(
            pool.map(
                lambda points: httpx.post(
                    f"{url}/invoke", json={"points": points.tolist()}, timeout=30
                ).json()["centered"],
                clouds,
            )
        )
    for points, answer in zip(clouds, answers, strict=True):
        np.testing.assert_allclose(answer, points - points.mean(axis=0), atol=1e-5)


def test_a_dynamically_quantized_model_still_batches(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """onnxruntime's quantize_dynamic quantizes activations with a scale taken over the whole
    batch, so a row alone moves a little from its row in a batch: that noise is not a model
    whose rows compute together, and the build keeps its batching."""
    from onnxruntime.quantization import quantize_dynamic

    fp32 = mlp_model(tmp_path / "fp32.onnx", n_in=64, hidden=128, n_out=10)
    quantize_dynamic(str(fp32), str(tmp_path / "int8.onnx"))
    folder = tmp_path / "int8"
    assert main(["init", str(folder), "--model", str(tmp_path / "int8.onnx")]) == 0
    assert main(["build", str(folder), "--out", str(tmp_path / "out")]) == 0, capfd.readouterr()
    assert Bundle.open(tmp_path / "out").manifest.batching.max_batch_size == 32


@pytest.mark.parametrize("emulate", [(), ("--emulate", "aws-lambda")])
def test_serving_a_source_folder_checks_it_as_build_does(
    tmp_path: Path, emulate: tuple[str, ...]
) -> None:
    """`edgeserve serve SOURCE` (and the Lambda emulator, and deploy) built the source into the
    cache without build's batch-axis check: the point cloud served, its batched requests
    answered wrong with a 200. It is refused as `edgeserve build` refuses it, before anything
    listens."""
    folder = write_function(tmp_path / "cloud", centered_model, '[function]\nname = "cloud"\n')
    command = [sys.executable, "-m", "edgeserve", "serve", str(folder), "--port", "0", *emulate]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2, done.stdout + done.stderr
    error = " ".join(done.stderr.split())
    assert "output `centered` of row 0 alone differs from its row in a batch of 3" in error
    assert "Hint: serve it one request a run, [batching] max_batch_size = 0" in error


def test_serving_a_source_imports_its_handler_once(tmp_path: Path) -> None:
    """The check before a cache entry must not import the handler: the serving process imports
    it to serve, and a handler registering a metric at import failed the second time
    ("Duplicated timeseries in CollectorRegistry")."""
    source = init_function(tmp_path / "metered")
    handler = source / "handler.py"
    handler.write_text(
        handler.read_text().replace(
            "from __future__ import annotations\n",
            "from __future__ import annotations\n\nimport prometheus_client\n\n"
            'CALLS = prometheus_client.Counter("metered_calls", "calls")\n',
            1,
        )
    )
    sample = json.loads((source / "samples" / "request.json").read_text())
    with served(source) as url:
        answer = httpx.post(f"{url}/invoke", json=sample, timeout=30)
    assert answer.status_code == 200, answer.text


def test_the_batch_axis_check_feeds_ids_within_the_tables_of_a_bert_like_model(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """Its random rows held ids up to 15 for a table of 2 rows (token_type_ids): ONNX Runtime
    printed a red ERROR during a build that then said "built", and the check was skipped in
    silence, so a model losing the batch axis built and failed every batched request."""
    fine = write_function(tmp_path / "fine", bert_like_model, '[function]\nname = "bert"\n')
    assert main(["build", str(fine), "--out", str(tmp_path / "fine-out")]) == 0
    printed = capfd.readouterr()
    assert "[E:onnxruntime" not in printed.err and "warning" not in printed.out + printed.err
    assert "built bert" in printed.out
    lossy = write_function(
        tmp_path / "lossy",
        lambda path: bert_like_model(path, over_batch=True),
        '[function]\nname = "bert"\n',
    )
    assert main(["build", str(lossy), "--out", str(tmp_path / "lossy-out")]) == 2
    error = " ".join(capfd.readouterr().err.split())
    assert "outputs {'pooled': [1, 8]} for a batch of 3 rows" in error
    assert not (tmp_path / "lossy-out").exists()


def test_a_batch_axis_check_that_cannot_run_says_so(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """Ids reaching a table of 4 rows through Abs, which the door cannot bound: the check's
    random ids (up to 15) fail in ONNX Runtime; the build goes on, and says the check did not
    run rather than skipping it in silence."""
    folder = write_function(
        tmp_path / "fn",
        lambda path: sequence_model(path, vocab=4, via="Abs"),
        '[function]\nname = "seq"\n[backend]\nprefer = ["onnxruntime"]\n',
    )
    assert main(["build", str(folder), "--out", str(tmp_path / "out")]) == 0
    out = " ".join(capfd.readouterr().out.split())
    assert (
        "warning: the batch-axis check did not run: ONNX Runtime failed on 3 random rows (" in out
    )
    assert "Hint: check the error above, or set [batching] max_batch_size = 0" in out
    assert "built seq" in out
