"""One inference process per GPU (needs 2 NVIDIA GPUs and onnxruntime-gpu; skipped with fewer).

`edgeserve serve --workers 2` with `[resources] devices = [0, 1]`, run as users run it. Checked
three ways: /metrics says each GPU's process ran batches; NVML says each GPU's memory grew by a
CUDA context and a session while the server ran (each process sees only its own GPU, so that
growth is its own); and where NVML lists processes by the pids of this namespace, each inference
process is on its own GPU and not on the other. A CUDA shared-memory region made on GPU 0 serves
requests that either process runs (the front copies it to the host: docs/ARCHITECTURE.md).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.http as triton

from edgeserve.hardware import probe_gpus
from tests.models import mlp_model, write_function
from tests.server import running
from tests.test_workers import infer_body, reference

if len(probe_gpus()) < 2 or "CUDAExecutionProvider" not in ort.get_available_providers():
    pytest.skip("needs 2 NVIDIA GPUs and onnxruntime-gpu", allow_module_level=True)

pynvml = pytest.importorskip("pynvml")
pytestmark = pytest.mark.gpu

MANIFEST = """
[function]
name = "mlp"
[batching]
max_batch_size = 32
max_queue_delay_ms = 2
[backend]
prefer = ["onnxruntime"]
precision = "fp32"
[resources]
devices = [0, 1]
"""
GROWTH_BYTES = 64 * 2**20  # a CUDA context alone takes more


@pytest.fixture
def nvml() -> Iterator[object]:
    pynvml.nvmlInit()
    yield pynvml
    pynvml.nvmlShutdown()


def used(index: int) -> int:
    return int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(index)).used)


def gpu_pids(index: int) -> set[int]:
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    return {process.pid for process in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)}


def per_device(url: str, family: str) -> dict[str, tuple[int, float]]:
    """{device: (pid, value)} of one edgeserve_instance_* family, from /metrics."""
    text = httpx.get(f"{url}/metrics", timeout=5).text
    found = {}
    for labels, value in re.findall(rf"edgeserve_instance_{family}\{{(.*?)\}} (\S+)", text):
        label = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        found[label["device"]] = (int(label["pid"]), float(value))
    return found


def test_each_gpu_gets_its_own_inference_process_and_batches(tmp_path: Path, nvml: object) -> None:
    folder = write_function(tmp_path / "mlp", mlp_model, MANIFEST)
    before = {index: used(index) for index in (0, 1)}
    x = np.random.default_rng(7).normal(size=(1, 16)).astype(np.float32)
    expected = reference(folder, x)
    with running(folder, "--workers", "2") as (url, server), ThreadPoolExecutor(32) as pool:
        assert "2 inference processes (cuda:0, cuda:1)" in "".join(server.output)

        def infer() -> np.ndarray:
            answer = httpx.post(f"{url}/v2/models/mlp/infer", json=infer_body(x), timeout=30)
            assert answer.status_code == 200, answer.text
            return np.asarray(answer.json()["outputs"][0]["data"], np.float32).reshape(1, 4)

        for got in pool.map(lambda _: infer(), range(512)):
            np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
        executions = per_device(url, "executions")
        assert set(executions) == {"cuda:0", "cuda:1"}
        assert all(count > 0 for _, count in executions.values()), executions
        time.sleep(0.5)  # NVML's view settles
        grown = {index: used(index) - before[index] for index in (0, 1)}
        assert all(growth > GROWTH_BYTES for growth in grown.values()), grown
        pids = {device: pid for device, (pid, _) in executions.items()}
        listed = {index: gpu_pids(index) for index in (0, 1)}
        if set(pids.values()) & (listed[0] | listed[1]):  # NVML shows this namespace's pids
            assert pids["cuda:0"] in listed[0] and pids["cuda:0"] not in listed[1], listed
            assert pids["cuda:1"] in listed[1] and pids["cuda:1"] not in listed[0], listed
    print(f"per GPU: executions {executions}, memory grown {grown} bytes, pid {os.getpid()}")


def test_a_cuda_region_on_gpu_0_serves_the_process_on_gpu_1(tmp_path: Path) -> None:
    try:
        import tritonclient.utils.cuda_shared_memory as cudashm
    except (ImportError, RuntimeError) as error:  # RuntimeError: it found no `cuda.cudart`
        pytest.skip(f"tritonclient's CUDA shm utilities: {error}")
    folder = write_function(tmp_path / "mlp", mlp_model, MANIFEST)
    x = np.random.default_rng(8).normal(size=(1, 16)).astype(np.float32)
    handle = cudashm.create_shared_memory_region("x_gpu0", x.nbytes, 0)
    try:
        cudashm.set_shared_memory_region(handle, [x])
        with running(folder, "--workers", "2") as (url, _):
            client = triton.InferenceServerClient(url.removeprefix("http://"))
            raw = cudashm.get_raw_handle(handle)
            client.register_cuda_shared_memory("x_gpu0", raw, 0, x.nbytes)  # as users do
            tensor = {"name": "x", "datatype": "FP32", "shape": [1, 16]}
            tensor["parameters"] = {
                "shared_memory_region": "x_gpu0",
                "shared_memory_byte_size": x.nbytes,
            }
            for _ in range(16):  # one at a time: ties rotate over the two processes
                answer = httpx.post(f"{url}/v2/models/mlp/infer", json={"inputs": [tensor]})
                assert answer.status_code == 200, answer.text
                y = np.asarray(answer.json()["outputs"][0]["data"], np.float32).reshape(1, 4)
                np.testing.assert_allclose(y, reference(folder, x), rtol=1e-4, atol=1e-4)
            ran = per_device(url, "executions")
            assert ran["cuda:1"][1] > 0 and ran["cuda:0"][1] > 0, ran
    finally:
        cudashm.destroy_shared_memory_region(handle)
