"""Triton's GPU metrics on /metrics (nv_gpu_utilization, memory, power, energy), as
perf_analyzer --collect-metrics reads them.

NVML cannot exist on a machine without an NVIDIA driver: the first test serves the function with
a stand-in `pynvml` (tests/standin_nvml, two GPUs with fixed readings) on PYTHONPATH and runs the
real perf_analyzer against it; the last runs only where real NVML sees a GPU.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from edgeserve.hardware import probe_gpus
from tests.models import mlp_model, write_function
from tests.server import served
from tests.test_perf_analyzer import run_perf_analyzer

STANDIN = Path(__file__).parent / "standin_nvml"
GPU_FAMILIES = {
    "nv_gpu_utilization",
    "nv_gpu_memory_total_bytes",
    "nv_gpu_memory_used_bytes",
    "nv_gpu_power_usage",
    "nv_gpu_power_limit",
    "nv_energy_consumption",
}


@pytest.fixture(scope="module")
def function(tmp_path_factory: pytest.TempPathFactory) -> Path:
    manifest = '[function]\nname = "mlp"\n[backend]\nprefer = ["onnxruntime"]\n'
    return write_function(tmp_path_factory.mktemp("gpu_metrics") / "mlp", mlp_model, manifest)


def gpu_samples(url: str) -> dict[tuple[str, str], float]:
    """(family, gpu_uuid) -> value, of the nv_gpu_* and energy families on /metrics."""
    text = httpx.get(f"{url}/metrics").text
    return {
        (family.name, sample.labels["gpu_uuid"]): sample.value
        for family in text_string_to_metric_families(text)
        if family.name in GPU_FAMILIES
        for sample in family.samples
    }


def test_standin_nvml_readings_reach_metrics_and_perf_analyzer(function: Path) -> None:
    """Each reading under Triton's name and unit, a GPU without power readings left out of
    those families, and perf_analyzer's summary of them (memory read as integers: written
    with an exponent, 80 GiB read as 8 bytes)."""
    with served(function, env={"PYTHONPATH": str(STANDIN)}) as url:
        samples = gpu_samples(url)
        output = run_perf_analyzer(
            url, "--collect-metrics", "--metrics-url", f"{url}/metrics", model="mlp"
        )
    zero, one = "GPU-standin-0", "GPU-standin-1"
    assert samples == {
        ("nv_gpu_utilization", zero): 0.42,
        ("nv_gpu_utilization", one): 0.07,
        ("nv_gpu_memory_total_bytes", zero): 80 * 2**30,
        ("nv_gpu_memory_total_bytes", one): 16 * 2**30,
        ("nv_gpu_memory_used_bytes", zero): 3 * 2**30,
        ("nv_gpu_memory_used_bytes", one): 2**30,
        ("nv_gpu_power_usage", zero): 215.5,
        ("nv_gpu_power_limit", zero): 700.0,
        ("nv_energy_consumption", zero): 9876.543,
    }
    summary = " ".join(output.split("Server Prometheus Metrics:")[1].split())
    assert (
        f"Avg GPU Utilization: {zero} : 42% {one} : 7% "
        f"Avg GPU Power Usage: {zero} : 215.5 watts "
        f"Max GPU Memory Usage: {zero} : {3 * 2**30} bytes {one} : {2**30} bytes "
        f"Total GPU Memory: {zero} : {80 * 2**30} bytes {one} : {16 * 2**30} bytes"
    ) in summary


@pytest.mark.skipif(bool(probe_gpus()), reason="this machine has GPUs NVML reports")
def test_a_machine_without_gpus_reports_none(function: Path) -> None:
    with served(function) as url:
        assert gpu_samples(url) == {}
        assert httpx.get(f"{url}/metrics").text.count("nv_inference_count") >= 1


@pytest.mark.gpu
@pytest.mark.skipif(not probe_gpus(), reason="needs an NVIDIA GPU and pynvml (the gpu extra)")
def test_every_gpu_nvml_sees_is_reported(function: Path) -> None:
    with served(function) as url:
        samples = gpu_samples(url)
    uuids = {uuid for family, uuid in samples if family == "nv_gpu_utilization"}
    assert len(uuids) == len(probe_gpus())
    for uuid in uuids:
        assert 0.0 <= samples[("nv_gpu_utilization", uuid)] <= 1.0
        used = samples[("nv_gpu_memory_used_bytes", uuid)]
        assert 0 < used <= samples[("nv_gpu_memory_total_bytes", uuid)]
