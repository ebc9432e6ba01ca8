"""NVIDIA's perf_analyzer, unchanged, over gRPC (`-i grpc`) against `edgeserve serve --grpc-port`:
unary, streaming, and system shared memory, the statistics it reads included (it fails a run
whose server-side statistics it cannot read).

Short runs, as in test_perf_analyzer.py: every mode works, not how fast.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import tritonclient.grpc as triton

from tests.models import varlen_model, write_function
from tests.server import running
from tests.test_grpc import grpc_url
from tests.test_perf_analyzer import (
    MANIFEST,
    check_levels,
    run_in_system_shared_memory,
    run_perf_analyzer,
)


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    def model(path: Path) -> Path:
        return varlen_model(path, doubled=False)

    folder = write_function(tmp_path_factory.mktemp("pa") / "varlen", model, MANIFEST)
    with running(folder, "--grpc-port", "0") as (_, server):
        yield grpc_url(server)


@pytest.mark.parametrize(
    "mode", [(), ("--async",), ("--streaming",)], ids=["sync", "async", "stream"]
)
def test_a_concurrency_range(url: str, tmp_path: Path, mode: tuple[str, ...]) -> None:
    report = tmp_path / "levels.csv"
    output = run_perf_analyzer(
        url,
        *("-i", "grpc", *mode, "--concurrency-range", "1:3:2", "-b", "2", "--shape", "x:7"),
        *("--input-data", "random", "-f", str(report)),
    )
    check_levels(report, output, server_statistics=not mode)  # as perf_analyzer reads them


def test_system_shared_memory(url: str, tmp_path: Path) -> None:
    run_in_system_shared_memory(url, tmp_path, "-i", "grpc")
    client = triton.InferenceServerClient(url)
    try:
        assert client.get_system_shared_memory_status(as_json=True) == {}  # all unregistered
    finally:
        client.close()
