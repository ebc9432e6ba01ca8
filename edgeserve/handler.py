"""The function's own handler module (`[handler] module`), imported from a file."""

from __future__ import annotations

import importlib.machinery
import importlib.util
from pathlib import Path
from types import CodeType, ModuleType

from edgeserve.errors import ConfigError


def import_handler(path: Path) -> ModuleType:
    """Import the handler at `path`, with a clear error if it cannot be imported or breaks."""
    name = f"edgeserve_handler_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path, loader=_SourceOnly(name, str(path)))
    if spec is None or spec.loader is None:
        raise ConfigError(f"{path}: cannot be imported as a Python module ([handler] module)")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        raise ConfigError(
            f"{path}: the handler failed to import: {type(exc).__name__}: {exc}"
        ) from exc
    return module


class _SourceOnly(importlib.machinery.SourceFileLoader):
    """Compiles the verified source on every import and reads or writes no bytecode cache: a
    .pyc beside the handler is not covered by the bundle's content hash."""

    def get_code(self, fullname: str) -> CodeType:
        path = self.get_filename(fullname)
        return self.source_to_code(self.get_data(path), path)
