"""`edgeserve tune`: grid, choice and manifest edit as pure functions; one real sweep."""

from __future__ import annotations

import json
import sys
import tomllib
from pathlib import Path

import pytest

from edgeserve.builder import open_or_build
from edgeserve.cli import main
from edgeserve.errors import ConfigError
from edgeserve.manifest import PerDeviceKind, load_manifest
from edgeserve.tune import (
    Candidate,
    Trial,
    TuneResult,
    candidates,
    choose,
    render_table,
    update_sections,
)
from tests.models import centered_model, mlp_model
from tests.terminal import in_terminal, plain


def test_grid_covers_every_combination_once() -> None:
    grid = candidates([1, 8], [0, 2], [1], ["none", "pow2"])
    assert Candidate(8, (2, 4, 8), 2.0, 1) in grid
    assert Candidate(8, (), 0.0, 1) in grid
    assert len(grid) == 2 * 2 + 2  # max_batch 1 has no powers of two: "pow2" equals "none"
    assert all(candidate.processes_per_device is None for candidate in grid)  # not swept


def test_processes_per_device_are_swept_when_asked_for() -> None:
    grid = candidates([8], [2], [1], ["none"], [1, 2])
    assert grid == [Candidate(8, (), 2.0, 1, 1), Candidate(8, (), 2.0, 1, 2)]
    assert grid[1].sections()["resources"] == {"processes_per_device": 2}
    assert "resources" not in Candidate(8, (), 2.0, 1).sections()


@pytest.mark.parametrize(
    "args",
    [
        ([0], [0], [1], ["none"], [None]),
        ([8], [0], [0], ["none"], [None]),
        ([8], [0], [1], ["fibonacci"], [None]),
        ([8], [0], [1], ["none"], [0]),
    ],
    ids=["max_batch 0", "instances 0", "unknown preferred mode", "processes per device 0"],
)
def test_bad_grid_is_refused(args: tuple[list, ...]) -> None:
    with pytest.raises(ConfigError, match="tune grid"):
        candidates(*args)


def trial(items: float, p99: float, errors: int = 0, size: int = 8) -> Trial:
    return Trial(Candidate(size, (), 0.0, 1), items, p99, errors)


@pytest.mark.parametrize(
    ("trials", "expected"),
    [
        ([trial(100, 10), trial(300, 60), trial(200, 40)], 2),
        ([trial(100, 10), trial(100, 5)], 1),
        ([trial(500, 10, errors=3), trial(100, 10)], 1),
        ([trial(100, 80)], None),
    ],
    ids=["fastest within budget", "tie: lower p99", "failures disqualify", "none fits"],
)
def test_choose(trials: list[Trial], expected: int | None) -> None:
    best = choose(trials, budget_ms=50)
    assert best is (None if expected is None else trials[expected])


MANIFEST = """\
[function]
name = "mlp"  # keep this comment

[batching]
max_batch_size = 32   # was the default
preferred_batch_sizes = [
    8,
    16,
]
timeout_ms = 5000

# the backend: ONNX Runtime only
[backend]
prefer = ["onnxruntime"]
"""


def test_the_table_fits_an_80_column_terminal_with_every_header_whole() -> None:
    from rich.console import Console

    grid = candidates([32], [2], [1], ["pow2"], [1, 2, 4])
    trials = [Trial(c, 12345.0, 12.5, 0) for c in grid[:2]] + [Trial(grid[2], 0.0, 0.0, 3)]
    console = Console(width=80, record=True)
    console.print(render_table(TuneResult(tuple(trials), trials[1], 50.0, None), 32))
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 80
    header = next(line for line in text.splitlines() if "max_batch" in line).split()
    assert header == ["max_batch", "preferred", "delay", "ms", "instances", "procs", "items/s",
                      "p99", "ms"]  # fmt: skip
    assert "2,4,8,16,32" in text and "chosen" in text and "failed" in text


def test_update_batching_replaces_and_adds_keys_and_keeps_the_rest() -> None:
    text = update_sections(MANIFEST, Candidate(8, (2, 4, 8), 2.0, 2).sections())
    data = tomllib.loads(text)
    assert data["batching"] == {
        "max_batch_size": 8,
        "timeout_ms": 5000,
        "preferred_batch_sizes": [2, 4, 8],
        "max_queue_delay_ms": 2.0,
        "instances": 2,
    }
    assert data["backend"] == {"prefer": ["onnxruntime"]}
    assert text.index("instances = 2") < text.index("# the backend")  # the comment stays with it
    assert 'name = "mlp"  # keep this comment' in text
    assert "max_batch_size = 8   # was the default" in text
    assert "preferred_batch_sizes = [\n    2,\n    4,\n    8,\n]" in text  # still multi-line


def test_update_batching_adds_the_section_when_missing() -> None:
    text = update_sections('[function]\nname = "x"\n', {"batching": {"max_batch_size": 4}})
    assert tomllib.loads(text) == {"function": {"name": "x"}, "batching": {"max_batch_size": 4}}


def test_a_count_by_kind_of_device_keeps_the_kind_not_measured() -> None:
    """A sweep on a laptop's CPU wrote a plain count over functions/ocr's { gpu = 2 }, which
    then also set the GPU's; now only the kind measured changes, in the table as written."""
    manifest = MANIFEST + "\n[resources]\nprocesses_per_device = { gpu = 2 }  # a light model\n"
    current = PerDeviceKind(gpu=2)
    text = update_sections(manifest, Candidate(8, (), 0.0, 1, 3).sections(current, "cpu"))
    assert tomllib.loads(text)["resources"] == {"processes_per_device": {"gpu": 2, "cpu": 3}}
    assert "processes_per_device = {gpu = 2, cpu = 3}  # a light model" in text
    on_gpu = Candidate(8, (), 0.0, 1, 1).sections(current, "gpu")["resources"]
    assert on_gpu == {"processes_per_device": {"gpu": 1, "cpu": "auto"}}
    assert Candidate(8, (), 0.0, 1, 3).sections(2, "cpu")["resources"] == {
        "processes_per_device": 3
    }


def test_processes_per_device_land_in_resources_beside_its_other_keys() -> None:
    manifest = MANIFEST + "\n[resources]\nworkers = 2  # two fronts\n"
    text = update_sections(manifest, Candidate(8, (), 0.0, 1, 2).sections())
    assert tomllib.loads(text)["resources"] == {"workers": 2, "processes_per_device": 2}
    assert "workers = 2  # two fronts" in text
    assert tomllib.loads(text)["backend"] == {"prefer": ["onnxruntime"]}


def tune_argv(source: Path, delays: str) -> list[str]:
    """A short real sweep: max_batch 4, these delays, one instance, 0.3 s windows, c=2."""
    fixed = ["--latency-budget-ms", "2000", "--concurrency", "2", "--max-batch", "4"]
    return [
        "tune",
        str(source),
        *fixed,
        "--delay-ms",
        delays,
        "--instances",
        "1",
        "--window-s",
        "0.3",
    ]


def mlp_source(tmp_path: Path) -> Path:
    source = tmp_path / "mlp"
    mlp_model(source / "model.onnx")
    (source / "function.toml").write_text(MANIFEST)
    return source


def test_tune_measures_real_servers_and_writes_the_best(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = mlp_source(tmp_path)
    assert main([*tune_argv(source, "0"), "--preferred", "pow2"]) == 0
    out = capsys.readouterr().out
    assert "chosen" in out and "[2, 4]" in out
    batching = load_manifest(source).batching
    assert batching.max_batch_size == 4 and batching.max_queue_delay_ms == 0
    assert batching.timeout_ms == 5000  # untouched keys stay
    text = (source / "function.toml").read_text()
    assert "max_batch_size = 4   # was the default" in text
    assert "preferred_batch_sizes = [\n    2,\n    4,\n]" in text


def test_tune_sweeps_processes_per_device_and_writes_the_best_into_resources(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One and two inference processes (two: a front and two processes on CI's CPU): both
    serve, the table shows the setting, and the winner's count is written to [resources], for
    the CPU alone where the function counts by kind of device."""
    source = mlp_source(tmp_path)
    manifest = source / "function.toml"
    manifest.write_text(
        manifest.read_text() + "\n[resources]\nprocesses_per_device = { gpu = 3 }\n"
    )
    argv = [*tune_argv(source, "0"), "--preferred", "none", "--processes-per-device", "1,2"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "procs" in out and "chosen" in out and "failed" not in out
    chosen = load_manifest(source).resources.processes_per_device
    assert isinstance(chosen, PerDeviceKind) and chosen.gpu == 3 and chosen.cpu in (1, 2)
    assert f"processes_per_device={chosen.cpu} (on the cpu) written to" in " ".join(out.split())
    assert load_manifest(source).batching.max_batch_size == 4


def test_tune_says_why_candidates_failed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Samples the model refuses: each row fails with the server's answer, not a budget hint."""
    source = mlp_source(tmp_path)
    (source / "samples").mkdir()
    (source / "samples" / "request.json").write_text('{"x": [[1.0, 2.0]]}')
    assert main([*tune_argv(source, "0,1"), "--preferred", "none"]) == 1
    captured = capsys.readouterr()
    reason = "requests failed: HTTP 400: "
    expected = "tensor `x`: expected [-1, 16] FP32, got [1, 2] FP32"
    failed = [line for line in captured.out.splitlines() if line.startswith("failed: ")]
    assert len(failed) == 2 and all(reason in line and expected in line for line in failed)
    assert "max_queue_delay_ms=1.0" in failed[1]
    assert "tune: every candidate failed; the first: " in captured.err
    assert "budget" not in captured.err
    assert (source / "function.toml").read_text() == MANIFEST  # nothing written


def test_tune_shows_its_sweep_live_on_a_terminal(tmp_path: Path) -> None:
    source = mlp_source(tmp_path)
    argv = [*tune_argv(source, "0,1"), "--preferred", "none", "--dry-run"]
    code, output = in_terminal([sys.executable, "-m", "edgeserve", *argv])
    output = plain(output)
    assert code == 0, output
    assert "tune: max_batch 4, delay 1 ms" in output and "1/2" in output  # the live line
    assert "not written" in output
    assert (source / "function.toml").read_text() == MANIFEST


def test_tune_counts_the_items_of_invoke_samples(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The samples `init` writes are /invoke payloads, whose rows only the server counts: every
    candidate showed 0 items/s (and the choice fell to p99 alone) while `bench` was right."""
    source = mlp_source(tmp_path)
    (source / "samples").mkdir()
    (source / "samples" / "request.json").write_text(json.dumps({"x": [[0.5] * 16]}))
    assert main([*tune_argv(source, "0,1"), "--preferred", "none", "--dry-run"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()]
    rows = [row for row in rows if row and row[0] == "4"]  # max_batch 4: the candidates' rows
    assert len(rows) == 2 and all(float(row[4]) > 0 for row in rows), rows


def test_tune_leaves_the_bundle_cache_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each candidate's bundle went into the cache, whose cap (here 1) then evicted the user's
    own bundles; candidates are now built outside it."""
    monkeypatch.setenv("EDGESERVE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("EDGESERVE_CACHE_MAX_BUNDLES", "1")
    mine = open_or_build(mlp_source(tmp_path / "mine")).root  # the user's served function
    source = mlp_source(tmp_path)
    assert main([*tune_argv(source, "0,1"), "--preferred", "none", "--dry-run"]) == 0
    capsys.readouterr()
    assert main(["cache", "list"]) == 0
    listed = capsys.readouterr().out
    assert listed.startswith("1 bundles in ") and mine.name in listed
    assert [path.name for path in (tmp_path / "cache" / "bundles").iterdir()] == [mine.name]


def test_tune_sweeps_instances_alone_for_a_model_that_cannot_batch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Fixed first dims (served with max_batch_size 0): tune measured the same server for every
    batch size and delay, then wrote `max_batch_size = 4` into the manifest."""
    source = tmp_path / "fixed"
    mlp_model(source / "model.onnx", batch=1)
    (source / "function.toml").write_text('[function]\nname = "fixed"\n')
    argv = [*tune_argv(source, "0,1"), "--preferred", "none,pow2", "--instances", "1,2"]
    assert main(argv) == 0  # the last --instances counts
    lines = capsys.readouterr().out.splitlines()
    rows = [line.split()[:4] for line in lines if line.split()[:1] == ["-"]]
    assert rows == [["-", "-", "-", "1"], ["-", "-", "-", "2"]]  # two candidates, not eight
    out = " ".join(" ".join(lines).split())
    assert (
        "no batching: no batch axis (x [1, 16], y [1, 4]: no dynamic first dim), so the model"
        in out
    )
    assert "writes no batch size" in out
    written = tomllib.loads((source / "function.toml").read_text())["batching"]
    assert set(written) == {"instances"}  # no max_batch_size, preferred sizes nor delay
    assert f"best: instances={written['instances']} written to" in out
    assert main(["build", str(source), "--out", str(tmp_path / "out")]) == 0


def test_tune_sweeps_no_batch_sizes_for_a_first_axis_that_is_no_batch_axis(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Points centered on their mean, [P, 3]: every first dim dynamic, so tune measured batches
    (each request answered wrong, with a 200) and wrote `max_batch_size = 8` over init's 0,
    which build then refused. Tune now runs build's batch-axis check and sweeps instances
    alone; the manifest builds as tuned."""
    source = tmp_path / "cloud"
    assert main(["init", str(source), "--model", str(centered_model(tmp_path / "c.onnx"))]) == 0
    assert main([*tune_argv(source, "0"), "--instances", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[:4] for line in lines if line.split()[:1] == ["-"]] == [
        ["-", "-", "-", "1"]
    ]
    out = " ".join(" ".join(lines).split())
    assert "no batching: no batch axis (output `centered` of row 0 alone differs" in out
    written = tomllib.loads((source / "function.toml").read_text())["batching"]
    assert written.get("max_batch_size", 0) == 0
    assert main(["build", str(source), "--out", str(tmp_path / "out")]) == 0
