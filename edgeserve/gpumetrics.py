"""Triton's GPU metrics, read from NVML at each scrape of /metrics.

perf_analyzer `--collect-metrics` and dashboards built for Triton read them by these names, one
sample per GPU labelled by its `gpu_uuid`: utilization (0 to 1), memory used and total (bytes),
power usage and limit (watts) and energy consumed since the driver loaded (joules). Every GPU
NVML sees is listed, as Triton lists those of its host. Without pynvml (the `gpu` extra's
nvidia-ml-py) or a driver there are none: a CPU machine, or a Jetson, which has no NVML. A
reading a GPU does not support (power on some boards) is left out for that GPU.

Written here rather than by prometheus_client, which writes a number of a million or more with
an exponent (8.589934592e+10): perf_analyzer reads memory sizes as integers, and read that one
as 8 bytes. Bytes are written as integers, as Triton writes them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Reading = Callable[[Any, Any], float]

READINGS: tuple[tuple[str, str, Reading], ...] = (  # name, help, reading of (pynvml, handle)
    (
        "nv_gpu_utilization",
        "GPU utilization rate [0.0 - 1.0)",
        lambda nvml, gpu: nvml.nvmlDeviceGetUtilizationRates(gpu).gpu / 100.0,
    ),
    (
        "nv_gpu_memory_total_bytes",
        "GPU total memory, in bytes",
        lambda nvml, gpu: float(nvml.nvmlDeviceGetMemoryInfo(gpu).total),
    ),
    (
        "nv_gpu_memory_used_bytes",
        "GPU used memory, in bytes",
        lambda nvml, gpu: float(nvml.nvmlDeviceGetMemoryInfo(gpu).used),
    ),
    (
        "nv_gpu_power_usage",
        "GPU power usage in watts",
        lambda nvml, gpu: nvml.nvmlDeviceGetPowerUsage(gpu) / 1000.0,
    ),
    (
        "nv_gpu_power_limit",
        "GPU power management limit in watts",
        lambda nvml, gpu: nvml.nvmlDeviceGetEnforcedPowerLimit(gpu) / 1000.0,
    ),
    (
        "nv_energy_consumption",
        "GPU energy consumption in joules since the driver was loaded",
        lambda nvml, gpu: nvml.nvmlDeviceGetTotalEnergyConsumption(gpu) / 1000.0,
    ),
)


class GpuMetrics:
    """NVML's readings as Prometheus text; NVML is opened at the first scrape (none is needed
    to serve) and, when it cannot be, never again."""

    def __init__(self) -> None:
        self._nvml: Any = None
        self._opened = False

    def text(self) -> str:
        """The families, each GPU a sample; "" where there is no GPU to report."""
        nvml = self._open()
        if nvml is None:
            return ""
        try:
            gpus = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
            uuids = [_label(_text(nvml.nvmlDeviceGetUUID(gpu))) for gpu in gpus]
        except nvml.NVMLError:  # the driver went away: no GPU to report this time
            return ""
        lines = []
        for name, doc, read in READINGS:
            samples = []
            for gpu, uuid in zip(gpus, uuids, strict=True):
                try:
                    value = read(nvml, gpu)
                except nvml.NVMLError:  # NotSupported on this GPU
                    continue
                shown = str(int(value)) if name.endswith("_bytes") else repr(float(value))
                samples.append(f'{name}{{gpu_uuid="{uuid}"}} {shown}')
            if samples:
                # Triton's counter of energy: untyped, as stats.py keeps Triton's counters
                kind = "untyped" if name == "nv_energy_consumption" else "gauge"
                lines += [f"# HELP {name} {doc}", f"# TYPE {name} {kind}", *samples]
        return "".join(f"{line}\n" for line in lines)

    def _open(self) -> Any:
        if not self._opened:
            self._opened = True
            try:
                import pynvml

                pynvml.nvmlInit()
            except Exception:  # no pynvml, no driver, or NVML failing: no GPU metrics
                return None
            self._nvml = pynvml
        return self._nvml


def _label(value: str) -> str:
    """A label value as the text format escapes it."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _text(value: str | bytes) -> str:
    """pynvml gives bytes in its older releases."""
    return value.decode() if isinstance(value, bytes) else value
