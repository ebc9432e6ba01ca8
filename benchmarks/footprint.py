"""Cold start and memory, each measured in a fresh process and printed as one JSON line.

python benchmarks/footprint.py coldstart FUNCTION_DIR   # import / open / load / warm-up seconds
python benchmarks/footprint.py backend MODEL BACKEND PRECISION MAX_BATCH  # RSS of the backend
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def coldstart(function: Path) -> dict[str, float]:
    """The phases `edgeserve serve` goes through before it answers ready."""
    begin = time.perf_counter()
    from edgeserve.builder import open_or_build
    from edgeserve.http.app import create_app  # noqa: F401  (what serve imports too)
    from edgeserve.runtime import Runtime

    imported = time.perf_counter()
    bundle = open_or_build(function)
    opened = time.perf_counter()
    runtime = Runtime.load(bundle)
    loaded = time.perf_counter()
    asyncio.run(runtime.start())
    ready = time.perf_counter()
    return {
        "import_s": imported - begin,
        "open_s": opened - imported,
        "load_s": loaded - opened,
        "warmup_s": ready - loaded,
        "backend": runtime.backend_name,  # type: ignore[dict-item]
    }


def backend(model: Path, name: str, precision: str, max_batch: int) -> dict[str, float]:
    """RSS of a process holding only the backend with the model loaded, after running every
    batch size up to `max_batch` once: the buffers a backend keeps for each batch shape a server
    runs are the backend's footprint, not the server's. Free heap memory is then returned to
    the system, as an idle server does (edgeserve/memory.py)."""
    import numpy as np

    from edgeserve.backends import load_backend
    from edgeserve.memory import trim

    engine = load_backend(name, model, precision=precision)  # type: ignore[arg-type]
    spec = engine.signature.inputs[0]  # type: ignore[attr-defined]
    dims = [1 if d < 0 else d for d in spec.dims]
    dims[-1] = 128 if spec.dims[-1] < 0 else dims[-1]
    for rows in range(1, max_batch + 1):
        engine.infer({spec.name: np.zeros([rows, *dims[1:]], np.float32)})
    trim()
    return {"rss_mb": rss_mb()}


if __name__ == "__main__":
    if sys.argv[1] == "coldstart":
        print(json.dumps(coldstart(Path(sys.argv[2]))))
    else:
        print(json.dumps(backend(Path(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5]))))
