"""The process layout: how many front processes, and which inference processes on which devices.

`workers` counts front processes. 1 is today's single process (HTTP, handler and batcher on
one event loop, inference on its threads); N > 1 is N fronts, fed connections by the supervisor,
and inference processes, each owning its backend and its batcher on one device. `auto` decides
the fronts from the machine (cores: this process's CPU affinity, cut to its cgroup's CPU quota):

- up to 2 usable cores: 1. Measured on 2 cores (docs/performance.md, "Process layout"): the
  fronts and the inference process then fight over the same two cores that inference itself
  wants, and every request pays the hand-off between processes on top.
- inference on a GPU: cores - 1 - (inference processes) fronts (up to 16): each inference
  process needs about one core to feed its GPU, one is left for the system and the hand-offs.
- inference on the CPU: three quarters of the cores (at least 2, up to 16). A front waits on
  the inference processes most of the time, so more fronts cost memory, not cores: on 16
  cores, functions/ocr served 736 pages/s with 12 fronts against 597 with 8, both feeding
  eight inference processes (benchmarks/RESULTS-gpu.md, sixth session).

The inference processes follow Triton's instance_group: `[resources] devices` "auto" is one per
visible GPU (CUDA_VISIBLE_DEVICES counts, as it does for CUDA), or the CPU without a GPU; "cpu"
or a list of GPU indices restrict it. `processes_per_device` sets how many run on each device,
or on each kind of device as { gpu = N, cpu = M }. `auto` is one per GPU: a model that keeps
the GPU busy loses with two (ResNet-18-shaped: -10 to -22%), while a light one gains (the CRNN
+14 to +80%, functions/ocr +28%, RESULTS-gpu.md eleventh session), so a function says so
itself (functions/ocr: { gpu = 2 }) or `edgeserve tune --processes-per-device` measures it. On
the CPU `auto` is one per two cores (up to 16), each running its backend on cores / N threads
(`cpu_threads`) unless [backend] threads says otherwise. One process running every core's
threads ran one batch at a time with most cores waiting on its thread pool; on 16 cores, eight
processes of two threads served functions/ocr 736 pages/s against 453 for one of sixteen,
under 12 fronts (RESULTS-gpu.md, sixth session). Each GPU process sees only its GPU (its own
CUDA_VISIBLE_DEVICES), so nothing of it lands on another. `EDGESERVE_DEVICE` (cpu, cuda:N)
still forces the one device it names. A GPU counts only where the chosen backend can use it
(`backends.as_reached`: not with ONNX Runtime's CPU wheel, nor OpenVINO).

`EDGESERVE_WORKERS` overrides the manifest's [resources] workers, and `serve --workers` both.
`EDGESERVE_CORES` caps the cores counted (`usable_cores`).
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from edgeserve.backends import DEVICE_VAR, cuda_index
from edgeserve.errors import ConfigError
from edgeserve.hardware import Platform
from edgeserve.manifest import PerDeviceKind

ENV = "EDGESERVE_WORKERS"
CORES_VAR = "EDGESERVE_CORES"
VISIBLE_VAR = "CUDA_VISIBLE_DEVICES"
MAX_AUTO_FRONTS = 16
MAX_AUTO_CPU_PROCESSES = 16
CORES_PER_CPU_PROCESS = 2
Devices = Literal["auto", "cpu"] | tuple[int, ...]
"""[resources] devices: "auto", "cpu", or GPU indices (among the visible ones)."""
PerDevice = int | Literal["auto"] | PerDeviceKind
"""[resources] processes_per_device: a count, "auto" (see the module), or either by kind of
device ({ gpu = 2 }: two per GPU, "auto" on the CPU)."""


@dataclass(frozen=True)
class Instance:
    """One inference process: its device as this server counts it ("cpu", "cuda:N") and, on a
    GPU, the CUDA_VISIBLE_DEVICES entry that makes that GPU the only one it sees."""

    device: str = "cpu"
    visible: str | None = None

    def env(self) -> dict[str, str]:
        """What the process's environment adds: its one device."""
        if self.visible is None:
            return {DEVICE_VAR: "cpu"}
        return {VISIBLE_VAR: self.visible, DEVICE_VAR: "cuda:0"}


@dataclass(frozen=True)
class Layout:
    fronts: int
    reason: str
    instances: tuple[Instance, ...] = (Instance(),)
    cpu_threads: int = 0
    """Backend threads of each inference process on the CPU (0: the backend's default)."""

    @property
    def single(self) -> bool:
        return self.fronts == 1 and len(self.instances) == 1

    @property
    def devices(self) -> list[str]:
        return [instance.device for instance in self.instances]

    @property
    def kind(self) -> Literal["gpu", "cpu"]:
        """The kind of device inference runs on (the key of a per-kind processes_per_device)."""
        return "cpu" if self.instances[0].device == "cpu" else "gpu"

    @property
    def placement(self) -> str:
        """Where the inference processes run, counted: "8 x cpu", "cuda:0, cuda:1"."""
        return _placement(self.instances)


def choose_layout(
    setting: int | str,
    platform: Platform,
    cores: int,
    devices: Devices = "auto",
    per_device: PerDevice = "auto",
    env: Mapping[str, str] = os.environ,
) -> Layout:
    """The fronts for `setting` (a count or "auto") and the inference processes for `devices`
    and `per_device` on this machine, and why. One front and nothing asked of the devices is
    the single process (on the first device), as before inference processes existed."""
    instances = choose_instances(devices, per_device, platform, env, cores)
    fronts, reason = _fronts(setting, instances, cores)
    on = for_kind(per_device, "cpu" if instances[0].device == "cpu" else "gpu")
    if fronts == 1 and devices == "auto" and on in (1, "auto"):
        instances = instances[:1]
    on_cpu = sum(instance.device == "cpu" for instance in instances)
    threads = max(1, cores // on_cpu) if on_cpu > 1 else 0  # their share of the cores
    shared = f", {threads} threads each" if threads else ""
    return Layout(
        fronts, f"{reason}; inference on {_placement(instances)}{shared}", instances, threads
    )


def _placement(instances: Sequence[Instance]) -> str:
    counts = Counter(instance.device for instance in instances)
    return ", ".join(f"{n} x {device}" if n > 1 else device for device, n in counts.items())


def choose_instances(
    devices: Devices,
    per_device: PerDevice,
    platform: Platform,
    env: Mapping[str, str],
    cores: int,
) -> tuple[Instance, ...]:
    """`per_device` inference processes on each device `devices` names (see the module)."""
    visible, source = visible_gpus(platform, env), "[resources] devices"
    if forced := env.get(DEVICE_VAR, "").strip():
        index = cuda_index(forced)
        devices, source = "cpu" if index is None else (index,), f"{DEVICE_VAR}={forced}"
    if isinstance(devices, tuple):
        indices: Sequence[int] = devices
    elif devices == "cpu" or not visible:
        return (Instance(),) * _cpu_processes(for_kind(per_device, "cpu"), cores)
    else:
        indices = range(len(visible))
    on_gpu = for_kind(per_device, "gpu")
    count = 1 if on_gpu == "auto" else on_gpu
    chosen = [Instance(f"cuda:{i}", _visible(visible, i, source)) for i in indices]
    return tuple(instance for instance in chosen for _ in range(count))


def for_kind(per_device: PerDevice, kind: Literal["gpu", "cpu"]) -> int | Literal["auto"]:
    """The count `per_device` sets for inference processes on a `kind` device."""
    return getattr(per_device, kind) if isinstance(per_device, PerDeviceKind) else per_device


def _cpu_processes(per_device: int | Literal["auto"], cores: int) -> int:
    if per_device != "auto":
        return per_device
    return min(max(1, cores // CORES_PER_CPU_PROCESS), MAX_AUTO_CPU_PROCESSES)


def visible_gpus(platform: Platform, env: Mapping[str, str]) -> list[str]:
    """The GPUs CUDA will show this server, as CUDA_VISIBLE_DEVICES entries (indices or UUIDs);
    NVML, which found them, ignores that variable."""
    if not platform.has_cuda:
        return []
    if VISIBLE_VAR in env:
        return [entry.strip() for entry in env[VISIBLE_VAR].split(",") if entry.strip()]
    if platform.jetson is not None:
        return ["0"]  # one integrated GPU, which NVML does not list
    return [str(gpu.index) for gpu in platform.gpus]


def _visible(visible: list[str], index: int, source: str) -> str:
    if index >= len(visible):
        raise ConfigError(
            f"{source}: GPU {index} is not visible here; this machine shows {len(visible)} "
            f"GPU(s) that the backend can use{f' (0..{len(visible) - 1})' if visible else ''}. "
            'Hint: list only those, or write "auto"'
        )
    return visible[index]


def _fronts(setting: int | str, instances: Sequence[Instance], cores: int) -> tuple[int, str]:
    if setting != "auto":
        count = _count(setting)
        return count, f"workers = {count} (asked)"
    if cores <= 2:
        return 1, f"auto: {cores} cores: one process (measured best on 2 cores)"
    if any(instance.device != "cpu" for instance in instances):
        fronts = min(max(1, cores - 1 - len(instances)), MAX_AUTO_FRONTS)
        return fronts, f"auto: {cores} cores and a GPU: {fronts} fronts"
    fronts = min(max(2, cores - cores // 4), MAX_AUTO_FRONTS)
    return fronts, f"auto: {cores} cores, no GPU in use: {fronts} fronts (three quarters)"


def workers_setting(cli: str | None, manifest: int | str) -> int | str:
    """`--workers`, else EDGESERVE_WORKERS, else the manifest's value."""
    return cli or os.environ.get(ENV) or manifest


def usable_cores(
    cgroup: Path = Path("/sys/fs/cgroup/cpu.max"), env: Mapping[str, str] = os.environ
) -> int:
    """Cores this process may use: its CPU affinity, cut to its cgroup's CPU quota (a container
    limited to 2 CPUs on a 64-core node sees 64 in its affinity) and to EDGESERVE_CORES (what
    the Kubernetes manifests set from the pod's CPU request: a pod that asks for one core and
    sets no limit would otherwise plan its processes, and their memory, for the whole node)."""
    cores = len(os.sched_getaffinity(0))
    try:
        quota = quota_cores(cgroup.read_text())
    except OSError:
        quota = None
    cores = min(cores, quota) if quota else cores
    return min(cores, _cores_setting(env)) if env.get(CORES_VAR) else cores


def _cores_setting(env: Mapping[str, str]) -> int:
    try:
        count = int(env[CORES_VAR])
    except ValueError:
        count = 0
    if count < 1:
        raise ConfigError(f"{CORES_VAR}: expected a count of cores >= 1, got {env[CORES_VAR]!r}")
    return count


def quota_cores(cpu_max: str) -> int | None:
    """Whole cores of a cgroup v2 `cpu.max` ("200000 100000": 2; "max 100000": no limit)."""
    quota, _, period = cpu_max.strip().partition(" ")
    if quota == "max" or not period:
        return None
    return max(1, int(quota) // int(period))


def _count(setting: int | str) -> int:
    try:
        count = int(setting)
    except ValueError:
        count = 0
    if count < 1:
        raise ConfigError(
            f"workers: expected `auto` or a count >= 1, got {setting!r} "
            f"(from --workers, {ENV} or [resources] workers)"
        )
    return count
