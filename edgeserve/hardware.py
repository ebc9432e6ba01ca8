"""What this machine is (a Jetson, a host with NVIDIA GPUs, or a CPU) and which backends import.

Jetson is recognised from files (device tree, /etc/nv_tegra_release), never through NVML, which
JetPack does not support. GPUs elsewhere are listed through NVML (`pynvml`, imported lazily: any
failure means "no GPU"). Backend modules are looked up with `find_spec`, not imported, so a probe
stays cheap. Every file is read below `root`, so tests point it at fixture trees.
"""

from __future__ import annotations

import importlib.util
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from edgeserve.backends import Choice

PlatformKind = Literal["jetson", "nvidia-gpu", "cpu"]

CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16", "asimd")
"""CPU features that change what a backend does (OpenVINO picks bf16 on AMX / AVX512-BF16)."""

OWN_MODULES = ("pynvml",)
"""Python modules the probe itself uses (NVML, for the GPUs). The modules each backend needs are
declared by the backend (edgeserve.backends.MODULES) and passed to `probe`."""

ARM_CORES = {("0x41", "0xd42"): "ARM Cortex-A78AE", ("0x4e", "0x004"): "NVIDIA Carmel"}
"""(CPU implementer, CPU part) -> core: Arm's /proc/cpuinfo has no model name (Orin, Xavier)."""

JETSON_SOCS = {"tegra194": (7, 2), "tegra234": (8, 7), "tegra264": (11, 0)}
"""Device-tree SoC -> CUDA compute capability (Xavier, Orin, Thor)."""

_SOC_COMPATIBLES = {f"nvidia,{soc}" for soc in JETSON_SOCS}

L4T_TO_JETPACK = {
    "39.2.0": "7.2",
    "39.0.0": "7.2 EA",
    "38.4.0": "7.1",
    "38.2": "7.0",
    "36.5.0": "6.2.2",
    "36.4.7": "6.2.1",
    "36.4.4": "6.2.1",
    "36.4.3": "6.2",
    "36.4.2": "6.1 rev1",
    "36.4.0": "6.1",
    "36.3.0": "6.0",
    "36.2.0": "6.0 DP",
    "35.6.0": "5.1.4",
    "35.5.0": "5.1.3",
    "35.4.1": "5.1.2",
    "35.3.1": "5.1.1",
    "35.2.1": "5.1",
    "35.1.0": "5.0.2",
}
"""L4T release -> JetPack (jetson_stats' table); a key of two parts matches any patch release."""

_RELEASE = re.compile(r"#\s*R(\d+)\s*\(release\),\s*REVISION:\s*(\d+)\.(\d+)")


@dataclass(frozen=True)
class Cpu:
    model: str
    cores: int
    flags: frozenset[str]


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    compute_capability: tuple[int, int]
    memory_bytes: int
    driver: str


@dataclass(frozen=True)
class Jetson:
    model: str
    soc: str | None
    compute_capability: tuple[int, int] | None
    l4t: str | None
    jetpack: str | None


@dataclass(frozen=True)
class Platform:
    kind: PlatformKind
    cpu: Cpu
    gpus: tuple[Gpu, ...]
    jetson: Jetson | None
    modules: frozenset[str]

    @property
    def has_cuda(self) -> bool:
        return self.kind in ("jetson", "nvidia-gpu")


def probe(root: Path = Path("/"), nvml: bool = True, modules: Sequence[str] = ()) -> Platform:
    """Look at the machine; `nvml=False` skips the NVML query (a Jetson never makes it).
    `Platform.modules`: which of `modules` (and OWN_MODULES) are installed."""
    jetson = probe_jetson(root)
    gpus = probe_gpus() if nvml and jetson is None else ()
    kind: PlatformKind = "jetson" if jetson else "nvidia-gpu" if gpus else "cpu"
    return Platform(kind, probe_cpu(root), gpus, jetson, probe_modules((*modules, *OWN_MODULES)))


def probe_cpu(root: Path) -> Cpu:
    """Model name, logical cores and flags of interest from /proc/cpuinfo (x86 or Arm layout)."""
    fields: dict[str, str] = {}
    cores = 0
    for line in _read(root / "proc/cpuinfo").splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        cores += key == "processor"
        fields.setdefault(key, value.strip())
    flags = set((fields.get("flags") or fields.get("Features") or "").split())
    arm_core = ARM_CORES.get((fields.get("CPU implementer", ""), fields.get("CPU part", "")))
    model = fields.get("model name") or arm_core or fields.get("CPU part") or "unknown"
    return Cpu(model, cores or os.cpu_count() or 1, frozenset(flags.intersection(CPU_FLAGS)))


def probe_jetson(root: Path) -> Jetson | None:
    """A Jetson if the device tree names one or L4T's release file exists; else None."""
    model = _device_tree(root, "model").rstrip("\x00").strip()
    compatible = _device_tree(root, "compatible").split("\x00")
    release = _read(root / "etc/nv_tegra_release")
    soc = next((name.split(",")[1] for name in compatible if name in _SOC_COMPATIBLES), None)
    if "Jetson" not in model and soc is None and not release:
        return None
    l4t = parse_l4t(release)
    jetpack = jetpack_for(l4t) if l4t else None
    return Jetson(model or "unknown Jetson", soc, JETSON_SOCS.get(soc or ""), l4t, jetpack)


def parse_l4t(text: str) -> str | None:
    """'# R36 (release), REVISION: 4.3, GCID: ...' -> '36.4.3'."""
    match = _RELEASE.search(text)
    return ".".join(match.groups()) if match else None


def jetpack_for(l4t: str) -> str | None:
    major_minor = ".".join(l4t.split(".")[:2])
    return L4T_TO_JETPACK.get(l4t) or L4T_TO_JETPACK.get(major_minor)


def probe_gpus() -> tuple[Gpu, ...]:
    """NVIDIA GPUs through NVML; no pynvml, no driver or any NVML error means none."""
    try:
        import pynvml
    except ImportError:
        return ()
    try:
        pynvml.nvmlInit()
    except Exception:  # NVMLError_LibraryNotFound / DriverNotLoaded / NoPermission ...
        return ()
    try:
        driver = str(pynvml.nvmlSystemGetDriverVersion())
        return tuple(_gpu(pynvml, i, driver) for i in range(pynvml.nvmlDeviceGetCount()))
    except Exception:
        return ()
    finally:
        pynvml.nvmlShutdown()


def _gpu(nvml: Any, index: int, driver: str) -> Gpu:
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    major, minor = nvml.nvmlDeviceGetCudaComputeCapability(handle)
    try:
        memory = int(nvml.nvmlDeviceGetMemoryInfo(handle).total)
    except nvml.NVMLError:  # NotSupported on integrated GPUs
        memory = 0
    return Gpu(index, str(nvml.nvmlDeviceGetName(handle)), (major, minor), memory, driver)


def probe_modules(names: Sequence[str]) -> frozenset[str]:
    """Which of `names` are installed, found without importing them."""
    return frozenset(name for name in names if _findable(name))


def _findable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a missing parent package of a dotted name
        return False


def _device_tree(root: Path, name: str) -> str:
    """/proc/device-tree is a link to /sys/firmware/devicetree/base; either may be mounted alone."""
    return _read(root / "proc/device-tree" / name) or _read(
        root / "sys/firmware/devicetree/base" / name
    )


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def describe(platform: Platform, choice: Choice) -> list[tuple[str, str]]:
    """Rows of (what, value) for `edgeserve doctor`: the probe, then the choice and why."""
    cpu = platform.cpu
    rows = [
        ("platform", platform.kind),
        ("cpu", f"{cpu.model}, {cpu.cores} cores, flags: {' '.join(sorted(cpu.flags)) or '-'}"),
    ]
    for gpu in platform.gpus:
        major, minor = gpu.compute_capability
        memory = f"{gpu.memory_bytes / 2**30:.1f} GiB"
        rows.append(
            (f"gpu {gpu.index}", f"{gpu.name}, sm {major}.{minor}, {memory}, driver {gpu.driver}")
        )
    if platform.jetson:
        rows.extend(_jetson_rows(platform.jetson))
    rows.append(("python modules", ", ".join(sorted(platform.modules)) or "-"))
    rows.append(("backend", choice.name))
    rows.append(("why", choice.reason))
    rows.extend((f"not {name}", why) for name, why in choice.rejected)
    return rows


def _jetson_rows(jetson: Jetson) -> list[tuple[str, str]]:
    sm = ".".join(map(str, jetson.compute_capability)) if jetson.compute_capability else "?"
    return [
        ("jetson", f"{jetson.model} ({jetson.soc or 'unknown SoC'}, sm {sm})"),
        ("L4T / JetPack", f"{jetson.l4t or 'unknown'} / {jetson.jetpack or 'unknown'}"),
    ]
