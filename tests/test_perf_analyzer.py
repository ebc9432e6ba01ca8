"""NVIDIA's perf_analyzer, unchanged, against `edgeserve serve` on 127.0.0.1.

The binary ships in tritonclient 2.41.0's manylinux wheel (pinned in the dev extra); it links
libb64 (apt: libb64-0d, scripts/system-deps.sh) and libcudart.so.12 even for HTTP on a CPU
machine (pip: nvidia-cuda-runtime-cu12), whose folder goes on LD_LIBRARY_PATH here.

Runs are short on purpose: 200 ms windows and a stability bound of 1000% (perf_analyzer
then takes the first three windows), because these tests check that every mode works and that
the numbers and statistics it reads are consistent, not how fast anything is; the benchmarks
measure speed. The function's version is "1.0.0": perf_analyzer looks statistics up by an
integer version, which the server reports as "1" (docs/ARCHITECTURE.md, versions).
"""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.http as triton

from edgeserve.cli import main
from edgeserve.hardware import probe_gpus
from tests.models import varlen_model, write_function
from tests.server import served

MANIFEST = """
[function]
name = "varlen"
version = "1.0.0"
[batching]
max_batch_size = 8
max_queue_delay_ms = 1
[backend]
prefer = ["onnxruntime"]
"""
SHORT = ["--measurement-interval", "200", "--stability-percentage", "1000", "--max-trials", "5"]


def perf_analyzer_env() -> dict[str, str]:
    """The environment perf_analyzer needs: libcudart.so.12 from nvidia-cuda-runtime-cu12."""
    spec = importlib.util.find_spec("nvidia.cuda_runtime")
    assert spec is not None and spec.submodule_search_locations, (
        "nvidia-cuda-runtime-cu12 is missing: pip install -e '.[dev]'"
    )
    lib = Path(next(iter(spec.submodule_search_locations))) / "lib"
    paths = [str(lib), *filter(None, [os.environ.get("LD_LIBRARY_PATH")])]
    return {**os.environ, "LD_LIBRARY_PATH": os.pathsep.join(paths)}


def perf_analyzer(url: str, *args: str, model: str = "varlen") -> tuple[int, str]:
    """Run perf_analyzer against `model` at `url`: its exit code and output."""
    beside = Path(sys.executable).parent / "perf_analyzer"  # the venv's bin, on PATH or not
    binary = str(beside) if beside.exists() else shutil.which("perf_analyzer")
    assert binary, "perf_analyzer is missing: it ships in tritonclient==2.41.0 (the dev extra)"
    command = [binary, "-m", model, "-u", url.removeprefix("http://"), *SHORT, *args]
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=120, env=perf_analyzer_env()
    )
    return done.returncode, done.stdout + done.stderr


def run_perf_analyzer(url: str, *args: str, model: str = "varlen") -> str:
    """perf_analyzer's output, failing the test on a non-zero exit."""
    code, output = perf_analyzer(url, *args, model=model)
    assert code == 0, f"perf_analyzer {' '.join(args)} failed:\n{output}"
    return output


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open() as file:
        return list(csv.DictReader(file))


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    def model(path: Path) -> Path:
        return varlen_model(path, doubled=False)

    folder = write_function(tmp_path_factory.mktemp("pa") / "varlen", model, MANIFEST)
    with served(folder) as base_url:
        yield base_url


def test_a_concurrency_range_with_batches_zero_data_and_a_shape(url: str, tmp_path: Path) -> None:
    report = tmp_path / "levels.csv"
    output = run_perf_analyzer(
        url,
        *("--concurrency-range", "1:3:2", "-b", "2", "--shape", "x:7"),
        *("--input-data", "zero", "-f", str(report)),
    )
    check_levels(report, output)


def check_levels(report: Path, output: str, server_statistics: bool = True) -> None:
    """A run of concurrency 1 and 3 at batch size 2 measured both, with the server's times."""
    rows = read_csv(report)
    assert sorted(row["Concurrency"] for row in rows) == ["1", "3"]
    assert all(float(row["Inferences/Second"]) > 0 for row in rows)
    if server_statistics:
        assert all(float(row["Server Compute Infer"]) > 0 for row in rows)
    assert "Batch size: 2" in output


def test_a_request_rate_range_async_with_random_data(url: str, tmp_path: Path) -> None:
    report = tmp_path / "rates.csv"
    run_perf_analyzer(
        url,
        *("--request-rate-range", "40:80:40", "--async", "--shape", "x:5"),
        *("--input-data", "random", "-f", str(report)),
    )
    rows = read_csv(report)
    assert sorted(row["Request Rate"] for row in rows) == ["40", "80"]
    assert all(float(row["Inferences/Second"]) > 0 for row in rows)


def test_input_data_from_a_file_with_the_outputs_it_validates(url: str, tmp_path: Path) -> None:
    """perf_analyzer compares every response with `validation_data`: a wrong answer fails it."""
    rows = [np.arange(n, dtype=np.float32) + 0.5 for n in (3, 6)]
    data = {
        "data": [{"x": {"content": row.tolist(), "shape": [len(row)]}} for row in rows],
        "validation_data": [{"total": {"content": [float(row.sum())]}} for row in rows],
    }
    path = tmp_path / "data.json"
    path.write_text(json.dumps(data))
    output = run_perf_analyzer(
        url, "--input-data", str(path), "--concurrency-range", "2", "--async"
    )
    assert "Throughput:" in output
    wrong = tmp_path / "wrong.json"
    data["validation_data"][0]["total"]["content"] = [-1.0]
    wrong.write_text(json.dumps(data))
    code, output = perf_analyzer(url, "--input-data", str(wrong))
    assert code != 0 and "Output doesn't match expected output" in output, output


def test_a_semantic_version_is_served_as_its_major_number(url: str) -> None:
    client = triton.InferenceServerClient(url.removeprefix("http://"))
    try:
        assert client.get_model_metadata("varlen")["versions"] == ["1"]
        config = client.get_model_config("varlen")
        assert config["parameters"]["function_version"] == {"string_value": "1.0.0"}
        assert client.is_model_ready("varlen", model_version="1")
        assert client.is_model_ready("varlen", model_version="1.0.0")
        assert not client.is_model_ready("varlen", model_version="2")
        (stats,) = client.get_inference_statistics("varlen")["model_stats"]
        assert stats["version"] == "1"
    finally:
        client.close()


def test_bench_finds_the_model_in_the_repository_index(url: str) -> None:
    argv = ["bench", url, "--inputs", "random", "--shape", "x:4", "--window-s", "0.2"]
    assert main([*argv, "--max-windows", "3", "--json", "--plot", ""]) == 0


def run_in_system_shared_memory(url: str, tmp_path: Path, *args: str) -> None:
    """perf_analyzer creates, registers and names regions for every input and output, and
    unregisters them after (CUDA ones too: none here)."""
    report = tmp_path / "shm.csv"
    output = run_perf_analyzer(
        url,
        *("--shared-memory", "system", "--output-shared-memory-size", "4096", *args),
        *("--concurrency-range", "2", "-b", "2", "--shape", "x:8", "-f", str(report)),
    )
    (row,) = read_csv(report)
    assert float(row["Inferences/Second"]) > 0
    assert "Unable to unregister" not in output


def test_system_shared_memory(url: str, tmp_path: Path) -> None:
    run_in_system_shared_memory(url, tmp_path)
    status = httpx.get(f"{url}/v2/systemsharedmemory/status")
    assert status.status_code == 200 and status.json() == []  # it unregistered them all


@pytest.mark.skipif(not probe_gpus(), reason="CUDA shared memory needs an NVIDIA GPU")
def test_cuda_shared_memory(url: str, tmp_path: Path) -> None:
    """perf_analyzer's GPU regions: its CUDA IPC handles come base64 with line breaks (libb64)."""
    report = tmp_path / "cudashm.csv"
    run_perf_analyzer(
        url,
        *("--shared-memory", "cuda", "--output-shared-memory-size", "4096"),
        *("--concurrency-range", "2", "-b", "2", "--shape", "x:8", "-f", str(report)),
    )
    (row,) = read_csv(report)
    assert float(row["Inferences/Second"]) > 0
    status = httpx.get(f"{url}/v2/cudasharedmemory/status")
    assert status.status_code == 200 and status.json() == []  # it unregistered them all
