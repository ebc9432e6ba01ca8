"""Where the served limit is: perf_analyzer (C++) as the load, CPU per process, py-spy.

For each benchmark model (benchmarks/models.py) and each `--workers` setting, `edgeserve serve`
runs on its own cores (`--client-cores` keeps the first cores for the load generator) and
NVIDIA's perf_analyzer drives it at each concurrency: HTTP binary tensors, or system / CUDA
shared memory. Each level records the items/s, latency, the server's mean batch and compute
per batch, the cores used by the inference process, the fronts (all, and the busiest) and the
load generator, the machine's busy cores and the GPU's utilization. `--profile` records py-spy
of the inference process and of one front under the heaviest level, and `--bench` runs
`edgeserve bench --processes 4` at the same level for comparison with the Python load.

    python benchmarks/gpu_sweep.py WORK --out DIR [--models resnet,crnn] [--workers 4,8,14]
        [--concurrency 16,64,128] [--shm system,cuda] [--client-cores 2] [--profile] [--bench]
        [--per-device auto,1,2]

`--per-device` serves each setting with that many inference processes per device (a copy of
the function with `[resources] processes_per_device` set; without it, the function's own
setting, such as functions/ocr's `{ gpu = 2 }`; `serve` gives N processes on the CPU
cores / N backend threads each).

perf_analyzer comes from tritonclient 2.41.0 (libcudart.so.12 and libb64 on LD_LIBRARY_PATH).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import product
from pathlib import Path
from typing import Any

import httpx

sys.path.append(str(Path(__file__).resolve().parents[1]))

from benchmarks.models import BENCH_SHAPES, with_processes, write_function
from benchmarks.usage import (
    GpuSampler,
    children,
    children_cpu,
    cpu_seconds,
    machine_busy,
    print_table,
    summarize,
)
from edgeserve.bench.measure import server_delta
from edgeserve.builder import build

RATE = 200
PA_WINDOW = ["--measurement-interval", "2000", "--stability-percentage", "50", "--max-trials", "6"]


@dataclass
class Server:
    process: subprocess.Popen[bytes]
    url: str
    model: str
    roles: dict[int, str] = field(default_factory=dict)

    @property
    def host_port(self) -> str:
        return self.url.removeprefix("http://")

    def pids(self, role: str) -> list[int]:
        return [pid for pid, r in self.roles.items() if r == role]

    def stats(self) -> dict[str, Any]:
        return httpx.get(f"{self.url}/v2/models/{self.model}/stats", timeout=10).json()


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def serving(bundle: str, model: str, workers: str, cores: set[int], log: Path) -> Iterator[Server]:
    port = free_port()
    command = [sys.executable, "-m", "edgeserve", "serve", bundle, "--port", str(port)]
    with log.open("ab") as sink:
        process = subprocess.Popen(
            [*command, "--workers", workers, "--log-level", "warning"],
            stdout=sink,
            stderr=subprocess.STDOUT,
            preexec_fn=(lambda: os.sched_setaffinity(0, cores)) if cores else None,
        )
    server = Server(process, f"http://127.0.0.1:{port}", model)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"server exited {process.returncode}; see {log}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{server.url}/v2/health/ready", timeout=2).status_code == 200:
                    break
            time.sleep(0.2)
        else:
            raise RuntimeError(f"server not ready in 300 s; see {log}")
        time.sleep(1.0)  # every front connected
        server.roles = children(process.pid) or {process.pid: "inference"}
        yield server
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def perf_analyzer_binary() -> str:
    beside = Path(sys.executable).parent / "perf_analyzer"
    found = str(beside) if beside.exists() else shutil.which("perf_analyzer")
    if not found:
        raise SystemExit("perf_analyzer is missing: it ships in tritonclient==2.41.0")
    return found


def load_env() -> dict[str, str]:
    """perf_analyzer's libcudart.so.12 (nvidia-cuda-runtime-cu12) on LD_LIBRARY_PATH."""
    import importlib.util

    spec = importlib.util.find_spec("nvidia.cuda_runtime")
    paths = [os.environ.get("LD_LIBRARY_PATH", "")]
    if spec is not None and spec.submodule_search_locations:
        paths.insert(0, str(Path(next(iter(spec.submodule_search_locations))) / "lib"))
    return {**os.environ, "LD_LIBRARY_PATH": os.pathsep.join(filter(None, paths))}


def run_load(command: list[str], cores: set[int]) -> tuple[int, float, str]:
    """Run a load generator on `cores`: its exit status, CPU seconds (children included), output."""
    before = children_cpu()
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=load_env(),
        preexec_fn=(lambda: os.sched_setaffinity(0, cores)) if cores else None,
    )
    output = process.communicate()[0]
    return process.returncode, children_cpu() - before, output


def perf_command(
    server: Server, c: int, shape: str, shm: str, out_bytes: int, report: Path
) -> list[str]:
    command = [perf_analyzer_binary(), "-m", server.model, "-u", server.host_port, "-i", "http"]
    command += ["--concurrency-range", str(c), "-b", "1", "--shape", shape, "-f", str(report)]
    command += ["--input-data", "random", *PA_WINDOW]
    if shm != "none":
        command += ["--shared-memory", shm, "--output-shared-memory-size", str(out_bytes)]
    return command


def measure(server: Server, load: list[str], client_cores: set[int], reader: Any) -> dict[str, Any]:
    """One level: the load's own figures (via `reader`) with CPU, GPU and server statistics."""
    pids = list(server.roles)
    before_cpu = {pid: cpu_seconds(pid) for pid in pids}
    before_busy, before_total = machine_busy()
    before_stats = server.stats()
    started = time.monotonic()
    with GpuSampler() as gpu:
        code, load_cpu, output = run_load(load, client_cores)
    wall = time.monotonic() - started
    busy, total = machine_busy()
    after_stats = server.stats()
    used = {pid: (cpu_seconds(pid) - before_cpu[pid]) / wall for pid in pids}
    fronts = [used[pid] for pid in server.pids("front")]
    delta = server_delta(before_stats, after_stats)
    row: dict[str, Any] = {
        "exit": code,
        "wall_s": round(wall, 1),
        "inference_processes": len(server.pids("inference")),
        "cores_inference": round(sum(used[p] for p in server.pids("inference")), 2),
        "cores_fronts": round(sum(fronts), 2),
        "cores_busiest_front": round(max(fronts), 2) if fronts else None,
        "cores_load": round(load_cpu / wall, 2),
        "cores_machine": round((busy - before_busy) / (total - before_total) * os.cpu_count(), 1),
        "gpu_util": gpu.mean,
        "mean_batch": round(delta.mean_batch, 2),
        "server_compute_ms": round(delta.phases["compute_infer"] * 1e3, 3),
        "server_input_ms": round(delta.phases["compute_input"] * 1e3, 3),
        "server_queue_ms": round(delta.phases["queue"] * 1e3, 3),
    }
    if code != 0:
        row["error"] = output[-2000:]
        return row
    row.update(reader())
    return row


def read_pa(report: Path) -> dict[str, Any]:
    with report.open() as file:
        (line,) = list(csv.DictReader(file))
    return {
        "items_per_s": float(line["Inferences/Second"]),
        "p50_ms": int(line["p50 latency"]) / 1e3,
        "p99_ms": int(line["p99 latency"]) / 1e3,
    }


def output_bytes(model: Path, shape: tuple[int, ...]) -> int:
    """Bytes of one item's outputs at the benchmark's input shape (perf_analyzer's regions)."""
    import numpy as np
    import onnxruntime as ort

    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    (spec,) = session.get_inputs()
    outputs = session.run(None, {spec.name: np.zeros((1, *shape), np.float32)})
    return sum(o.nbytes for o in outputs)


def profile(server: Server, load: list[str], cores: set[int], out: Path, seconds: int) -> dict:
    """py-spy of the inference process and one front while `load` runs: top frames by share."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    process = subprocess.Popen(
        load,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=load_env(),
        preexec_fn=(lambda: os.sched_setaffinity(0, cores)) if cores else None,
    )
    time.sleep(3)
    front = server.pids("front")[0]
    targets = {
        "inference": (server.pids("inference")[0], []),
        "inference-gil": (server.pids("inference")[0], ["--gil"]),
        "front": (front, []),
    }
    spies = {
        role: subprocess.Popen(
            [
                spy,
                "record",
                "-r",
                str(RATE),
                "-d",
                str(seconds),
                "-p",
                str(pid),
                "-f",
                "raw",
                *extra,
                "--threads",
                "--nonblocking",
                "-o",
                str(out / f"pyspy-{role}.txt"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
        )
        for role, (pid, extra) in targets.items()
    }
    for spy_process in spies.values():
        spy_process.wait()
    process.wait()
    return {role: summarize(out / f"pyspy-{role}.txt", RATE * seconds) for role in targets}


def gpu_bundle(source: Path, work: Path) -> str:
    return str(build(source, work / "build" / source.name, targets=("jetson",)).root)


def variants(source: Path, args: argparse.Namespace) -> Iterator[tuple[int | str, Path]]:
    """`source` copied with each `--per-device` setting of inference processes: (setting,
    folder); `source` itself, as its manifest says, without the option."""
    if not args.per_device:
        yield "manifest", source
        return
    for setting in args.per_device.split(","):
        count = setting if setting == "auto" else int(setting)
        yield count, with_processes(source, args.work / f"{source.name}-x{count}", count)


def sweep_model(name: str, args: argparse.Namespace, results: dict[str, Any]) -> None:
    source = write_function(name, args.work / name)
    shape = "image:" + ",".join(map(str, BENCH_SHAPES[name]))
    out_bytes = output_bytes(source / "model.onnx", BENCH_SHAPES[name])
    everything = set(range(os.cpu_count() or 1))
    client = set(range(args.client_cores)) if args.client_cores else set()
    server_cores = everything - client if client else set()
    rows = results.setdefault(name, [])
    if args.limits:
        from benchmarks.gpu import BATCHES, in_process

        limits = {b: in_process(source / "model.onnx", BENCH_SHAPES[name], b) for b in BATCHES}
        results.setdefault("in_process", {})[name] = limits
        print(json.dumps({name: limits}), flush=True)
    log = args.out / "serve.log"
    for (per_device, folder), workers in product(variants(source, args), args.workers.split(",")):
        with serving(gpu_bundle(folder, args.work), name, workers, server_cores, log) as server:
            fronts = len(server.pids("front"))
            modes = ["none", *args.shm.split(",")] if workers == args.shm_workers else ["none"]
            for shm in filter(None, modes):
                for c in map(int, args.concurrency.split(",")):
                    report = args.work / f"pa-{name}-{workers}-{shm}-{c}.csv"
                    load = perf_command(server, c, shape, shm, out_bytes, report)
                    row = measure(server, load, client, lambda r=report: read_pa(r))
                    row.update(
                        {
                            "workers": workers,
                            "per_device": per_device,
                            "fronts": fronts,
                            "load": "perf_analyzer",
                            "transport": "http" if shm == "none" else f"shm-{shm}",
                            "c": c,
                        }
                    )
                    rows.append(row)
                    print(json.dumps(row), flush=True)
            heaviest = max(map(int, args.concurrency.split(",")))
            if args.bench and workers == args.shm_workers:
                inputs = ["--inputs", "random", "--shape", shape]
                rows.append(bench_row(server, heaviest, inputs, client, 4, workers, args.work))
                print(json.dumps(rows[-1]), flush=True)
            if args.profile and workers == args.shm_workers and server.pids("front"):
                report = args.work / f"pa-{name}-profile.csv"
                load = perf_command(server, heaviest, shape, "none", out_bytes, report)
                load = [
                    *load[: load.index("--measurement-interval")],
                    "--measurement-interval",
                    str(args.profile_s * 1000 + 4000),
                    "--max-trials",
                    "1",
                ]
                results.setdefault("profiles", {})[name] = profile(
                    server, load, client, args.out, args.profile_s
                )
                for role in ("inference", "inference-gil", "front"):
                    target = args.out / f"pyspy-{name}-{role}.txt"
                    with contextlib.suppress(FileNotFoundError):
                        (args.out / f"pyspy-{role}.txt").replace(target)


def bench_command(
    server: Server, c: int, inputs: list[str], processes: int, window_s: int, report: Path
) -> list[str]:
    command = [sys.executable, "-m", "edgeserve", "bench", server.url, "--concurrency", str(c)]
    command += ["--processes", str(processes), *inputs, "--window-s", str(window_s)]
    return [*command, "--max-windows", "5", "--json", str(report), "--plot", ""]


def bench_row(
    server: Server,
    c: int,
    inputs: list[str],
    client: set[int],
    processes: int,
    workers: str,
    work: Path,
) -> dict:
    """`edgeserve bench --processes N` (the Python load generator) at one level."""
    report = work / "bench.json"
    command = bench_command(server, c, inputs, processes, 2, report)

    def read() -> dict[str, Any]:
        (level,) = json.loads(report.read_text())["levels"]
        return {
            "items_per_s": level["items_per_s"],
            "requests_per_s": level["throughput_rps"],
            "p50_ms": level["latency_ms"]["p50"],
            "p99_ms": level["latency_ms"]["p99"],
        }

    row = measure(server, command, client, read)
    row.update({"workers": workers, "load": f"edgeserve bench -p {processes}", "c": c})
    return row | {"transport": "http", "fronts": len(server.pids("front"))}


def sweep_function(folder: Path, args: argparse.Namespace, results: dict[str, Any]) -> None:
    """A function's own samples through `edgeserve bench` (its /invoke route): requests/s,
    the server's mean batch and the cores each process used, per workers setting and level."""
    inputs = ["--inputs", str(folder / "samples")]
    label = f"{folder.name} ({os.environ.get('EDGESERVE_DEVICE', 'default device')})"
    rows = results.setdefault(label, [])
    for (per_device, copy), workers in product(variants(folder, args), args.workers.split(",")):
        bundle = build(copy, args.work / "build" / copy.name, targets=("jetson",))
        with serving(
            str(bundle.root), bundle.name, workers, set(), args.out / "serve.log"
        ) as server:
            for c in map(int, args.concurrency.split(",")):
                rows.append(bench_row(server, c, inputs, set(), args.processes, workers, args.work))
                rows[-1]["per_device"] = per_device
                print(json.dumps(rows[-1]), flush=True)
            if args.profile and server.pids("front"):
                c = max(map(int, args.concurrency.split(",")))
                load = bench_command(server, c, inputs, args.processes, 3, args.work / "p.json")
                results.setdefault("profiles", {})[label] = profile(
                    server, load, set(), args.out, args.profile_s
                )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("work", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--models", default="resnet,crnn")
    parser.add_argument("--workers", default="4,8,14")
    parser.add_argument("--shm-workers", default="14", help="the setting shm/profile/bench run at")
    parser.add_argument("--concurrency", default="16,64,128")
    parser.add_argument("--shm", default="system,cuda")
    parser.add_argument("--client-cores", type=int, default=0, help="first N cores for the load")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--profile-s", type=int, default=6)
    parser.add_argument("--bench", action="store_true")
    parser.add_argument("--limits", action="store_true", help="in-process items/s (CUDA)")
    parser.add_argument("--function", type=Path, help="a function folder, its samples as load")
    parser.add_argument("--processes", type=int, default=4, help="bench load processes")
    parser.add_argument("--per-device", default="", help="inference processes per device")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    import onnxruntime as ort

    if hasattr(ort, "preload_dlls"):
        ort.preload_dlls()
    results: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}}
    for name in filter(None, args.models.split(",")):
        sweep_model(name, args, results)
        (args.out / "sweep.json").write_text(json.dumps(results, indent=1))
    if args.function:
        sweep_function(args.function, args, results)
        (args.out / "sweep.json").write_text(json.dumps(results, indent=1))
    results.pop("args")
    print_table(results)


if __name__ == "__main__":
    main()
