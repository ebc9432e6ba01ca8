"""A stand-in for NVML (nvidia-ml-py's `pynvml`), which cannot exist on a machine without an
NVIDIA driver: two GPUs with fixed readings, the second without power readings (NotSupported,
as on some boards), for the tests of /metrics' nv_gpu_* families (tests/test_gpu_metrics.py).

It answers only the readings: the driver version raises, so edgeserve's device probe
(hardware.probe_gpus) finds no GPU and the function is planned and served on the CPU it has.
"""

from __future__ import annotations

from types import SimpleNamespace

GPUS = [
    {"uuid": "GPU-standin-0", "gpu": 42, "total": 80 * 2**30, "used": 3 * 2**30,
     "power_mw": 215_500, "limit_mw": 700_000, "energy_mj": 9_876_543},
    {"uuid": "GPU-standin-1", "gpu": 7, "total": 16 * 2**30, "used": 2**30},
]  # fmt: skip


class NVMLError(Exception):
    pass


def nvmlInit() -> None:
    pass


def nvmlShutdown() -> None:
    pass


def nvmlSystemGetDriverVersion() -> str:
    raise NVMLError("stand-in NVML: no driver behind it, so no GPU to plan for")


def nvmlDeviceGetCount() -> int:
    return len(GPUS)


def nvmlDeviceGetHandleByIndex(index: int) -> dict:
    return GPUS[index]


def nvmlDeviceGetUUID(gpu: dict) -> str:
    return gpu["uuid"]


def nvmlDeviceGetUtilizationRates(gpu: dict) -> SimpleNamespace:
    return SimpleNamespace(gpu=gpu["gpu"], memory=0)


def nvmlDeviceGetMemoryInfo(gpu: dict) -> SimpleNamespace:
    return SimpleNamespace(total=gpu["total"], used=gpu["used"], free=gpu["total"] - gpu["used"])


def _reading(gpu: dict, key: str) -> int:
    if key not in gpu:
        raise NVMLError("Not Supported")
    return gpu[key]


def nvmlDeviceGetPowerUsage(gpu: dict) -> int:
    return _reading(gpu, "power_mw")


def nvmlDeviceGetEnforcedPowerLimit(gpu: dict) -> int:
    return _reading(gpu, "limit_mw")


def nvmlDeviceGetTotalEnergyConsumption(gpu: dict) -> int:
    return _reading(gpu, "energy_mj")
