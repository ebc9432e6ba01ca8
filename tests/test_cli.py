"""The `edgeserve` command as a newcomer meets it: help, version, ports, URLs."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import tomllib
from pathlib import Path

import httpx
import pytest

from edgeserve import __version__
from edgeserve.arguments import MIN_WINDOWS
from edgeserve.bench.measure import STABILITY_WINDOWS
from edgeserve.cli import main
from edgeserve.errors import ConfigError
from tests.models import mlp_model, write_function
from tests.server import Server, served, wait_ready

MANIFEST = """
[function]
name = "mlp"
[backend]
prefer = ["onnxruntime"]
"""
VERBS = ("init", "build", "serve", "invoke", "bench", "deploy", "status", "rollback")
VERBS += ("engine", "tune", "doctor", "help", "cache")


def _run(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "edgeserve", *argv]
    env = {**os.environ, "COLUMNS": "100"}
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.strip() == f"edgeserve {__version__}"


def test_top_level_help_says_what_it_is_and_where_to_start() -> None:
    text = _run("--help").stdout
    assert text.startswith("usage: edgeserve [-h] [--version] COMMAND ...")
    assert "puts one ONNX model into production as a self-contained HTTP function" in text
    assert "edgeserve init myfunc --model model.onnx" in text
    assert "edgeserve invoke 127.0.0.1:8080" in text
    for verb in VERBS:
        assert re.search(rf"^    {verb} +\w", text, re.MULTILINE), verb  # listed, with a summary


def test_every_argument_of_every_command_has_help() -> None:
    """argparse prints an argument without help as a bare line; each must have its words (the
    commands are read from the top-level help, so a command added later is checked too)."""
    verbs = re.findall(r"^    (\w+) +\w", _run("--help").stdout, re.MULTILINE)
    assert set(VERBS) <= set(verbs)
    for verb in verbs:
        lines = _run(verb, "--help").stdout.splitlines()
        for index, line in enumerate(lines):
            bare = re.fullmatch(r"  (\S+)( [A-Z_{][^ ]*)?(, -\S+( [A-Z_{][^ ]*)?)?", line)
            if bare:
                following = lines[index + 1] if index + 1 < len(lines) else ""
                assert following.startswith(" " * 20), f"{verb}: {line.strip()} has no help"


@pytest.mark.parametrize(
    ("verb", "words"),
    [
        ("serve", ["address to listen on (default 127.0.0.1", "TCP port, 1-65535, 0 for any"]),
        ("serve", ["default: [resources] port, else 8080", "server log detail (default info)"]),
        ("invoke", ["seconds to wait for the answer (default 60)", "HOST:PORT (http is assumed)"]),
        ("bench", ["measurement window, seconds (default 2)", "requests/s"]),
        ("tune", ["p99 latency to stay within, ms", "max queue delays to try, ms (default 0,2,8)"]),
    ],
)
def test_options_name_their_units_and_defaults(verb: str, words: list[str]) -> None:
    text = " ".join(_run(verb, "--help").stdout.split())  # argparse wraps lines: join them
    for phrase in words:
        assert phrase in text


def test_a_bad_port_is_refused_before_anything_loads(tmp_path: Path) -> None:
    folder = write_function(tmp_path / "mlp", mlp_model, MANIFEST)
    done = _run("serve", str(folder), "--port", "99999")
    assert done.returncode == 2
    assert "argument --port: '99999' is not a TCP port: expected 1-65535, or 0" in done.stderr
    assert "loaded" not in done.stderr + done.stdout


@pytest.mark.parametrize("count", ["0", "-1", "two"])
def test_no_execution_environments_for_the_lambda_emulator_is_refused(
    tmp_path: Path, count: str
) -> None:
    """`--emulate aws-lambda --instances 0` started, and every request then waited for ever."""
    folder = write_function(tmp_path / "mlp", mlp_model, MANIFEST)
    done = _run("serve", str(folder), "--emulate", "aws-lambda", "--instances", count)
    assert done.returncode == 2
    assert f"argument --instances: {count!r}: expected a whole number >= 1" in done.stderr


def test_bench_help_says_max_windows_is_at_least_3() -> None:
    """`bench --help` said only "windows before a level counts as unstable", and 1 or 2 were
    refused once the bench had begun, with a message that named four settings at once."""
    text = " ".join(_run("bench", "--help").stdout.split())
    assert "--max-windows MAX_WINDOWS windows before a level counts as unstable, at least 3" in text
    assert MIN_WINDOWS == STABILITY_WINDOWS  # the parser's bound is the stability rule's


@pytest.mark.parametrize("count", ["1", "2", "three"])
def test_too_few_bench_windows_are_a_usage_error(count: str) -> None:
    done = _run("bench", "http://127.0.0.1:1", "--max-windows", count)
    assert done.returncode == ConfigError.exit_code == 2
    assert done.stderr.startswith("usage: edgeserve bench")
    assert (
        f"argument --max-windows: {count!r}: expected a whole number >= 3 (a level is stable "
        "when its last 3 agree)"
    ) in done.stderr
    assert "Traceback" not in done.stderr


def test_the_lambda_emulator_refuses_a_handler_that_cannot_import(tmp_path: Path) -> None:
    """As `serve` does: the emulator started anyway, and every request was a 502."""
    folder = write_function(
        tmp_path / "mlp", mlp_model, MANIFEST + '[handler]\nmodule = "handler"\n',
        "import tokenizerz\n",
    )  # fmt: skip
    done = _run("serve", str(folder), "--emulate", "aws-lambda", "--port", "0", timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "handler.py:1: the handler failed to import: ModuleNotFoundError" in done.stderr


def test_the_lambda_emulator_refuses_a_profile_of_another_target(tmp_path: Path) -> None:
    folder = write_function(tmp_path / "mlp", mlp_model, MANIFEST)
    done = _run("serve", str(folder), "--emulate", "aws-lambda", "--target", "jetson")
    assert done.returncode == 2
    assert "--target jetson: a profile for jetson; --emulate aws-lambda takes" in done.stderr
    odd = tmp_path / "odd.toml"
    odd.write_text('driver = "aws-lambda"\nkind = "x"\n')
    done = _run("serve", str(folder), "--emulate", "aws-lambda", "--target", str(odd))
    assert done.returncode == 2  # the keys offered are a profile's, not function.toml's
    assert "field `kind`: unknown key (found 'x'); expected one of ['driver'," in done.stderr


def test_a_port_in_use_is_found_before_the_model_loads(tmp_path: Path) -> None:
    folder = write_function(tmp_path / "mlp", mlp_model, MANIFEST)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = _run("serve", str(folder), "--port", str(port))
    assert done.returncode == 2
    assert f"port {port} on 127.0.0.1 is already in use by another process" in done.stderr
    assert "Hint: stop it, pass another --port, or --port 0" in done.stderr
    assert "loaded mlp" not in done.stderr + done.stdout  # refused before loading the model


def test_serve_listens_on_the_manifest_port(tmp_path: Path) -> None:
    port = _free_port()
    manifest = MANIFEST + f"[resources]\nport = {port}\n"
    folder = write_function(tmp_path / "mlp", mlp_model, manifest)
    command = [sys.executable, "-m", "edgeserve", "serve", str(folder), "--log-level", "info"]
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        url = Server(process).wait_for_url(90)
        assert url == f"http://127.0.0.1:{port}"
        wait_ready(url)
        assert httpx.get(f"{url}/v2/models/mlp").json()["name"] == "mlp"
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_invoke_takes_host_port_without_a_scheme(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = write_function(tmp_path / "mlp", mlp_model, MANIFEST)
    with served(folder) as url:
        address = url.removeprefix("http://")
        assert (
            main(["invoke", address, "--json", '{"x": [[' + ", ".join(["0.5"] * 16) + "]]}"]) == 0
        )
    assert '"y"' in capsys.readouterr().out


def test_invoke_sends_a_v2_infer_request_to_the_v2_route(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """init's samples/v2.json through `edgeserve invoke --file` (/invoke refused it), to the
    served model's route found by the repository index, or to the route the URL names."""
    folder = write_function(tmp_path / "mlp", mlp_model, MANIFEST)
    data = [0.5] * 16
    request = {"inputs": [{"name": "x", "shape": [1, 16], "datatype": "FP32", "data": data}]}
    (tmp_path / "v2.json").write_text(json.dumps(request))
    with served(folder) as url:
        capsys.readouterr()
        assert main(["invoke", url, "--file", str(tmp_path / "v2.json"), "--full"]) == 0
        answer = json.loads(capsys.readouterr().out)
        route = f"{url}/v2/models/mlp/infer"
        assert main(["invoke", route, "--file", str(tmp_path / "v2.json"), "--full"]) == 0
        again = json.loads(capsys.readouterr().out)
        expected = httpx.post(route, json=request).json()
        wrong = f"{url}/v2/models/nope/infer"
        assert main(["invoke", wrong, "--file", str(tmp_path / "v2.json")]) == 1
    assert answer == again == expected
    assert answer["model_name"] == "mlp" and answer["outputs"][0]["shape"] == [1, 4]
    assert "unknown model: 'nope'" in capsys.readouterr().err


INPUTS_HANDLER = """
import numpy as np


def preprocess(payload, ctx):
    return [{"x": np.asarray(row, dtype=np.float32)} for row in payload["inputs"]]


def postprocess(items, ctx):
    return {"rows": len(items)}
"""


def test_invoke_leaves_a_handlers_own_inputs_to_invoke(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A payload whose `inputs` are not v2 tensors (name, shape, datatype) is the handler's."""
    manifest = MANIFEST + '\n[handler]\nmodule = "handler"\n'
    folder = write_function(tmp_path / "mlp", mlp_model, manifest, handler=INPUTS_HANDLER)
    with served(folder) as url:
        capsys.readouterr()
        payload = json.dumps({"inputs": [[0.5] * 16, [0.25] * 16]})
        assert main(["invoke", url, "--json", payload, "--full"]) == 0
    assert json.loads(capsys.readouterr().out) == {"rows": 2}


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("ftp://127.0.0.1:8080", "ftp://127.0.0.1:8080"),
        ("", "http://"),
        ("http://", "http://"),
        ("http://user:secret@[::1", "http://[::1"),  # the password is not repeated
    ],
)
def test_invoke_blames_a_url_it_cannot_use(
    capsys: pytest.CaptureFixture[str], url: str, shown: str
) -> None:
    assert main(["invoke", url, "--json", "{}"]) == 2
    err = capsys.readouterr().err
    assert f"URL '{shown}': " in err and "expected http://HOST:PORT or HOST:PORT" in err
    assert "secret" not in err


def test_invoke_does_not_repeat_a_password_when_the_server_is_away(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["invoke", f"http://user:secret@127.0.0.1:{_free_port()}", "--json", "{}"]) == 1
    err = capsys.readouterr().err
    assert "request failed" in err and "secret" not in err


@pytest.mark.parametrize(
    "flags", [("--event", "rest"), ("--instances", "2"), ("--target", "aws-lambda")]
)
def test_emulator_options_without_the_emulator_are_refused(
    tmp_path: Path, flags: tuple[str, str]
) -> None:
    folder = write_function(tmp_path / "mlp", mlp_model, MANIFEST)
    done = _run("serve", str(folder), *flags)
    assert done.returncode == 2
    assert f"{flags[0]}: only with --emulate aws-lambda" in done.stderr


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--file", "no-such.json"], "invoke --file no-such.json: cannot read it (No such file"),
        (["--json", "{}", "--timeout", "-1"], "--timeout: '-1': expected a positive number of"),
        (["--json", "{}", "--timeout", "0"], "--timeout: '0': expected a positive number of"),
        (["--json", "{bad"], "invoke --json: not valid JSON: Expecting property name"),
        (["--json", "{}", "-H", "Authorization"], "'Authorization': expected 'NAME: VALUE'"),
    ],
)
def test_invoke_says_what_is_wrong_with_its_own_arguments(argv: list[str], words: str) -> None:
    """Before any request is sent: a one-line error, no traceback, the usage exit code (2; a
    file that could not be read gave 1, as a failed request does)."""
    done = _run("invoke", "127.0.0.1:9", *argv)
    assert done.returncode == 2
    assert words in done.stderr
    assert "Traceback" not in done.stderr


def test_invoke_with_the_payload_as_an_argument_points_at_json() -> None:
    """It printed the top-level usage and "unrecognized arguments"."""
    done = _run("invoke", "127.0.0.1:9", '{"x": [[1, 2]]}')
    assert done.returncode == 2 and "unrecognized" not in done.stderr
    assert " ".join(done.stderr.split()) == (
        "error: invoke: unexpected argument '{\"x\": [[1, 2]]}' after the URL; expected the "
        "payload as --json TEXT or --file PATH. Hint: edgeserve invoke 127.0.0.1:9 --json "
        "'{\"x\": [[1, 2]]}'"
    )


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["biuld", "functions/ocr"], "invalid choice: 'biuld' (choose from 'init', "),
        (["biuld", "functions/ocr"], "did you mean 'build'?"),
        (["serve", "functions/ocr", "--emulate", "aws-lamda"], "did you mean 'aws-lambda'?"),
        (["serve", "functions/ocr", "--prot", "8080"], "edgeserve serve: error: unrecognized "),
        (["serve", "x", "--prot", "1", "--workres=2"], "(did you mean --port, --workers?)"),
        (["build", "functions/ocr", "--zzzzz"], "arguments: --zzzzz\n"),  # nothing near
    ],
)
def test_a_mistyped_command_choice_or_option_names_the_nearest(argv: list[str], words: str) -> None:
    """The command's own usage, not the top level's, for an option it does not take; the usage
    exit code (2), nothing run."""
    done = _run(*argv)
    assert done.returncode == 2
    assert words in done.stderr
    if argv[0] != "biuld":
        assert f"usage: edgeserve {argv[0]} " in done.stderr


def test_help_manifest_prints_the_reference_that_ships_with_the_package(tmp_path: Path) -> None:
    text = _run("help", "manifest").stdout
    for section in ("[function]", "[model]", "[handler]", "[batching]", "[backend]", "[resources]"):
        assert f"## {section}" in text
    assert "pad_axis = 3" in text and "port = 8080" in text
    assert main(["init", str(tmp_path / "demo")]) == 0
    manifest = (tmp_path / "demo" / "function.toml").read_text()
    assert "# Every key, explained: `edgeserve help manifest`" in manifest
    assert "docs/" not in manifest  # a pip-installed edgeserve has no docs/ folder
    assert _run("help").stdout == text  # `edgeserve help` was a usage error: its one page now


def test_the_manifest_reference_names_every_key_of_the_schema() -> None:
    """The shipped reference keeps up with function.toml's schema (pydantic's, read here)."""
    from edgeserve.manifest import Manifest, TensorOverride

    text = _run("help", "manifest").stdout
    for section, field in Manifest.model_fields.items():
        assert f"## [{section}]" in text, section
        keys = getattr(field.annotation, "model_fields", {})
        for key in keys:  # a key (`    key = `), or a table of its own (`[handler.options]`)
            written = rf"^    ({key} = |\[{section}\.{key}[.\]])"
            assert re.search(written, text, re.MULTILINE), f"{section}.{key}"
    for key in TensorOverride.model_fields:
        assert re.search(rf"^    {key} = ", text, re.MULTILINE), key


def test_the_manifest_reference_shows_defaults_or_says_optional() -> None:
    """A value shown for a key is its default, unless the key has none and its comment says
    `optional` (`max_abs_diff = 0.05` read as a default that the schema does not have)."""
    from edgeserve.manifest import Manifest

    text, section, shown = _run("help", "manifest").stdout, "", []
    for line in text.splitlines():  # the keys of each section, before its sub-tables
        if heading := re.match(r"^## \[(\w+)\]", line):
            section = heading[1]
        elif line.startswith("    ["):
            section = ""
        elif (key := re.match(r"^    (\w+) = (.+?)\s*(#.*)?$", line)) and section:
            shown.append((section, *key.groups()))
    for section, key, value, comment in shown:
        field = getattr(Manifest.model_fields[section].annotation, "model_fields", {})[key]
        if field.is_required():
            continue
        if field.default is None:
            assert (comment or "").startswith("# optional"), f"{section}.{key}: {comment}"
            continue
        default = list(field.default) if isinstance(field.default, tuple) else field.default
        assert tomllib.loads(f"v = {value}")["v"] == default, f"{section}.{key} = {value}"
    assert ("backend", "max_abs_diff") in {(section, key) for section, key, *_ in shown}


def test_cache_list_and_prune(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each edit of a served source makes a bundle; the cache keeps the most recent ones."""
    monkeypatch.setenv("EDGESERVE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("EDGESERVE_CACHE_MAX_BUNDLES", "2")
    folder = write_function(tmp_path / "mlp", mlp_model, MANIFEST)
    for version in ("1", "2", "3"):
        text = MANIFEST.replace('name = "mlp"', f'name = "mlp"\nversion = "{version}"')
        (folder / "function.toml").write_text(text)
        assert _run("build", str(folder), "--out", str(tmp_path / "out" / version)).returncode == 0
        with served(folder):  # serving a source builds it into the cache
            pass
    listed = _run("cache", "list").stdout
    assert f"2 bundles in {tmp_path / 'cache' / 'bundles'}\n" in listed
    assert listed.count("mlp-") == 2  # the oldest of the three was pruned automatically
    pruned = _run("cache", "prune", "--keep", "0")
    assert pruned.stdout.startswith("removed 2 bundles (")
    assert _run("cache", "list").stdout.startswith("0 bundles in ")


def test_broken_inputs_are_one_line_errors_not_tracebacks(tmp_path: Path) -> None:
    """Each of these once ended in a Python traceback."""
    folder = write_function(tmp_path / "mlp", mlp_model, MANIFEST)
    (folder / "samples" / "a.json").mkdir(parents=True)  # a folder named like a sample
    garbled = tmp_path / "garbled"
    garbled.mkdir()
    (garbled / "function.toml").write_bytes(b"\xff\xfe\x00garbage")
    (tmp_path / "a-file").write_text("")
    blocked = str(tmp_path / "a-file" / "out")  # its parent is a file
    cases = [
        (("build", str(garbled)), "not valid TOML (UTF-8 text)"),
        (("build", str(folder), "--out", blocked), "cannot write the bundle there"),
        (("invoke", "http://[::1", "--json", "{}"), "URL 'http://[::1': Invalid port"),
    ]
    for argv, words in cases:
        done = _run(*argv)
        assert done.returncode == 2 and words in done.stderr, (argv, done.stderr)
        assert "Traceback" not in done.stdout + done.stderr, argv
    built = _run("build", str(folder), "--out", str(tmp_path / "out"))
    assert built.returncode == 0, built.stderr  # the folder among the samples is not one


def test_serving_a_model_file_or_a_missing_folder_says_what_serve_takes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`edgeserve serve model.onnx`, a newcomer's first try, answered "model.onnx is not a
    bundle: no edgeserve.json"; a typo'd folder "no bundle at ...". Both now say what serve
    takes, and the model file how to make a function of it."""
    monkeypatch.chdir(tmp_path)
    mlp_model(tmp_path / "classifier.onnx")
    assert main(["serve", "classifier.onnx", "--port", "0"]) == 2
    said = " ".join(capsys.readouterr().err.split())
    assert (
        "classifier.onnx is an ONNX model, not a function; expected a function folder (holding "
        "function.toml) or a bundle (`edgeserve build`). Hint: `edgeserve init classifier "
        "--model classifier.onnx` makes a function of it, then `edgeserve serve classifier`"
    ) in said
    assert main(["serve", "clasifier", "--port", "0"]) == 2
    said = " ".join(capsys.readouterr().err.split())
    assert "clasifier: no such file or folder; expected a function folder (holding" in said


def test_serving_a_folder_of_a_model_or_of_functions_says_what_to_do(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A folder holding only a model, or several functions, read "is not a bundle: no
    edgeserve.json", where build says how to make the function."""
    mlp_model((tmp_path / "only").mkdir() or tmp_path / "only" / "classifier.onnx")
    for name in ("b", "a"):
        write_function(tmp_path / "functions" / name, mlp_model, MANIFEST)
    assert main(["serve", str(tmp_path / "only"), "--port", "0"]) == 2
    said = " ".join(capsys.readouterr().err.split())
    assert (
        f"{tmp_path / 'only'}: no function.toml here. Hint: `edgeserve init {tmp_path / 'only'}` "
        "writes one for classifier.onnx"
    ) in said
    assert main(["serve", str(tmp_path / "functions"), "--port", "0"]) == 2
    said = " ".join(capsys.readouterr().err.split())
    assert (
        f"It holds functions (a, b): each serves on its own, as `edgeserve serve "
        f"{tmp_path / 'functions' / 'a'}`"
    ) in said


def test_building_a_model_file_says_what_build_takes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`edgeserve build model.onnx` said "expected a function folder holding function.toml",
    with no word of how to make one (serve said it), and the same of a folder that is not
    there. The model now gets serve's hint, or its function's folder when it lies in one."""
    monkeypatch.chdir(tmp_path)
    mlp_model(tmp_path / "classifier.onnx")
    folder = write_function(tmp_path / "mine", mlp_model, MANIFEST)
    cases = [
        ("classifier.onnx", "classifier.onnx is an ONNX model, not a function; expected a "
         "function folder holding function.toml. Hint: `edgeserve init classifier --model "
         "classifier.onnx` makes a function of it, then `edgeserve build classifier`"),
        (str(folder / "model.onnx"), f"Hint: it belongs to the function {folder}: "
         f"`edgeserve build {folder}`"),
        ("mien", "mien: no such folder; expected a function folder holding function.toml"),
    ]  # fmt: skip
    for path, words in cases:
        assert main(["build", path]) == 2
        assert words in " ".join(capsys.readouterr().err.split()), path


def test_build_and_deploy_help_list_every_shipped_target() -> None:
    """build's help named local, aws-lambda and jetson alone, and deploy's none."""
    for verb in ("build", "deploy"):
        said = "".join(_run(verb, "--help").stdout.split())  # argparse wraps at hyphens too
        assert "aws-lambda,jetson,knative,knative-gpu,kserve,kubernetes,local" in said, verb
    assert "`edgeservebuild--targetT`writeswhatdeploywouldship" in said
