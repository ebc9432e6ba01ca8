"""edgeserve: one ONNX model as one self-contained, batched HTTP function.

The public API, the same verbs as the command line:

    bundle = edgeserve.build(Path("functions/ocr"), Path("build/ocr"))
    edgeserve.serve(Path("build/ocr"), port=8080)            # blocks until SIGTERM
    result = edgeserve.deploy(Path("build/ocr"), "jetson")   # ships, health-checks, rolls back

    runtime = edgeserve.Runtime.load(edgeserve.Bundle.open(path))   # in-process, no HTTP
    await runtime.start(); outputs = await runtime.infer({"x": array}); await runtime.stop()

Everything else is internal. Names load on first use, so `edgeserve --help` and a CPU Lambda
pay only for what they touch.
"""

import importlib as _importlib
import typing as _typing
from importlib import metadata as _metadata

from edgeserve.errors import (
    BackendError,
    BundleError,
    ConfigError,
    DeadlineExceeded,
    DeployError,
    EdgeserveError,
    InvalidInput,
    ModelNotFound,
    ModelRefused,
    PayloadTooLarge,
    Unavailable,
)

if _typing.TYPE_CHECKING:
    from edgeserve.builder import build
    from edgeserve.bundle import Bundle
    from edgeserve.runtime import Runtime
    from edgeserve.server import serve
    from edgeserve.targets import DeployResult, deploy

try:
    __version__ = _metadata.version("edgeserve")
except _metadata.PackageNotFoundError:  # pragma: no cover - running from a checkout without install
    __version__ = "0.0.0"

_LAZY = {
    "Bundle": "edgeserve.bundle",
    "DeployResult": "edgeserve.targets",
    "Runtime": "edgeserve.runtime",
    "build": "edgeserve.builder",
    "deploy": "edgeserve.targets",
    "serve": "edgeserve.server",
}
"""Public name -> the module defining it, imported on first access."""

__all__ = [
    "BackendError",
    "Bundle",
    "BundleError",
    "ConfigError",
    "DeadlineExceeded",
    "DeployError",
    "DeployResult",
    "EdgeserveError",
    "InvalidInput",
    "ModelNotFound",
    "ModelRefused",
    "PayloadTooLarge",
    "Runtime",
    "Unavailable",
    "__version__",
    "build",
    "deploy",
    "serve",
]


def __getattr__(name: str) -> _typing.Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'edgeserve' has no attribute {name!r}")
    value = getattr(_importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
