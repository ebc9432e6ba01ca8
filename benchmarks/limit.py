"""The limit: a backend's best in-process throughput over batch sizes (no HTTP, no batcher).

Each size runs back-to-back `infer` calls on one thread for a short window after one warm-up
call; the limit of a backend is the best items/s over the sizes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgeserve.backends import load_backend

SIZES = (1, 2, 4, 8, 16, 32)


@dataclass(frozen=True)
class LimitRow:
    model: str
    backend: str
    precision: str
    by_size: dict[int, float]  # batch size -> items/s
    cpu_us: dict[int, float]  # batch size -> CPU microseconds (all threads) per item

    @property
    def best(self) -> tuple[int, float]:
        size = max(self.by_size, key=lambda b: self.by_size[b])
        return size, self.by_size[size]


def measure_limit(
    model: str, path: Path, shape: tuple[int, ...], backend: str, precision: str, window_s: float
) -> LimitRow:
    engine = load_backend(backend, path, precision=precision)  # type: ignore[arg-type]
    name = engine.signature.inputs[0].name  # type: ignore[attr-defined]
    rng = np.random.default_rng(0)
    by_size, cpu_us = {}, {}
    for size in SIZES:
        x = {name: rng.random((size, *shape), dtype=np.float32)}
        engine.infer(x)
        calls, start, cpu = 0, time.perf_counter(), time.process_time()
        while (elapsed := time.perf_counter() - start) < window_s or calls < 2:
            engine.infer(x)
            calls += 1
        by_size[size] = calls * size / elapsed
        cpu_us[size] = (time.process_time() - cpu) / (calls * size) * 1e6
    engine.close()
    return LimitRow(model, backend, precision, by_size, cpu_us)


def output_difference(path: Path, shape: tuple[int, ...], rows: int = 8) -> float:
    """Max abs difference of OpenVINO `auto` (bf16 where the CPU has it) against fp32."""
    rng = np.random.default_rng(1)
    outputs = []
    for precision in ("fp32", "auto"):
        engine = load_backend("openvino", path, precision=precision)  # type: ignore[arg-type]
        name = engine.signature.inputs[0].name  # type: ignore[attr-defined]
        x = {name: np.random.default_rng(1).random((rows, *shape), dtype=np.float32)}
        outputs.append(next(iter(engine.infer(x).values())))
        engine.close()
    del rng
    return float(np.abs(outputs[0] - outputs[1]).max())
