"""Several inference processes (Triton's instance_group): `[resources] processes_per_device = 2`
on CI's CPU, run as users run it (the CLI, a real server on 127.0.0.1, real signals), observed
through /metrics and the statistics extension only; and the layout's pure choice of devices."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from functools import partial
from pathlib import Path

import httpx
import numpy as np
import onnxruntime
import pytest

from edgeserve.backends import Choice, as_reached
from edgeserve.errors import ConfigError
from edgeserve.hardware import Cpu, Gpu, Jetson, Platform, probe_gpus
from edgeserve.manifest import PerDeviceKind, load_manifest
from edgeserve.workers import choose_layout, usable_cores
from edgeserve.workers.layout import Instance
from tests.models import conv_model, write_function
from tests.server import Server, running
from tests.test_workers import (
    children,
    infer_body,
    post_in_background,
    reference,
    stats,
    successor_held,
    wait_until,
)
from tests.test_workers import function as workers_function
from tests.test_workers_requests import pages

function = partial(workers_function, per_device=2)  # the MLP, two CPU inference processes
CUDA_HOST = bool(probe_gpus()) and "CUDAExecutionProvider" in onnxruntime.get_available_providers()


def instances(url: str) -> dict[str, dict[str, float]]:
    """Per inference process ("0", "1"): its edgeserve_instance_* values and pid, from /metrics."""
    text = httpx.get(f"{url}/metrics", timeout=5).text
    found: dict[str, dict[str, float]] = {}
    pattern = r"edgeserve_instance_(\w+)\{(.*?)\} (\S+)"
    for name, labels, value in re.findall(pattern, text):
        label = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        entry = found.setdefault(label["instance"], {"pid": float(label["pid"])})
        entry[name] = float(value)
        entry["pid"] = float(label["pid"])
    return found


def executions(url: str) -> list[float]:
    return [entry["executions"] for _, entry in sorted(instances(url).items())]


def one_by_one(pool: ThreadPoolExecutor, url: str, count: int) -> list[Future]:
    """`count` one-row requests, each sent once the one before is held by an inference process
    (so each is routed knowing where the others went)."""
    calls: list[Future] = []
    for _ in range(count):
        expected = _held(url) + 1
        calls += post_in_background(pool, url, 1)
        wait_until(lambda: _held(url) == expected)  # noqa: B023 - waited for here, in the loop
    return calls


def _held(url: str) -> int:
    return int(sum(entry["held_rows"] for entry in instances(url).values()))


def ready(url: str) -> httpx.Response | None:
    try:
        return httpx.get(f"{url}/v2/health/ready", timeout=2)
    except httpx.TransportError:
        return None


@pytest.fixture(autouse=True)
def on_the_cpu(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """The servers these tests start serve on the CPU (their layouts are the CPU's), on a GPU
    host too, unless the test is one of the GPU's."""
    if request.node.get_closest_marker("gpu") is None:
        monkeypatch.setenv("EDGESERVE_DEVICE", "cpu")


def test_two_cpu_instances_answer_right_and_share_the_batches_evenly(tmp_path: Path) -> None:
    """16 one-row requests at once, batches of up to 16 waiting 2 s (the 16 arrive within 0.5 s
    on a quiet 2-core machine, within 2 s on a loaded one): routed to the shortest queue, every
    front's items split 8/8 (a race between the fronts may make it 7/9), and each process runs
    its share in one batch."""
    folder = function(tmp_path / "mlp", delay_ms=2000, batch=16)
    x = np.random.default_rng(3).normal(size=(5, 16)).astype(np.float32)
    with running(folder, "--workers", "2") as (url, server), ThreadPoolExecutor(16) as pool:
        assert "2 front processes and 2 inference processes (2 x cpu)" in "".join(server.output)
        # the two share the cores (CI's 2: one thread each), not each asking for all of them
        share = f"; backend threads: {max(1, usable_cores() // 2)})"
        loaded = [line for line in server.output if "loaded mlp on onnxruntime" in line]
        assert len(loaded) == 2 and all(line.rstrip().endswith(share) for line in loaded), loaded
        answer = httpx.post(f"{url}/v2/models/mlp/infer", json=infer_body(x), timeout=30)
        y = np.asarray(answer.json()["outputs"][0]["data"], np.float32).reshape(5, 4)
        np.testing.assert_allclose(y, reference(folder, x), rtol=1e-5, atol=1e-5)
        for _ in range(2):
            before = instances(url)
            assert [call.result() for call in post_in_background(pool, url, 16)] == [200] * 16
            after = instances(url)
            rows = sorted(int(after[i]["inferences"] - before[i]["inferences"]) for i in after)
            ran = [after[i]["executions"] - before[i]["executions"] for i in after]
            assert rows in ([8, 8], [7, 9]) and ran == [1, 1], (rows, ran)
        counts = [entry["inferences"] for entry in instances(url).values()]
        assert sum(counts) == stats(url)["inference_count"] == 5 + 2 * 16


def test_openvino_processes_sharing_the_cpu_leave_their_threads_unpinned(tmp_path: Path) -> None:
    """OpenVINO pins its threads to cores, each process as if alone: two inference processes
    on one CPU would queue on the same core (on 16 cores, eight served functions/ocr 6.7x
    slower: RESULTS-gpu.md). A small conv net on two threads each, as [backend] threads asks
    (OpenVINO pins one of them where it runs alone); every thread of both processes may still
    run on every core."""
    manifest = (
        '[function]\nname = "conv"\n[backend]\nprefer = ["openvino"]\nthreads = 2\n'
        "[resources]\nprocesses_per_device = 2\n"
    )
    folder = write_function(tmp_path / "conv", conv_model, manifest)
    image = np.random.default_rng(5).normal(size=(2, 3, 16, 16)).astype(np.float32)
    tensor = {"name": "image", "datatype": "FP32", "shape": [2, 3, 16, 16]}
    body = {"inputs": [tensor | {"data": image.ravel().tolist()}]}
    with running(folder, "--workers", "2") as (url, server):
        for _ in range(4):  # both processes run a batch
            answer = httpx.post(f"{url}/v2/models/conv/infer", json=body, timeout=30)
            assert answer.status_code == 200, answer.text
        loaded = [line for line in server.output if "loaded conv on openvino" in line]
        assert len(loaded) == 2, server.output
        cores = os.sched_getaffinity(0)
        for pid in children(server)["inference"]:
            for task in Path(f"/proc/{pid}/task").iterdir():
                status = (task / "status").read_text()
                allowed = status.split("Cpus_allowed_list:")[1].split()[0]
                assert cpu_list(allowed) == cores, (pid, task.name, allowed)


def cpu_list(text: str) -> set[int]:
    """A kernel CPU list ("0-1,4") as a set."""
    cores: set[int] = set()
    for part in text.split(","):
        first, _, last = part.partition("-")
        cores.update(range(int(first), int(last or first) + 1))
    return cores


def test_one_front_feeds_two_inference_processes_when_they_are_asked_for(tmp_path: Path) -> None:
    """`--workers 1` with processes_per_device = 2: one front, both processes run batches
    (one request at a time: ties rotate)."""
    folder = function(tmp_path / "mlp")
    x = np.random.default_rng(4).normal(size=(1, 16)).astype(np.float32)
    with running(folder, "--workers", "1") as (url, server):
        assert "1 front process and 2 inference processes" in "".join(server.output)
        for _ in range(4):
            answer = httpx.post(f"{url}/v2/models/mlp/infer", json=infer_body(x), timeout=30)
            y = np.asarray(answer.json()["outputs"][0]["data"], np.float32).reshape(1, 4)
            np.testing.assert_allclose(y, reference(folder, x), rtol=1e-5, atol=1e-5)
        assert executions(url) == [2, 2]


def _pages_in_two_processes(folder: Path) -> Path:
    """functions/ocr's shape in small: a handler making one item per line, two inference
    processes on each device, and a delay that lets a page's lines meet in one batch."""
    source = pages(folder, delay_ms=50)
    manifest = source / "function.toml"
    manifest.write_text(manifest.read_text() + "[resources]\nprocesses_per_device = 2\n")
    return source


def _read_pages(url: str, count: int, lines: int) -> None:
    for _ in range(count):  # one page at a time: each routed with nothing else held
        answer = httpx.post(f"{url}/invoke", json={"lines": [[1] * 16] * lines}, timeout=30)
        assert answer.status_code == 200 and answer.json() == lines, answer.text


def test_a_pages_lines_spread_over_the_cpus_processes(tmp_path: Path) -> None:
    """On a CPU the processes run side by side on their own cores: each page of 3 lines reaches
    both, so its lines run at the same time."""
    with running(_pages_in_two_processes(tmp_path / "pages"), "--workers", "1") as (url, _):
        _read_pages(url, 4, 3)
        assert all(count >= 4 for count in executions(url)), executions(url)


@pytest.mark.gpu
@pytest.mark.skipif(
    not probe_gpus() or "CUDAExecutionProvider" not in onnxruntime.get_available_providers(),
    reason="needs an NVIDIA GPU and onnxruntime-gpu",
)
def test_a_pages_lines_stay_in_one_batch_where_two_processes_share_a_gpu(tmp_path: Path) -> None:
    """Two processes on one GPU take turns on it: a page's 3 lines go to the same one and run as
    one batch (4 pages, 4 batches), and the pages still use both processes."""
    with running(_pages_in_two_processes(tmp_path / "pages"), "--workers", "1") as (url, server):
        assert "2 x cuda:0" in "".join(server.output)
        _read_pages(url, 4, 3)
        assert sum(executions(url)) == 4, executions(url)
        assert all(executions(url)), executions(url)


def test_a_killed_inference_process_restarts_alone_while_the_other_serves(
    tmp_path: Path,
) -> None:
    folder = function(tmp_path / "mlp", delay_ms=1500)
    with running(folder, "--workers", "2") as (url, server), ThreadPoolExecutor(2) as pool:
        held = one_by_one(pool, url, 2)
        assert [e["held_rows"] for e in instances(url).values()] == [1, 1]
        victim = int(instances(url)["0"]["pid"])
        started = time.monotonic()
        with successor_held(server, victim):
            (first,), _ = wait(held, return_when=FIRST_COMPLETED)
            assert first.result() == 503  # the killed one's request, answered at once
            assert time.monotonic() - started < 1.0  # the survivor's runs after its 1.5 s delay
            wait_until(lambda: _degraded(url) is not None, 5)  # every front has noticed
            assert _degraded(url) == "inference process 0 (cpu) restarting: 1 of 2 serve"
            x = np.full((1, 16), 0.25, np.float32)
            meanwhile = httpx.post(f"{url}/v2/models/mlp/infer", json=infer_body(x), timeout=30)
            assert meanwhile.status_code == 200  # the other process took it
            assert sorted(call.result() for call in held) == [200, 503]
        wait_until(lambda: _whole(url), 60)
        restarted = instances(url)
        assert restarted["0"]["restarts"] == 1 and restarted["1"]["restarts"] == 0
        assert restarted["0"]["pid"] != victim
        before = executions(url)
        # one by one: two sent at once through two fronts may both see two idle processes
        # and pick the same one (CI saw it)
        assert [call.result() for call in one_by_one(pool, url, 2)] == [200, 200]
        assert all(after > then for after, then in zip(executions(url), before, strict=True))
        assert "inference process 0 exited (signal 9)" in "".join(server.output)


def test_fronts_restarted_while_an_inference_process_is_away_serve_with_the_others(
    tmp_path: Path,
) -> None:
    """Inference process 0 killed, its successor held stopped (SIGSTOP) before it is ready, then
    both fronts killed: the new fronts come up on process 1 alone, degraded; process 0 joins
    once it may go on (SIGCONT)."""
    folder = function(tmp_path / "mlp")
    x = np.full((1, 16), 0.5, np.float32)
    with running(folder, "--workers", "2") as (url, server):
        with successor_held(server, int(instances(url)["0"]["pid"])) as successor:
            for pid in children(server)["front"]:
                os.kill(pid, signal.SIGKILL)
            wait_until(lambda: _degraded(url) is not None, 60)
            assert _degraded(url) == "inference process 0 (cpu) restarting: 1 of 2 serve"
            answer = httpx.post(f"{url}/v2/models/mlp/infer", json=infer_body(x), timeout=30)
            assert answer.status_code == 200, answer.text
        wait_until(lambda: _whole(url), 60)
        assert int(instances(url)["0"]["pid"]) == successor


def test_fronts_leave_with_a_supervisor_killed_before_any_inference_process_was_ready(
    tmp_path: Path,
) -> None:
    """The inference processes held stopped (SIGSTOP) while they load, the supervisor killed:
    the fronts, still starting, have nothing to drain and exit (no orphans waiting forever)."""
    folder = function(tmp_path / "mlp")
    command = [sys.executable, "-m", "edgeserve", "serve", str(folder), "--port", "0"]
    process = subprocess.Popen(
        [*command, "--workers", "2"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    server, found = Server(process), {"front": [], "inference": []}
    try:
        server.wait_for_url(60)  # printed as the children start, before they are ready

        def started() -> bool:
            found.update(children(server))
            for pid in found["inference"]:
                os.kill(pid, signal.SIGSTOP)
            return [len(pids) for pids in found.values()] == [2, 2]

        wait_until(started, 10)
        wait_until(lambda: "".join(server.output).count("Waiting for application startup") == 2)
        process.kill()
        process.wait(10)
        wait_until(lambda: not any(_alive(pid) for pid in found["front"]), 10)
        # what the last front wrote before it left may still be in the pipe, unread
        left = "before it was ready: nothing to drain"
        wait_until(lambda: "".join(server.output).count(left) >= 2, 10)
        assert "".join(server.output).count(left) == 2
    finally:
        for pid in (*found["front"], *found["inference"]):
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    """Running, not a zombie left for a parent that is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def _degraded(url: str) -> str | None:
    """What readiness says is away while it answers 200; None when whole (or not ready)."""
    answer = ready(url)
    if answer is None or answer.status_code != 200 or not answer.content:
        return None
    return str(answer.json()["degraded"])


def _whole(url: str) -> bool:
    answer = ready(url)
    return answer is not None and answer.status_code == 200 and not answer.content


def test_sigterm_drains_every_inference_process_within_the_bound(tmp_path: Path) -> None:
    folder = function(tmp_path / "mlp", delay_ms=5000, batch=16)  # held until SIGTERM
    with running(folder, "--workers", "2") as (url, server), ThreadPoolExecutor(8) as pool:
        calls = one_by_one(pool, url, 8)
        assert [e["held_rows"] for e in instances(url).values()] == [4, 4]
        pids = [int(entry["pid"]) for entry in instances(url).values()]
        started = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        assert [call.result() for call in calls] == [200] * 8
        assert server.process.wait(timeout=30) == -signal.SIGTERM  # as one process ends
        assert time.monotonic() - started < 10
        assert [pid for pid in pids if Path(f"/proc/{pid}").exists()] == []


def test_admission_refuses_only_when_every_inference_process_is_full(tmp_path: Path) -> None:
    """Queues of 2 rows on each of 2 processes, held 4 s: with 3 rows queued a body that is not
    JSON is still read (400: one process has room); with 4 it is refused unread (503)."""
    folder = function(tmp_path / "mlp", delay_ms=4000, batch=4, queue=2)
    with running(folder, "--workers", "2") as (url, _), ThreadPoolExecutor(4) as pool:
        held = one_by_one(pool, url, 3)
        wait_until(lambda: sum(e["queued_rows"] for e in instances(url).values()) == 3)
        read = httpx.post(f"{url}/v2/models/mlp/infer", content=b"not json at all")
        assert read.status_code == 400, read.text
        held += one_by_one(pool, url, 1)
        wait_until(lambda: [e["queued_rows"] for e in instances(url).values()] == [2, 2])
        refused = httpx.post(f"{url}/v2/models/mlp/infer", content=b"not json at all")
        assert refused.status_code == 503
        assert "queue full" in refused.json()["error"]
        assert [call.result() for call in held] == [200] * 4


def _cpu(cores: int) -> Cpu:
    return Cpu("test cpu", cores, frozenset())


def _gpus(count: int) -> Platform:
    gpus = tuple(Gpu(i, "NVIDIA H200", (9, 0), 141 * 2**30, "560") for i in range(count))
    return Platform("nvidia-gpu", _cpu(16), gpus, None, frozenset())


CPU = Platform("cpu", _cpu(16), (), None, frozenset())
JETSON = Platform("jetson", _cpu(8), (), Jetson("Orin", "t234", (8, 7), "36.3", "6.0"), frozenset())


@pytest.mark.parametrize(
    ("platform", "devices", "per_device", "env", "expected"),
    [
        (_gpus(2), "auto", 1, {}, [("cuda:0", "0"), ("cuda:1", "1")]),
        (_gpus(8), (1, 3), 1, {}, [("cuda:1", "1"), ("cuda:3", "3")]),
        (_gpus(2), "auto", 2, {}, [("cuda:0", "0")] * 2 + [("cuda:1", "1")] * 2),
        (_gpus(2), "cpu", 1, {}, [("cpu", None)]),
        (_gpus(4), "auto", 1, {"CUDA_VISIBLE_DEVICES": "3,1"}, [("cuda:0", "3"), ("cuda:1", "1")]),
        (_gpus(2), "auto", 1, {"EDGESERVE_DEVICE": "cuda:1"}, [("cuda:1", "1")]),
        (_gpus(2), (0, 1), 1, {"EDGESERVE_DEVICE": "cpu"}, [("cpu", None)]),
        (JETSON, "auto", 1, {}, [("cuda:0", "0")]),
        (CPU, "auto", 1, {}, [("cpu", None)]),
        (CPU, "auto", 3, {}, [("cpu", None)] * 3),
        (_gpus(2), "auto", PerDeviceKind(gpu=2), {}, [("cuda:0", "0")] * 2 + [("cuda:1", "1")] * 2),
        (_gpus(1), "auto", PerDeviceKind(cpu=3), {}, [("cuda:0", "0")]),
        (_gpus(1), "cpu", PerDeviceKind(gpu=2, cpu=3), {}, [("cpu", None)] * 3),
        (CPU, "auto", PerDeviceKind(gpu=4, cpu=1), {}, [("cpu", None)]),
    ],
)
def test_inference_processes_follow_the_devices_as_triton_instance_groups_do(
    platform: Platform,
    devices: str | tuple[int, ...],
    per_device: int | PerDeviceKind,
    env: dict[str, str],
    expected: list[tuple[str, str | None]],
) -> None:
    layout = choose_layout(4, platform, 16, devices, per_device, env)  # type: ignore[arg-type]
    assert [(i.device, i.visible) for i in layout.instances] == expected
    assert layout.single is False


def test_each_gpu_process_sees_only_its_gpu() -> None:
    assert Instance("cuda:1", "1").env() == {
        "CUDA_VISIBLE_DEVICES": "1",
        "EDGESERVE_DEVICE": "cuda:0",
    }
    assert Instance().env() == {"EDGESERVE_DEVICE": "cpu"}


@pytest.mark.parametrize(
    ("platform", "per_device", "cores", "threads"),
    [(CPU, 4, 16, 4), (CPU, 3, 16, 5), (CPU, 4, 2, 1), (CPU, 1, 16, 0)],
)
def test_inference_processes_on_the_cpu_share_its_cores(
    platform: Platform, per_device: int, cores: int, threads: int
) -> None:
    layout = choose_layout(2, platform, cores, "cpu", per_device, {})
    assert layout.cpu_threads == threads
    assert (f"{threads} threads each" in layout.reason) == (threads > 0)


def test_gpu_processes_keep_their_backends_default_threads() -> None:
    assert choose_layout(2, _gpus(2), 16, "auto", 2, {}).cpu_threads == 0


def test_auto_fronts_leave_a_core_per_gpu_process() -> None:
    assert choose_layout("auto", _gpus(1), 16, env={}).fronts == 14
    assert choose_layout("auto", _gpus(8), 16, env={}).fronts == 7


@pytest.mark.parametrize(
    ("platform", "cores", "env", "fronts", "processes", "threads"),
    [
        (CPU, 16, {}, 12, 8, 2),
        (CPU, 4, {}, 3, 2, 2),
        (CPU, 5, {}, 4, 2, 2),
        (CPU, 64, {}, 16, 16, 4),
        (_gpus(1), 16, {"EDGESERVE_DEVICE": "cpu"}, 12, 8, 2),  # a GPU host told to use its CPU
        (_gpus(2), 16, {}, 13, 2, 0),  # one per GPU
    ],
)
def test_auto_processes_split_the_cpu_into_two_core_processes_and_keep_one_per_gpu(
    platform: Platform,
    cores: int,
    env: dict[str, str],
    fronts: int,
    processes: int,
    threads: int,
) -> None:
    """`processes_per_device = "auto"` (the default): the layout measured on 16 cores
    (benchmarks/RESULTS-gpu.md, sixth session); the fronts follow where inference runs, not
    whether the host has a GPU."""
    layout = choose_layout("auto", platform, cores, env=env)
    assert (layout.fronts, len(layout.instances), layout.cpu_threads) == (
        fronts,
        processes,
        threads,
    )


def test_one_front_asked_for_keeps_the_single_process_unless_instances_are_asked_for() -> None:
    assert choose_layout(1, _gpus(2), 16, env={}).single
    assert choose_layout(1, CPU, 16, "auto", PerDeviceKind(gpu=2), env={}).single  # not the CPU's
    assert not choose_layout(1, _gpus(1), 16, "auto", PerDeviceKind(gpu=2), env={}).single
    assert choose_layout("auto", _gpus(2), 2, env={}).single  # 2 cores: one process
    split = choose_layout(1, CPU, 16, "auto", 2, env={})
    assert not split.single and (split.fronts, len(split.instances)) == (1, 2)


@pytest.mark.parametrize(
    ("backend", "reached"),
    [("onnxruntime", "cpu"), ("openvino", "cpu"), ("tensorrt", "nvidia-gpu")],
)
@pytest.mark.skipif(CUDA_HOST, reason="this ONNX Runtime has the CUDA provider")
def test_a_gpu_counts_only_where_the_chosen_backend_can_use_it(backend: str, reached: str) -> None:
    """A GPU host with ONNX Runtime's CPU wheel (this machine's: no CUDA provider) or OpenVINO
    plans the CPU layout, not one process per GPU that would all run on the CPU. TensorRT is
    not installed here: its choice is named (no engine loads in as_reached)."""
    host = _gpus(2)
    layout = choose_layout("auto", as_reached(host, Choice(backend, "test")), 16, env={})
    assert as_reached(host, Choice(backend, "test")).kind == reached
    if reached == "cpu":
        assert (layout.devices, layout.fronts) == (["cpu"] * 8, 12)
    else:
        assert (layout.devices, layout.fronts) == (["cuda:0", "cuda:1"], 13)


@pytest.mark.parametrize(
    ("platform", "devices", "message"),
    [
        (_gpus(2), (2,), r"\[resources\] devices: GPU 2 is not visible here; this machine shows 2"),
        (CPU, (0,), r"\[resources\] devices: GPU 0 is not visible here; this machine shows 0"),
    ],
)
def test_a_gpu_that_is_not_there_is_refused_with_what_is(
    platform: Platform, devices: tuple[int, ...], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        choose_layout(2, platform, 16, devices, 1, {})


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("devices = []", "devices"),
        ('devices = "gpu"', "devices"),
        ("processes_per_device = 0", "processes_per_device"),
        ("processes_per_device = { gpu = 0 }", r"processes_per_device\.gpu`: .* 1 .*found 0"),
        ("processes_per_device = { tpu = 2 }", r"processes_per_device\.tpu`: unknown key"),
    ],
)
def test_bad_device_settings_in_the_manifest_are_refused(
    tmp_path: Path, line: str, message: str
) -> None:
    (tmp_path / "function.toml").write_text(f'[function]\nname = "f"\n[resources]\n{line}\n')
    with pytest.raises(ConfigError, match=message):
        load_manifest(tmp_path)


def test_a_count_for_one_kind_of_device_reads_from_the_manifest(tmp_path: Path) -> None:
    """{ gpu = 2 }: the count on a GPU host, "auto" (8 x cpu here) wherever the CPU serves."""
    (tmp_path / "function.toml").write_text(
        '[function]\nname = "f"\n[resources]\nprocesses_per_device = { gpu = 2 }\n'
    )
    per_device = load_manifest(tmp_path).resources.processes_per_device
    assert per_device == PerDeviceKind(gpu=2, cpu="auto")
    assert len(choose_layout("auto", _gpus(1), 16, "auto", per_device, {}).instances) == 2
    assert len(choose_layout("auto", CPU, 16, "auto", per_device, {}).instances) == 8
