"""Stacking a batch beside a busy Python thread: numpy's copies against edgeserve's held ones.

    .venv/bin/python benchmarks/gil_copies.py      # a few seconds; wants 3 free cores

The inference process stacks each batch on its batch thread while its event loop answers the
fronts. numpy lets the GIL go for a large contiguous copy and must get it back afterwards, and
beside a thread busy in Python that takes up to a switch interval (the inference process sets
0.5 ms) per copy. `edgeserve.batching.rows.copy_rows` copies a contiguous part of up to
`HELD_COPY_BYTES` in one memcpy that keeps the GIL (a larger one as numpy does, so ResNet's
row shows the same time twice). The table: the median time to stack 32 one-row parts of each
model's input alone and beside a thread spinning in Python, with numpy's `np.copyto` and with
`copy_rows`.
"""

from __future__ import annotations

import statistics
import sys
import threading
import time
from collections.abc import Callable

import numpy as np

from edgeserve.batching.rows import copy_rows

SWITCH_INTERVAL_S = 0.0005  # as edgeserve.runtime sets it in an inference process on a GPU
SHAPES = {"ResNet-18 [3, 224, 224]": (3, 224, 224), "CRNN [1, 32, 128]": (1, 32, 128)}
ROWS = 32
REPEATS = 40


def stacker(copy: Callable[[np.ndarray, np.ndarray], None], shape: tuple[int, ...]) -> Callable:
    parts = [np.random.default_rng(i).random((1, *shape), np.float32) for i in range(ROWS)]
    batch = np.empty((ROWS, *shape), np.float32)

    def stack() -> None:
        for row, part in enumerate(parts):
            copy(batch[row : row + 1], part)

    return stack


def median_ms(run: Callable[[], None]) -> float:
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def spin(stop: threading.Event) -> None:
    count = 0
    while not stop.is_set():
        count += 1


def numpy_copy(out: np.ndarray, array: np.ndarray) -> None:
    np.copyto(out, array, casting="no")


def main() -> None:
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    rows = []
    for label, shape in SHAPES.items():
        stack_np, stack_held = stacker(numpy_copy, shape), stacker(copy_rows, shape)
        alone = (median_ms(stack_np), median_ms(stack_held))
        stop = threading.Event()
        busy = threading.Thread(target=spin, args=(stop,))
        busy.start()
        try:
            beside = (median_ms(stack_np), median_ms(stack_held))
        finally:
            stop.set()
            busy.join()
        rows.append((label, *alone, *beside))
    print(f"stacking {ROWS} one-row parts, median ms of {REPEATS}")
    print(
        f"{'input':<26}{'alone np':>10}{'alone held':>12}{'busy np':>10}{'busy held':>11}"
        f"{'np / held beside':>18}"
    )
    for label, np_alone, held_alone, np_busy, held_busy in rows:
        print(
            f"{label:<26}{np_alone:>10.2f}{held_alone:>12.2f}{np_busy:>10.2f}{held_busy:>11.2f}"
            f"{np_busy / held_busy:>17.1f}x"
        )


if __name__ == "__main__":
    main()
