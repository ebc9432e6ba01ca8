"""The backends as an ordered table, the choice between them, and loading the chosen one.

Each backend class declares itself once: its `name`, the pip `package` a bundle pins for it, the
`platforms` it suits (target platforms and machine kinds), its Triton names, the files it has
`prepare`d in the bundle at build, whether it `differs` from ONNX Runtime's answers on the model
(build then plans past it), and (on each loaded instance) the batch `buckets` it warms.
Every list of backends elsewhere is derived from `BACKENDS`, whose order is the preference.

Choosing, in order: an explicit override (the CLI flag) > the `EDGESERVE_BACKEND` variable > the
manifest's `prefer` list, where backends that suit the platform come first (Jetson and NVIDIA GPU:
tensorrt, then onnxruntime with CUDA; CPU: openvino, then onnxruntime) and the others are kept as a
last resort. Every backend that was tried and refused is recorded with the reason, for `doctor`.
Importing this package imports no engine: each backend imports its library when it loads.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

from edgeserve import hardware
from edgeserve.backends.onnxruntime import OnnxRuntime
from edgeserve.backends.openvino import OpenVINO
from edgeserve.backends.options import LoadOptions, Precision, TritonNames, cuda_index
from edgeserve.backends.tensorrt import TensorRT
from edgeserve.errors import BackendError, ConfigError, did_you_mean
from edgeserve.hardware import Platform
from edgeserve.manifest import ModelSection
from edgeserve.shapes import ShapeProfile
from edgeserve.types import Backend, Signature


class BackendClass(Protocol):
    """What the table knows of a backend class (see the module docstring)."""

    name: str
    package: str | None
    platforms: tuple[str, ...]
    triton: TritonNames
    prepared: tuple[str, ...]
    modules: dict[str, str]  # the Python modules it imports -> how to install each
    int_range: tuple[int, int] | None  # INT64/UINT64 input values it computes exactly; None: all
    optional_inputs: bool  # whether it takes an optional input sent (else: the model's default)

    def available(self, platform: Platform) -> str | None: ...

    def declines(self, signature: Signature, model: Path) -> str | None: ...

    def differs(self, model: Path, signature: Signature) -> str | None: ...

    def reaches_gpu(self, platform: Platform) -> bool: ...

    def prepare(self, model_path: Path, bundle: Path) -> None: ...

    def __call__(self, model_path: Path, options: LoadOptions) -> Backend: ...


BACKENDS: list[BackendClass] = [TensorRT, OpenVINO, OnnxRuntime]
BY_NAME = {backend.name: backend for backend in BACKENDS}
MODULES = tuple(dict.fromkeys(module for backend in BACKENDS for module in backend.modules))
"""Every Python module a backend of the table needs: what `probe` looks for."""
ENV_VAR = "EDGESERVE_BACKEND"


def probe(root: Path = Path("/"), nvml: bool = True) -> Platform:
    """The machine (hardware.probe), with which of the backends' modules are installed."""
    return hardware.probe(root, nvml, modules=MODULES)


def suited(platform: str) -> tuple[str, ...]:
    """The backends suited to a target platform or machine kind, best first."""
    return tuple(backend.name for backend in BACKENDS if platform in backend.platforms)


@dataclass(frozen=True)
class Choice:
    """The backend to use, why, and every (name, why not) tried before it."""

    name: str
    reason: str
    rejected: tuple[tuple[str, str], ...] = ()


def choose(platform: Platform, prefer: Sequence[str] = (), override: str | None = None) -> Choice:
    """Pick the backend for this platform (see the module docstring); no `prefer`: any backend."""
    if override:
        return _forced(platform, override, "the explicit override")
    if env := forced(None):
        return _forced(platform, env, f"{ENV_VAR}={env}")
    fitting = suited(platform.kind)
    prefer = prefer or tuple(BY_NAME)
    ordered = [n for n in prefer if n in fitting] + [n for n in prefer if n not in fitting]
    rejected: list[tuple[str, str]] = []
    for name in ordered:
        why_not = _backend(name, "[backend] prefer").available(platform)
        if why_not is None:
            return Choice(name, _reason(name, platform, prefer, fitting), tuple(rejected))
        rejected.append((name, why_not))
    tried = "; ".join(f"{name}: {why}" for name, why in rejected)
    raise BackendError(
        f"no usable backend on this {platform.kind} machine for [backend] prefer = {list(prefer)}: "
        f"{tried}. Hint: `edgeserve doctor` shows what this machine has."
    )


def forced(override: str | None, platform: Platform | None = None) -> str | None:
    """The backend forced on `choose`: `override`, else $EDGESERVE_BACKEND; building a source
    for serve plans it alone. With `platform`, only one that can run there: doctor leaves one
    that cannot to its backend row, which says why, and builds as it would otherwise."""
    name = override or os.environ.get(ENV_VAR, "").strip() or None
    if platform is None or name is None:
        return name
    known = BY_NAME.get(name)
    return name if known is not None and known.available(platform) is None else None


def _reason(name: str, platform: Platform, prefer: Sequence[str], fitting: Sequence[str]) -> str:
    if name in fitting:
        return f"first usable of {list(prefer)} (manifest) suited to a {platform.kind} platform"
    return f"no backend suited to a {platform.kind} platform ({', '.join(fitting)}) is usable"


def _forced(platform: Platform, name: str, source: str) -> Choice:
    backend = _backend(name, source)
    why_not = backend.available(platform)
    if why_not is not None:
        usable = [b.name for b in BACKENDS if b.available(platform) is None]
        raise ConfigError(
            f"backend {name!r} (from {source}) cannot run here: {why_not}. "
            f"Usable on this {platform.kind} machine: {usable or 'none'}"
        )
    return Choice(name, f"set by {source}")


def _backend(name: str, source: str) -> BackendClass:
    try:
        return BY_NAME[name]
    except KeyError:
        raise ConfigError(
            f"backend {name!r} (from {source}): unknown; expected one of {sorted(BY_NAME)}"
            f"{did_you_mean(name, BY_NAME)}"
        ) from None


DEVICE_VAR = "EDGESERVE_DEVICE"


def as_reached(platform: Platform, choice: Choice) -> Platform:
    """The machine as the chosen backend can use it: without its GPUs where the backend cannot
    reach them (ONNX Runtime's CPU wheel on a GPU host), so nothing plans a process per GPU that
    would only run on the CPU."""
    if not platform.has_cuda or BY_NAME[choice.name].reaches_gpu(platform):
        return platform
    return replace(platform, kind="cpu", gpus=(), jetson=None)


def default_device(platform: Platform) -> str:
    """The device a backend should use here: `EDGESERVE_DEVICE` (cpu, cuda:N) when set, else the
    first CUDA device, or the CPU (set it to `cpu` to measure the CPU provider on a GPU host)."""
    if configured := os.environ.get(DEVICE_VAR, "").strip():
        cuda_index(configured)  # refuses a malformed value
        return configured
    return "cuda:0" if platform.has_cuda else "cpu"


def load_backend(
    name: str,
    model_path: Path,
    *,
    signature: Signature | None = None,
    prepared: Path | None = None,
    precision: Precision = "fp32",
    threads: int = 0,
    instances: int = 1,
    device: str = "cpu",
    profile: ShapeProfile | None = None,
    cache_dir: Path | None = None,
    buckets: bool | None = None,
    cuda_graphs: bool = False,
    shares_cpu: bool = False,
) -> Backend:
    """Load `model_path` (ONNX) into the named backend, with the bundle's `signature` (read from
    the model only when there is no bundle) and what the backend `prepared` in it."""
    backend = _backend(name, "load_backend")
    if signature is None:
        from edgeserve.signature import read_signature

        signature = read_signature(model_path, ModelSection())
    options = LoadOptions(
        signature,
        precision,
        threads,
        instances,
        device,
        profile,
        prepared,
        cache_dir,
        buckets,
        cuda_graphs,
        shares_cpu,
    )
    return backend(model_path, options)


__all__ = [
    "BACKENDS",
    "BY_NAME",
    "Choice",
    "LoadOptions",
    "TritonNames",
    "choose",
    "default_device",
    "load_backend",
    "suited",
]
