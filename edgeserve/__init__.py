"""edgeserve: one ONNX model as one self-contained, batched HTTP function."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("edgeserve")
except PackageNotFoundError:  # pragma: no cover - running from a checkout without install
    __version__ = "0.0.0"

__all__ = ["__version__"]
