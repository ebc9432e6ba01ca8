"""The most items per second one inference process can take, whatever the model: its ceiling.

    .venv/bin/python benchmarks/inference_ceiling.py build/mlp --shape input:64 [--fronts 4]

Serves the bundle with `edgeserve serve --workers 2` (two fronts, left idle) and connects
`--fronts` stand-in fronts of its own to the inference process's socket, each keeping `--window`
one-item SUBMITs in flight through its own arena, as a real front does (`workers.link`), with
no HTTP in the way. It prints items/s and the inference process's CPU per item: with a model
whose batch takes next to no time (the MLP), that CPU is the per-item price of the control path
(decoding, queueing, answering), the price that bounds a GPU fed one small item per request.
Compare two trees by running each, one after the other, on the same machine.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.append(str(Path(__file__).resolve().parents[1]))

from benchmarks.gpu_sweep import serving
from benchmarks.usage import cpu_seconds
from edgeserve.workers import wire
from edgeserve.workers.arena import Arena, Blocks, block_size
from edgeserve.workers.link import Link

ARENA_BYTES = 64 * 2**20


def socket_of(pid: int) -> str:
    """The inference process's socket, from the config on its command line."""
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    config = json.loads(argv[argv.index(b"-m") + 2])
    return str(Path(config["sockets_dir"]) / "inference-0.sock")


async def front(path: str, number: int, inputs: dict[str, np.ndarray], window: int, stop: float):
    arena, blocks = Arena.create(ARENA_BYTES), Blocks(ARENA_BYTES)
    link = Link(path, 0, 100 + number, arena, lambda offset, size: blocks.free(offset, size))
    link.start()
    await asyncio.wait_for(link.connected.wait(), 30)
    done = 0

    async def one_after_another() -> None:
        nonlocal done
        size = block_size(inputs)
        while time.monotonic() < stop:
            offset = blocks.allocate(size)
            assert offset is not None
            placed = arena.place(inputs, offset, size)
            now = time.monotonic()
            message = (wire.SUBMIT, placed, (offset, size), now + 30, now, None)
            await link.ask(message, offset, size)
            done += 1

    await asyncio.gather(*(one_after_another() for _ in range(window)))
    link.stop()
    return done


async def drive(path: str, inputs: dict[str, np.ndarray], fronts: int, window: int, s: float):
    stop = time.monotonic() + s
    counts = await asyncio.gather(*(front(path, i, inputs, window, stop) for i in range(fronts)))
    return sum(counts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle")
    parser.add_argument("--shape", required=True, help="NAME:D1,D2 of one item (no batch axis)")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--fronts", type=int, default=4)
    parser.add_argument("--window", type=int, default=16, help="items in flight per front")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    name, dims = args.shape.split(":")
    shape = (1, *(int(d) for d in dims.split(",")))
    inputs = {name: np.random.default_rng(0).random(shape).astype(args.dtype)}
    model = Path(args.bundle).name
    rows = []
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(serving(args.bundle, model, "2", set(), Path("/dev/null")))
        (pid,) = server.pids("inference")
        path = socket_of(pid)
        asyncio.run(drive(path, inputs, args.fronts, args.window, 1.0))  # warm up
        for _ in range(args.runs):
            cpu, started = cpu_seconds(pid), time.monotonic()
            items = asyncio.run(drive(path, inputs, args.fronts, args.window, args.seconds))
            wall = time.monotonic() - started
            used = cpu_seconds(pid) - cpu
            rows.append((items / wall, used / items * 1e6, used / wall))
            print(
                f"items/s {rows[-1][0]:8.0f}  inference us/item {rows[-1][1]:6.1f}  "
                f"inference cores {rows[-1][2]:.2f}",
                flush=True,
            )
    print(
        f"median: items/s {statistics.median(r[0] for r in rows):.0f}, "
        f"inference us/item {statistics.median(r[1] for r in rows):.1f}"
    )


if __name__ == "__main__":
    main()
