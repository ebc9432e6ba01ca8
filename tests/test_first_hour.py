"""A newcomer's first hour, through the CLI as they run it: what init says while it works and
what it writes, how each sample it wrote is sent, and what build says of a backend it passes
over for a reason the model itself gives."""

from __future__ import annotations

import contextlib
import functools
import json
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import onnx
import pytest

from edgeserve.cli import main
from tests.models import (
    classifier_model,
    identity_model,
    mlp_model,
    pair_model,
    reshaping_model,
    write_function,
)
from tests.server import served
from tests.terminal import in_terminal, plain


@pytest.fixture(autouse=True)
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EDGESERVE_CACHE_DIR", str(tmp_path / "cache"))


def edgeserve(*argv: str) -> list[str]:
    return [sys.executable, "-m", "edgeserve", *argv]


def test_init_says_what_it_runs_and_onnx_runtime_keeps_quiet(tmp_path: Path) -> None:
    """init ran the model for its batch-axis check without a word (seconds for a large model),
    and where the run failed, ONNX Runtime printed its own red line ("[E:onnxruntime:, ...]
    Non-zero status code returned while running Reshape node"): init looked broken. On a
    terminal it now says what it runs, on one transient line, and in a pipe nothing of that;
    ONNX Runtime's own line never shows. That the check could not run is one warning of
    edgeserve's own, as build gives it."""
    model = reshaping_model(tmp_path / "reshaping.onnx")  # fails on most random rows
    code, output = in_terminal(edgeserve("init", str(tmp_path / "a"), "--model", str(model)))
    shown = plain(output)
    assert code == 0, shown
    assert (
        "init: running reshaping.onnx on random rows to check that its first axis is a batch axis"
    ) in shown
    assert "[E:onnxruntime" not in shown, shown
    piped = subprocess.run(
        edgeserve("init", str(tmp_path / "b"), "--model", str(model)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert piped.returncode == 0
    warning = "warning: the batch-axis check did not run: ONNX Runtime failed on 3 random rows"
    assert piped.stderr.startswith(warning) and piped.stderr.count("\n") == 1, piped.stderr
    assert "[E:onnxruntime" not in piped.stderr
    assert piped.stdout.startswith(f"created {tmp_path / 'b'}")


def test_init_writes_a_v2_sample_and_says_how_to_send_each(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """init wrote samples/request.json for /invoke alone. It now writes samples/v2.json too,
    the same tensors as a KServe v2 infer request, and says how each is sent; the v2 route
    answers it, /invoke, sent it by mistake, says where it goes, `edgeserve invoke` sends it
    there, and doctor (as bench and tune, which read samples/ alike) sends each sample where it
    belongs."""
    dest = tmp_path / "fn"
    model = classifier_model(tmp_path / "classifier.onnx")
    assert main(["init", str(dest), "--model", str(model)]) == 0
    said = capsys.readouterr().out
    assert f"edgeserve invoke 127.0.0.1:8080 --file {dest}/samples/request.json" in said
    assert (
        f"curl -s -H 'Content-Type: application/json' --data-binary @{dest}/samples/v2.json "
        "127.0.0.1:8080/v2/models/fn/infer"
    ) in said
    v2 = json.loads((dest / "samples" / "v2.json").read_text())
    invoke = json.loads((dest / "samples" / "request.json").read_text())
    assert [(t["name"], t["datatype"], t["shape"]) for t in v2["inputs"]] == [
        ("pixels", "FP32", [1, 3, 32, 32])
    ]
    assert v2["inputs"][0]["data"] == [x for plane in invoke["pixels"][0] for row in plane
                                       for x in row]  # fmt: skip
    with served(dest) as url:
        answer = httpx.post(f"{url}/v2/models/fn/infer", json=v2, timeout=30)
        assert answer.status_code == 200, answer.text
        assert answer.json()["outputs"][0]["shape"] == [1, 10]
        error = httpx.post(f"{url}/invoke", json=v2, timeout=30).json()["error"]
        capsys.readouterr()
        sample = str(dest / "samples" / "v2.json")
        assert main(["invoke", url, "--file", sample, "--full"]) == 0
        sent = json.loads(capsys.readouterr().out)
    assert 'the body is a KServe v2 infer request ({"inputs": [...]}), which /invoke' in error
    assert "Hint: POST it to /v2/models/fn/infer" in error
    assert sent["model_name"] == "fn" and sent["outputs"][0]["shape"] == [1, 10]
    assert main(["doctor", str(dest)]) == 0  # each sample where it belongs, as bench sends it
    found = " ".join(capsys.readouterr().out.split())
    assert "samples/request.json │ ok │ /invoke: 200" in found, found
    assert "samples/v2.json │ ok │ v2 infer: 200" in found, found


def test_a_backend_passed_over_for_the_models_strings_is_the_plan_not_a_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A model with a string input made every build warn "warning: openvino refuses the model,
    so the bundle plans onnxruntime only", for a reason that never goes away. Build now says it
    as its plan, with the reason; a backend that fails to prepare the model still warns."""
    folder = write_function(
        tmp_path / "fn", lambda path: identity_model(path, ("BYTES",)), '[function]\nname = "fn"\n'
    )
    for _ in range(2):
        assert main(["build", str(folder), "--out", str(tmp_path / "out")]) == 0
        out = capsys.readouterr().out
        assert "plan: onnxruntime, not openvino: openvino has no BYTES tensors (`in_BYTES`)" in out
        assert "warning" not in out, out


def test_bench_counts_every_row_of_inits_two_samples(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """bench sends init's samples in turn, request.json to /invoke (rows the server counts)
    and v2.json to v2 infer (rows the client counts): it counted the v2 rows alone and showed
    half the rows a second."""
    dest = tmp_path / "fn"
    assert main(["init", str(dest), "--model", str(classifier_model(tmp_path / "c.onnx"))]) == 0
    capsys.readouterr()
    argv = ["bench", str(dest), "--concurrency", "2", "--window-s", "0.25", "--max-windows", "4"]
    assert main([*argv, "--json", "--plot", ""]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["protocol"] == "invoke+binary"  # it said "binary": half went to /invoke
    (level,) = report["levels"]
    assert level["first_failure"] is None and level["requests"] > 0
    assert level["items_per_s"] == pytest.approx(level["throughput_rps"], rel=0.2), level


def test_init_given_a_folder_as_the_model_says_it_is_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`init fn --model models/` said "no such file" of a folder that is there."""
    (tmp_path / "models").mkdir()
    assert main(["init", str(tmp_path / "fn"), "--model", str(tmp_path / "models")]) == 2
    error = capsys.readouterr().err
    assert f"--model {tmp_path / 'models'}: a folder; expected an ONNX model file" in error


def test_a_model_without_a_batch_axis_is_not_told_to_send_one(tmp_path: Path) -> None:
    """init's manifest and the /docs page said /invoke takes the tensors "with the batch axis"
    of a model that has none (features [1, 4])."""
    dest = tmp_path / "fn"
    assert main(["init", str(dest), "--model", str(pair_model(tmp_path / "pair.onnx"))]) == 0
    manifest = " ".join((dest / "function.toml").read_text().replace("#", "").split())
    assert "batch axis and answers" not in manifest
    assert '{"<input>": nested list, ...} of the dims below and answers' in manifest
    with served(dest) as url:
        document = httpx.get(f"{url}/openapi.json", timeout=10).json()
    described = document["paths"]["/invoke"]["post"]["description"]
    assert "as nested lists of the model's dims (no batch axis);" in described, described


def test_init_stopped_mid_copy_leaves_no_cut_model(tmp_path: Path) -> None:
    """Ctrl-C while init copied a large model left a cut copy in the folder (or the model
    without its weights), which the next init took for the model to adopt. The copy is now
    whole or absent."""
    home, dest = tmp_path / "home", tmp_path / "fn"
    model = classifier_model(home / "big.onnx")
    onnx.save(onnx.load(str(model)), str(model), save_as_external_data=True,
              location="big.bin", size_threshold=0)  # fmt: skip
    with (home / "big.bin").open("r+b") as weights:
        weights.truncate(8 * 2**30)  # sparse: seconds to copy, no disk of its own
    process = subprocess.Popen(
        edgeserve("init", str(dest), "--model", str(model)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + 60
    while not (dest / ".big.bin.part").exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=60) == 130
    assert not [path.name for path in dest.iterdir()]  # nothing cut: the next init starts over


def test_a_bf16_model_gets_no_v2_json_sample_and_is_told_why(tmp_path: Path) -> None:
    """v2 JSON has no numbers for BF16 (a 400 asks for binary): init writes no v2.json for
    such a model, and its manifest says why rather than pointing at a file that is not there."""
    dest = tmp_path / "fn"
    model = identity_model(tmp_path / "bf16.onnx", ("BF16",))
    assert main(["init", str(dest), "--model", str(model)]) == 0
    assert sorted(path.name for path in (dest / "samples").iterdir()) == ["request.json"]
    manifest = " ".join((dest / "function.toml").read_text().replace("#", "").split())
    assert "(no samples/v2.json: v2 JSON cannot carry BF16 inputs;" in manifest


def test_init_without_a_model_says_it_made_the_demo(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`edgeserve init mine` (--model forgotten) made the demo MLP and said only "created
    mine", as for an adopted model: the newcomer took the demo for their model."""
    assert main(["init", str(tmp_path / "mine")]) == 0
    said = " ".join(capsys.readouterr().out.split())
    assert "a demo: a generated MLP and its handler (no --model given). To adopt your " in said
    assert "edgeserve init NEW --model path/to/model.onnx" in said
    model = str(tmp_path / "mine" / "model.onnx")
    assert main(["init", str(tmp_path / "fn"), "--model", model]) == 0
    assert "a demo:" not in capsys.readouterr().out


def test_invoke_prints_a_classifier_answer_a_row_per_line(tmp_path: Path) -> None:
    """`invoke` pretty-printed every number on its own line: 1000 logits, 1000+ lines. On a
    terminal a row is now one line, cut to its width with a count of what was left out;
    piped, and with --full, the answer is the whole JSON it was."""
    wide = functools.partial(mlp_model, n_out=1000)
    folder = write_function(tmp_path / "wide", wide, '[function]\nname = "wide"\n')
    request = json.dumps({"x": [[0.5] * 16] * 3})
    with served(folder) as url:
        code, output = in_terminal(edgeserve("invoke", url, "--json", request))
        whole_code, whole = in_terminal(edgeserve("invoke", url, "--json", request, "--full"))
        piped = subprocess.run(
            edgeserve("invoke", url, "--json", request), capture_output=True, text=True, timeout=60
        )
    lines = plain(output).strip().splitlines()
    assert (code, lines[:2], lines[-2:]) == (0, ["{", '  "y": ['], ["  ]", "}"])
    rows = lines[2:-2]
    assert len(rows) == 3 and all(len(row) <= 120 for row in rows)
    assert all(re.fullmatch(r"    \[(-?\d[\d.e-]*, )+… \(\d+ more\)\],?", row) for row in rows)
    assert piped.returncode == whole_code == 0
    answer = json.loads(piped.stdout)
    assert [len(row) for row in answer["y"]] == [1000] * 3
    assert json.loads(plain(whole)) == answer
    assert len(piped.stdout.splitlines()) == 7  # a row per line, not one per number


def test_init_suggests_a_free_port_when_8080_is_taken(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """init's next steps said `--port 8080` whatever held that port here, and the serve they
    suggested failed with "address already in use"."""
    with socket.socket() as holder:
        with contextlib.suppress(OSError):  # taken already: taken either way
            holder.bind(("127.0.0.1", 8080))
            holder.listen()
        assert main(["init", str(tmp_path / "demo")]) == 0
        said = " ".join(capsys.readouterr().out.split())
        port = int(re.findall(r"--port (\d+) \(8080 is in use here\)", said)[0])
        assert port != 8080 and f"edgeserve invoke 127.0.0.1:{port} --file" in said
