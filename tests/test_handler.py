"""A handler's mistakes, as its author meets them: `edgeserve build` names the file, the line and
the sample; `edgeserve serve` names the source file (not the bundle cache) and answers the client
with what the handler returned and what was expected."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest

from edgeserve.cli import main
from tests.models import mlp_model, write_function
from tests.server import running

MANIFEST = (
    '[function]\nname = "mlp"\n[handler]\nmodule = "handler"\n[backend]\nprefer = ["onnxruntime"]\n'
)
GOOD = """\
import numpy as np

def preprocess(payload, ctx):
    return [{"x": np.asarray(payload["x"], dtype=np.float32)}]

def postprocess(items, ctx):
    return {"y": items[0]["y"]}
"""
SAMPLE = json.dumps({"x": [0.5] * 16})
REFUSING = GOOD.replace(  # a handler that refuses a payload without "x" (InvalidInput: 400)
    "def preprocess(payload, ctx):\n",
    "from edgeserve.errors import InvalidInput\n\ndef preprocess(payload, ctx):\n"
    "    if 'x' not in payload:\n"
    "        raise InvalidInput('expected {\"x\": [16 numbers]}')\n",
)


def _function(tmp_path: Path, handler: str, sample: bool = True) -> Path:
    folder = write_function(tmp_path / "fn", mlp_model, MANIFEST, handler)
    if sample:
        (folder / "samples").mkdir()
        (folder / "samples" / "request.json").write_text(SAMPLE)
    return folder


def _build(folder: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(["build", str(folder), "--out", str(folder.parent / "out")])
    captured = capsys.readouterr()
    return code, " ".join((captured.out + captured.err).split())


def test_build_runs_a_good_handler_on_the_samples(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, said = _build(_function(tmp_path, GOOD), capsys)
    assert code == 0
    assert "handler: ran samples/request.json through preprocess, model, postprocess" in said


METERED = """\
import numpy as np
import prometheus_client

CALLS = prometheus_client.Counter("metered_calls", "calls, counted where the handler runs")

def preprocess(payload, ctx):
    CALLS.inc()
    x = payload["x"] if isinstance(payload, dict) else [len(payload) / 100] * 16  # an image
    return [{"x": np.asarray(x, dtype=np.float32)}]

def postprocess(items, ctx):
    return {"y": items[0]["y"]}
"""


def test_build_imports_a_handler_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The dry run imported the handler, then the precision check once more for each image
    sample: a handler registering a Prometheus metric at import failed the build with "the
    handler failed to import: DuplicateTimeseries" at its valid line 4."""
    folder = write_function(
        tmp_path / "fn", mlp_model, MANIFEST.split("[backend]")[0], METERED
    )  # OpenVINO planned: the precision check runs
    (folder / "samples").mkdir()
    (folder / "samples" / "request.json").write_text(SAMPLE)
    for name, extra in (("a.png", b""), ("b.png", b"\0")):  # two rows: the check runs each
        (folder / "samples" / name).write_bytes(b"\x89PNG\r\n\x1a\n" + extra)
    code, said = _build(folder, capsys)
    assert code == 0, said
    assert "precision auto (openvino): outputs differ from fp32 by at most" in said
    assert "on 2 samples" in said  # the images, through the one imported handler


@pytest.mark.parametrize(
    ("handler", "expected"),
    [
        (
            GOOD.replace("def preprocess(payload, ctx):", "def preprocess(payload, ctx)"),
            "{file}:3: syntax error in the handler: expected ':': def preprocess(payload, ctx)",
        ),
        (
            "import numpy as np\nimport tokenizerz\n" + GOOD,
            "{file}:2: the handler failed to import: ModuleNotFoundError: No module named "
            "'tokenizerz'. Hint: install it, and list it in [handler] requirements",
        ),
        (
            "import sys\nsys.exit(3)\n" + GOOD,
            "{file}:2: the handler failed to import: SystemExit: 3",
        ),
        (
            GOOD.replace('return [{"x"', 'return {"x"').replace("float32)}]", "float32)}"),
            "{file}: on request.json: handler.preprocess returned dict; expected "
            "list[dict[str, np.ndarray]]",
        ),
        (
            GOOD.replace("dtype=np.float32", "dtype=np.float64"),
            "{file}: on request.json: handler.preprocess item 0, `x`: got FP64 [16]; expected "
            "FP32 [16]",  # no "(-1: any size)" where no dim is -1
        ),
        (
            GOOD.replace('{"x": np.asarray', '{"input": np.asarray'),
            "{file}: on request.json: handler.preprocess item 0 has keys ['input']; expected "
            "the model's inputs ['x']",
        ),
        (
            GOOD.replace('payload["x"]', 'payload["features"]'),
            "{file}:4: handler.preprocess raised KeyError: 'features' (on {folder}/samples/"
            "request.json)",
        ),
        (
            GOOD.replace('return {"y": items[0]["y"]}', 'return {"y": {1, 2}}'),
            "{file}: on request.json: handler.postprocess returned dict holding what a response "
            "cannot carry",
        ),
    ],
    ids=["syntax", "import", "exit", "not a list", "dtype", "names", "raises", "unencodable"],
)
def test_build_names_the_file_the_line_and_what_was_expected(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], handler: str, expected: str
) -> None:
    folder = _function(tmp_path, handler)
    code, said = _build(folder, capsys)
    assert code == 2
    assert said.startswith("error: ")
    assert expected.format(file=folder / "handler.py", folder=folder) in said
    assert "built" not in said


def test_build_says_when_a_sample_does_not_fit_the_handler(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = _function(tmp_path, REFUSING)
    (folder / "samples" / "request.json").write_text('{"pixels": []}')
    code, said = _build(folder, capsys)
    assert code == 2
    assert f"{folder}/samples/request.json: handler.preprocess refused this sample " in said
    assert 'expected {"x": [16 numbers]}. Hint: make the sample a request the handler' in said


@pytest.mark.parametrize("workers", ["1", "2"], ids=["one process", "front processes"])
def test_serve_answers_a_contract_violation_clearly_and_logs_the_source_file(
    tmp_path: Path, workers: str
) -> None:
    bad = GOOD.replace('return [{"x"', 'return {"x"').replace("float32)}]", "float32)}")
    folder = _function(tmp_path, bad, sample=False)  # no sample: nothing for build to catch
    with running(folder, "--workers", workers) as (url, server):
        answer = httpx.post(f"{url}/invoke", json=json.loads(SAMPLE), timeout=30)
        refused = httpx.post(f"{url}/invoke", json={"nothing": 1}, timeout=30)
        generic = httpx.get(f"{url}/v2/health/ready")
    assert generic.status_code == 200  # the server goes on serving
    assert answer.status_code == 500
    assert answer.json() == {
        "error": "handler.preprocess returned dict; expected list[dict[str, np.ndarray]] "
        "(a bug in the function's handler, not in the request)"
    }
    log = "".join(server.output)
    assert f"{folder}/handler.py: handler.preprocess returned dict" in log
    assert refused.status_code == 500  # a KeyError in the handler: a fault, its traceback logged
    assert f'File "{folder}/handler.py", line 4, in preprocess' in log  # the user's file
    assert "/bundles/" not in log  # never the copy in the bundle cache


def test_serve_answers_400_when_the_handler_refuses_its_input(tmp_path: Path) -> None:
    with running(_function(tmp_path, REFUSING, sample=False)) as (url, _):
        refused = httpx.post(f"{url}/invoke", json={"pixels": []}, timeout=30)
    assert refused.status_code == 400
    assert refused.json() == {"error": 'expected {"x": [16 numbers]}'}


def test_serve_blames_the_client_for_sizes_and_the_handler_for_types(tmp_path: Path) -> None:
    """GOOD passes the client's `x` along: a wrong length is the client's (400, the tensor
    named), a float64 array is the handler's own doing (500 that says so)."""
    sloppy = GOOD.replace("dtype=np.float32", "dtype=payload.get('dtype', 'float32')")
    with running(_function(tmp_path, sloppy, sample=False)) as (url, _):
        short = httpx.post(f"{url}/invoke", json={"x": [0.5] * 3}, timeout=30)
        wide = httpx.post(f"{url}/invoke", json={"x": [0.5] * 16, "dtype": "float64"}, timeout=30)
    assert short.status_code == 400
    assert short.json() == {
        "error": "handler.preprocess's item 0, run as a batch of one row: "
        "tensor `x`: expected [-1, 16] FP32, got [1, 3] FP32"
    }
    assert wide.status_code == 500
    assert wide.json()["error"].startswith(
        "handler.preprocess item 0, `x`: got FP64 [16]; expected FP32 [16]"
    )


def test_serve_names_the_source_file_when_the_handler_does_not_import(tmp_path: Path) -> None:
    folder = _function(tmp_path, "import tokenizerz\n" + GOOD, sample=False)
    with (
        pytest.raises(RuntimeError, match="server did not start") as failed,
        running(folder, timeout_s=60),
    ):
        pass
    said = str(failed.value)
    assert f"{folder}/handler.py:1: the handler failed to import: ModuleNotFoundError" in said
    assert "/bundles/" not in said


def test_float32_results_keep_float32_digits_in_json_even_when_sliced(tmp_path: Path) -> None:
    """A handler's view of an output (every other value) went through tolist(), and float32
    values printed as float64 ones (0.1428571492433548 for 0.14285715)."""
    sliced = GOOD.replace('return {"y": items[0]["y"]}', 'return {"y": items[0]["y"][::2]}')
    with running(_function(tmp_path, sliced, sample=False)) as (url, _):
        answer = httpx.post(f"{url}/invoke", json={"x": [0.5] * 16}, timeout=30)
    values = answer.json()["y"]
    written = answer.text.split("[")[1].split("]")[0].split(",")
    assert len(values) == len(written) == 2
    assert written == [str(np.float32(value)) for value in values]  # float32's shortest repr


ECHO = """\
import numpy as np

def preprocess(payload, ctx):
    ctx.state["seen"] = {"type": ctx.content_type, "payload": repr(payload)[:80]}
    return [{"x": np.zeros(16, np.float32)}]

def postprocess(items, ctx):
    return ctx.state["seen"]
"""


def test_a_form_upload_hands_the_handler_its_one_file(tmp_path: Path) -> None:
    """`curl -F file=@page.png`: the handler sees the file as if sent alone (before: the raw
    multipart body, boundaries and all)."""
    png = b"\\x89PNG\\r\\n\\x1a\\n\\x00\\r\\n--not-a-boundary"
    with running(_function(tmp_path, ECHO, sample=False)) as (url, _):
        image = httpx.post(f"{url}/invoke", files={"file": ("page.png", png, "image/png")})
        as_json = httpx.post(
            f"{url}/invoke",
            data={"note": "a field beside the file"},
            files={"file": ("x.json", b'{"x": [1, 2]}', "application/json")},
        )
        two = httpx.post(f"{url}/invoke", files={"a": ("a.png", png), "b": ("b.png", png)})
        form = httpx.Request("POST", url, files={"file": ("page.png", png, "image/png")})
        whole, form_type = form.read(), form.headers["content-type"]
        refused = {
            why: httpx.post(f"{url}/invoke", content=body, headers={"content-type": kind})
            for why, body, kind in [
                ("no boundary", png, "multipart/form-data"),
                ("cut off", whole[: len(whole) // 2], form_type),
                ("nested", NESTED_FORM, "multipart/form-data; boundary=B"),
                ("LF line ends", whole.replace(b"\r\n", b"\n"), form_type),
            ]
        }
    assert image.json() == {"type": "image/png", "payload": repr(png)}
    assert as_json.json() == {"type": "application/json", "payload": "{'x': [1, 2]}"}
    assert two.status_code == 400
    assert "multipart/form-data: 2 files (fields ['a', 'b']); expected one" in two.text
    assert {why: (r.status_code, r.json()["error"]) for why, r in refused.items()} == {
        "no boundary": (400, "request body: multipart/form-data: no boundary in its Content-Type"),
        "cut off": (
            400,
            "request body: multipart/form-data: a part has no closing boundary (a body cut off?)",
        ),
        "nested": (
            400,
            "request body: multipart/form-data: a part is itself multipart; expected a file",
        ),
        "LF line ends": (
            400,
            "request body: multipart/form-data: its lines end with a bare LF; multipart needs "
            "CRLF (RFC 2046)",
        ),
    }


NESTED_FORM = (
    b"--B\r\nContent-Type: multipart/mixed; boundary=C\r\n\r\n"
    b"--C\r\nContent-Type: text/plain\r\n\r\nx\r\n--C--\r\n\r\n--B--\r\n"
)


THREADS = """\
import threading
import time

import numpy as np

def preprocess(payload, ctx):
    time.sleep(0.003)  # decoding an image: worth a worker thread
    ctx.state["pre"], ctx.state["slow"] = threading.current_thread().name, payload["slow"]
    return [{"x": np.zeros(16, np.float32)}]

def postprocess(items, ctx):
    if ctx.state["slow"]:
        time.sleep(0.005)
    return {"pre": ctx.state["pre"], "post": threading.current_thread().name}
"""


def test_a_hook_that_proved_cheap_runs_on_the_event_loop(tmp_path: Path) -> None:
    """A thread hop costs more than a cheap postprocess: once a hook has proved cheap it runs on
    the server's event loop; a hook that takes milliseconds, or got slower, runs on a thread."""
    with running(_function(tmp_path, THREADS, sample=False)) as (url, _):

        def ask(slow: bool) -> dict[str, str]:
            answer = httpx.post(f"{url}/invoke", json={"slow": slow}, timeout=30)
            assert answer.status_code == 200, answer.text
            return answer.json()

        fast = [ask(slow=False) for _ in range(4)]
        slowed = ask(slow=True)  # still believed cheap: on the loop, and now learned slower
        after = ask(slow=False)
    assert fast[0]["post"] != "MainThread"  # nothing learned yet: a thread
    assert [seen["post"] for seen in fast[1:]] == ["MainThread"] * 3
    assert all(seen["pre"] != "MainThread" for seen in [*fast, slowed, after])
    assert slowed["post"] == "MainThread"
    assert after["post"] != "MainThread"


FP64 = GOOD.replace("dtype=np.float32", "dtype=np.float64")
"""A handler whose preprocess breaks the contract on the sample: build refuses it."""


@pytest.mark.parametrize(
    "verb",
    [("serve", "--port", "0"), ("serve", "--emulate", "aws-lambda", "--port", "0"), ("deploy",)],
    ids=["serve", "lambda emulator", "deploy"],
)
def test_serving_a_source_folder_runs_the_checks_build_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, verb: tuple[str, ...]
) -> None:
    """`serve`, the Lambda emulator and `deploy` on a source folder skipped build's dry run of
    the handler on the samples: a preprocess returning float64 for a float32 input served
    (every such request then a 500) where `edgeserve build` refused it. They refuse it now,
    with build's words and exit code, before anything listens or ships."""
    monkeypatch.setenv("EDGESERVE_CACHE_DIR", str(tmp_path / "cache"))
    for name in ("AWS_PROFILE", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name, raising=False)  # a deploy that got past the checks ships nowhere
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    folder = _function(tmp_path, FP64)
    target = ("--target", "aws-lambda") if verb == ("deploy",) else ()
    command = [sys.executable, "-m", "edgeserve", verb[0], str(folder), *verb[1:], *target]
    done = subprocess.run(command, capture_output=True, text=True, timeout=90)
    said = " ".join((done.stdout + done.stderr).split())
    assert done.returncode == 2, said
    assert (
        f"error: {folder / 'handler.py'}: on request.json: handler.preprocess item 0, `x`: got "
        "FP64 [16]; expected FP32 [16]"
    ) in said
    assert not list((tmp_path / "cache" / "bundles").glob("mlp-*"))  # nothing cached either


def test_serving_a_source_folder_imports_its_handler_once(tmp_path: Path) -> None:
    """The checks import the handler from the source folder, the server its copy in the bundle
    cache: a handler registering a Prometheus metric at import is still run once."""
    folder = write_function(tmp_path / "fn", mlp_model, MANIFEST.split("[backend]")[0], METERED)
    (folder / "samples").mkdir()
    (folder / "samples" / "request.json").write_text(SAMPLE)
    with running(folder, "--workers", "1") as (url, server):
        answer = httpx.post(f"{url}/invoke", json=json.loads(SAMPLE), timeout=30)
    assert answer.status_code == 200, answer.text
    log = " ".join("".join(server.output).split())
    assert "handler: ran samples/request.json through preprocess, model, postprocess" in log
    assert "precision auto (openvino): outputs differ from fp32 by at most" in log
