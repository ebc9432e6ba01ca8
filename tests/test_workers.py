"""`edgeserve serve --workers N`: front processes and one inference process, run as users run
them (the CLI, a real server on 127.0.0.1, real signals), and the layout's pure choice."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import httpx
import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.utils.shared_memory as shm

from edgeserve.errors import ConfigError
from edgeserve.hardware import Cpu, Gpu, Platform
from edgeserve.workers import choose_layout, usable_cores
from edgeserve.workers.layout import quota_cores
from tests.models import identity_model, mlp_model, write_function
from tests.server import Server, running

MANIFEST = """
[function]
name = "mlp"
[batching]
max_batch_size = {batch}
preferred_batch_sizes = [{batch}]
max_queue_delay_ms = {delay}
max_queue_size = {queue}
[backend]
prefer = ["onnxruntime"]
precision = "fp32"
[handler]
module = "handler"
"""
# fp32: the answers are compared with ONNX Runtime's on the CPU at 1e-5; on a GPU host the
# default ("auto") lets CUDA compute in TF32 (0.13 % off)
HANDLER = """
import numpy as np

def preprocess(payload, ctx):
    return [{"x": np.asarray(row, dtype=np.float32)} for row in payload["rows"]]

def postprocess(items, ctx):
    return {"y": np.stack([item["y"] for item in items])}
"""
WAIT_S = 30.0


def function(
    folder: Path, *, delay_ms: float = 1, batch: int = 8, queue: int = 1024, per_device: int = 1
) -> Path:
    """The MLP with a handler; `per_device` inference processes on the CPU."""
    manifest = MANIFEST.format(batch=batch, delay=delay_ms, queue=queue)
    manifest += f"[resources]\nprocesses_per_device = {per_device}\n"
    return write_function(folder, mlp_model, manifest, HANDLER)


def reference(folder: Path, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def infer_body(x: np.ndarray) -> dict:
    tensor = {"name": "x", "datatype": "FP32", "shape": list(x.shape), "data": x.ravel().tolist()}
    return {"inputs": [tensor]}


def children(server: Server) -> dict[str, list[int]]:
    """The supervisor's children by kind ("front", "inference"), from /proc."""
    pid = server.process.pid
    found: dict[str, list[int]] = {"front": [], "inference": []}
    for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
        cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
        for kind in found:
            if f"edgeserve.workers.{kind}".encode() in cmdline:
                found[kind].append(int(child))
    return found


@contextmanager
def successor_held(server: Server, victim: int) -> Iterator[int]:
    """Kill inference process `victim` and hold the one the supervisor starts in its place
    stopped (SIGSTOP) before it can be ready (it takes 0.4 s or more), so that the restart lasts
    as long as the test needs; it goes on (SIGCONT) on leaving. Yields the successor's pid."""
    known = set(children(server)["inference"])
    os.kill(victim, signal.SIGKILL)
    successor: list[int] = []

    def started() -> bool:
        successor[:] = [pid for pid in children(server)["inference"] if pid not in known]
        return bool(successor)

    wait_until(started, 10)
    os.kill(successor[0], signal.SIGSTOP)
    try:
        yield successor[0]
    finally:
        os.kill(successor[0], signal.SIGCONT)


def fronts(url: str) -> dict[str, tuple[float, float]]:
    """Per front: (requests answered, requests in flight), from /metrics."""
    text = httpx.get(f"{url}/metrics", timeout=5).text
    answered = re.findall(r'edgeserve_front_requests\{.*?front="(\d+)".*?\} (\S+)', text)
    in_flight = dict(re.findall(r'edgeserve_front_in_flight\{.*?front="(\d+)".*?\} (\S+)', text))
    return {front: (float(count), float(in_flight[front])) for front, count in answered}


def connections(url: str) -> list[int]:
    """Per front: client connections open (this request's own included), from /metrics."""
    text = httpx.get(f"{url}/metrics", timeout=5).text
    return [int(float(n)) for n in re.findall(r"edgeserve_front_connections\{.*?\} (\S+)", text)]


def stats(url: str) -> dict:
    return httpx.get(f"{url}/v2/models/mlp/stats", timeout=5).json()["model_stats"][0]


def wait_until(condition: Callable[[], bool], timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not true after {timeout_s} s: {condition}")
        time.sleep(0.02)


def post_in_background(pool: ThreadPoolExecutor, url: str, count: int) -> list[Future]:
    """`count` v2 requests of one row, each on its own connection: status code or exception."""
    body = infer_body(np.full((1, 16), 0.5, np.float32))

    def post() -> int:
        return httpx.post(f"{url}/v2/models/mlp/infer", json=body, timeout=WAIT_S).status_code

    return [pool.submit(post) for _ in range(count)]


def in_flight(url: str) -> list[float]:
    return [flying for _, flying in fronts(url).values()]


def test_two_fronts_compute_what_onnxruntime_computes(tmp_path: Path) -> None:
    folder = function(tmp_path / "mlp")
    x = np.random.default_rng(1).normal(size=(3, 16)).astype(np.float32)
    with running(folder, env={"EDGESERVE_WORKERS": "2"}) as (url, server):
        assert [len(pids) for pids in children(server).values()] == [2, 1]
        answer = httpx.post(f"{url}/v2/models/mlp/infer", json=infer_body(x)).json()
        y = np.asarray(answer["outputs"][0]["data"], np.float32).reshape(3, 4)
        np.testing.assert_allclose(y, reference(folder, x), rtol=1e-5, atol=1e-5)
        invoked = httpx.post(f"{url}/invoke", json={"rows": x.tolist()}).json()
        np.testing.assert_allclose(invoked["y"], reference(folder, x), rtol=1e-5, atol=1e-5)
        assert stats(url)["inference_count"] >= 6  # 3 rows each way (warm-up is not counted)
        assert sum(answered for answered, _ in fronts(url).values()) >= 2


def test_keep_alive_connections_are_spread_evenly_over_the_fronts(tmp_path: Path) -> None:
    """Each connection goes to the front holding the fewest: six keep-alive clients on two
    fronts hold three each (the kernel's hashing, before, split them so in 20 of 64 cases).
    Those that close are counted off: six more, one at a time, each closed after its request,
    leave the same three each."""
    folder = function(tmp_path / "mlp")
    body = infer_body(np.full((1, 16), 0.5, np.float32))
    with running(folder, "--workers", "2") as (url, _):
        clients = [httpx.Client(base_url=url, timeout=WAIT_S) for _ in range(6)]
        try:
            for client in clients:
                assert client.post("/v2/models/mlp/infer", json=body).status_code == 200
            for _ in range(6):
                assert httpx.post(f"{url}/v2/models/mlp/infer", json=body).status_code == 200
            # the closed ones counted off (each read's own connection is the seventh; a close
            # is counted once its front has seen it, so an earlier read's may lag a little)
            wait_until(lambda: sorted(connections(url)) == [3, 4])
        finally:
            for client in clients:
                client.close()
        wait_until(lambda: connections(url) in ([1, 0], [0, 1]))


@pytest.mark.parametrize("workers", ["1", "2"], ids=["one process", "two fronts"])
def test_metrics_count_the_time_requests_spend_in_each_handler_hook(
    tmp_path: Path, workers: str
) -> None:
    """/metrics from any front counts every front's hook calls and the time requests spent in
    them (Triton has no name for it; for functions/ocr it is most of a page on a GPU)."""
    folder = function(tmp_path / "mlp")
    with running(folder, "--workers", workers) as (url, _):
        for _ in range(4):
            reply = httpx.post(f"{url}/invoke", json={"rows": [[0.5] * 16] * 3}, timeout=WAIT_S)
            assert reply.status_code == 200, reply.text
        text = httpx.get(f"{url}/metrics", timeout=5).text
    calls = dict(re.findall(r'edgeserve_handler_calls\{.*?hook="(\w+)".*?\} (\S+)', text))
    spent = dict(re.findall(r'edgeserve_handler_duration_us\{.*?hook="(\w+)".*?\} (\S+)', text))
    assert {hook: float(n) for hook, n in calls.items()} == {"preprocess": 4, "postprocess": 4}
    assert all(float(us) > 0 for us in spent.values()) and spent.keys() == calls.keys()


def test_bytes_and_numbers_cross_between_the_processes_unchanged(tmp_path: Path) -> None:
    """BYTES tensors travel inline in the control message, numbers through the arena."""
    manifest = '[function]\nname = "identity"\n[backend]\nprefer = ["onnxruntime"]\n'
    folder = write_function(
        tmp_path / "identity", partial(identity_model, datatypes=("FP32", "BYTES")), manifest
    )
    inputs = [
        {"name": "in_FP32", "datatype": "FP32", "shape": [2, 3], "data": [0.5, 1, 2, 3, 4, 5]},
        {"name": "in_BYTES", "datatype": "BYTES", "shape": [2, 3], "data": list("abcdef")},
    ]
    with running(folder, "--workers", "2") as (url, _):
        answer = httpx.post(f"{url}/v2/models/identity/infer", json={"inputs": inputs})
        assert answer.status_code == 200, answer.text
        outputs = {output["name"]: output["data"] for output in answer.json()["outputs"]}
    assert outputs == {"out_FP32": [0.5, 1, 2, 3, 4, 5], "out_BYTES": list("abcdef")}


def test_items_from_both_fronts_meet_in_one_batch(tmp_path: Path) -> None:
    """8 one-row requests on 8 connections, a batch of 8 waiting up to 300 ms: the kernel spreads
    connections over the fronts; a round where both answered some, in one execution, shows it."""
    folder = function(tmp_path / "mlp", delay_ms=300)
    with running(folder, "--workers", "2") as (url, _), ThreadPoolExecutor(8) as pool:
        for _ in range(10):
            before, executions = fronts(url), stats(url)["execution_count"]
            codes = [future.result() for future in post_in_background(pool, url, 8)]
            after = stats(url)
            served = [after_[0] - before[front][0] for front, after_ in fronts(url).items()]
            assert codes == [200] * 8
            if min(served) > 0 and after["execution_count"] == executions + 1:
                assert after["batch_stats"][-1]["batch_size"] == 8
                return
        raise AssertionError("in 10 rounds no batch held items of both fronts")


@pytest.mark.parametrize("per_device", [1, 2], ids=["one inference process", "two"])
def test_killed_fronts_drop_their_requests_and_are_started_again(
    tmp_path: Path, per_device: int
) -> None:
    """Every inference process drops the items of the fronts killed: none ever runs."""
    folder = function(tmp_path / "mlp", delay_ms=1500, per_device=per_device)
    with running(folder, "--workers", "2") as (url, server), ThreadPoolExecutor(4) as pool:
        ran_before = stats(url)["inference_count"]
        calls = post_in_background(pool, url, 4)
        wait_until(lambda: sum(in_flight(url)) == 4)
        for pid in children(server)["front"]:  # every request is held by a front killed
            os.kill(pid, signal.SIGKILL)
        for call in calls:
            with pytest.raises(httpx.TransportError):
                call.result()
        wait_until(lambda: _ready(url))
        time.sleep(1.6)  # past the queue delay: had the dropped items stayed queued, they ran
        assert stats(url)["inference_count"] == ran_before
        assert sum(connections(url)) == 1  # the dead fronts' connections are not counted on
        x = np.full((1, 16), 0.25, np.float32)
        assert httpx.post(f"{url}/v2/models/mlp/infer", json=infer_body(x)).status_code == 200
        assert "dropping its" in "".join(server.output)


def test_a_supervisor_killed_leaves_no_folder_behind(tmp_path: Path) -> None:
    """The supervisor's scratch folder (the inference processes' sockets, registered regions)
    was removed on SIGTERM but stayed after a SIGKILL: its children, which die with it, leave
    the last of them to remove it."""
    folder = function(tmp_path / "mlp")
    with running(folder, "--workers", "2") as (_, server):
        kids = [pid for pids in children(server).values() for pid in pids]
        config = Path(f"/proc/{kids[0]}/cmdline").read_bytes().split(b"\0")[-2]
        scratch = Path(json.loads(config)["sockets_dir"])
        assert scratch.is_dir()
        server.process.kill()
        wait_until(lambda: not any(Path(f"/proc/{pid}").exists() for pid in kids), 30)
    assert not scratch.exists()


def _ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/v2/health/ready", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def _first(request: Callable[[], httpx.Response], status: int) -> httpx.Response:
    """The first answer of `status` in 5 s of asking again (else the last answer)."""
    deadline = time.monotonic() + 5
    while (answer := request()).status_code != status and time.monotonic() < deadline:
        time.sleep(0.01)
    return answer


def test_a_killed_inference_process_is_restarted_and_readiness_says_so(tmp_path: Path) -> None:
    folder = function(tmp_path / "mlp", delay_ms=1500)
    with running(folder, "--workers", "2") as (url, server), ThreadPoolExecutor(1) as pool:
        (held,) = post_in_background(pool, url, 1)
        wait_until(lambda: sum(in_flight(url)) == 1)
        x = np.full((1, 16), 0.25, np.float32)
        with successor_held(server, children(server)["inference"][0]):
            assert held.result() == 503  # answered at once, not left hanging
            # the other front learns of it on its own turn (a few ms; more on a loaded
            # machine), and the new inference process is held: ask until it says so
            not_ready = _first(lambda: httpx.get(f"{url}/v2/health/ready"), 503)
            assert not_ready.status_code == 503
            assert not_ready.headers["retry-after"] == "1"
            infer = partial(httpx.post, f"{url}/v2/models/mlp/infer", json=infer_body(x))
            refused = _first(infer, 503)
            assert refused.status_code == 503
            assert "retry-after" in refused.headers
        wait_until(lambda: _ready(url), 60)
        assert httpx.post(f"{url}/v2/models/mlp/infer", json=infer_body(x)).status_code == 200
        assert 'edgeserve_inference_restarts{model="mlp",version="1"} 1.0' in (
            httpx.get(f"{url}/metrics").text
        )


def test_sigterm_answers_the_requests_of_every_front_then_exits(tmp_path: Path) -> None:
    folder = function(tmp_path / "mlp", delay_ms=5000, batch=16)  # held until SIGTERM
    with running(folder, "--workers", "2") as (url, server), ThreadPoolExecutor(16) as pool:
        calls: list[Future] = []
        while len(calls) < 16 and not (calls and min(in_flight(url)) > 0):
            calls += post_in_background(pool, url, 1)  # until both fronts hold some
            wait_until(partial(_all_in_flight, url, len(calls)))
        assert min(in_flight(url)) > 0
        pids = [pid for kind in children(server).values() for pid in kind]
        started = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        assert [call.result() for call in calls] == [200] * len(calls)
        assert server.process.wait(timeout=30) == -signal.SIGTERM  # as one process ends
        assert time.monotonic() - started < 10
        assert [pid for pid in pids if Path(f"/proc/{pid}").exists()] == []


def test_a_region_registered_through_one_front_serves_every_front(tmp_path: Path) -> None:
    """tritonclient's own shm utilities make the region; each infer (its own connection) may
    land on either front, and every one finds the region."""
    folder = function(tmp_path / "mlp")
    x = np.random.default_rng(2).normal(size=(1, 16)).astype(np.float32)
    key = f"/i12-workers-{os.getpid()}"
    handle = shm.create_shared_memory_region("x_region", key, x.nbytes)
    try:
        shm.set_shared_memory_region(handle, [x])
        with running(folder, "--workers", "2") as (url, _):
            registered = httpx.post(
                f"{url}/v2/systemsharedmemory/region/x_region/register",
                json={"key": key, "offset": 0, "byte_size": x.nbytes},
            )
            assert registered.status_code == 200, registered.text
            tensor = {"name": "x", "datatype": "FP32", "shape": [1, 16]}
            tensor["parameters"] = {
                "shared_memory_region": "x_region",
                "shared_memory_byte_size": x.nbytes,
            }
            before, served = fronts(url), [0.0]
            for _ in range(32):  # until both fronts have answered some (ties go either way)
                answer = httpx.post(f"{url}/v2/models/mlp/infer", json={"inputs": [tensor]})
                assert answer.status_code == 200, answer.text
                y = np.asarray(answer.json()["outputs"][0]["data"], np.float32).reshape(1, 4)
                np.testing.assert_allclose(y, reference(folder, x), rtol=1e-5, atol=1e-5)
                served = [fronts(url)[front][0] - before[front][0] for front in before]
                if min(served) > 0:
                    break
            assert min(served) > 0, served  # both fronts found the region
    finally:
        shm.destroy_shared_memory_region(handle)


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_full_queue_refuses_before_the_body_is_read(tmp_path: Path, workers: str) -> None:
    """The queue (2 rows) is full of requests waiting 4 s for company: a body that is not even
    JSON waits its 1 s at the door and is refused 503 (not 400): it was never decoded."""
    folder = function(tmp_path / "mlp", delay_ms=4000, batch=4, queue=2)
    with running(folder, "--workers", workers) as (url, _), ThreadPoolExecutor(2) as pool:
        held = post_in_background(pool, url, 2)
        wait_until(lambda: _queued(url))
        refused = httpx.post(f"{url}/v2/models/mlp/infer", content=b"not json at all")
        assert refused.status_code == 503
        assert "queue full" in refused.json()["error"]
        assert int(refused.headers["retry-after"]) >= 1
        assert [call.result() for call in held] == [200, 200]


def _all_in_flight(url: str, count: int) -> bool:
    return sum(in_flight(url)) == count


def _queued(url: str) -> bool:
    """True once a probe with a broken body is refused for lack of room (queue full)."""
    return httpx.post(f"{url}/v2/models/mlp/infer", content=b"{").status_code == 503


def _cpu(cores: int) -> Cpu:
    return Cpu("test cpu", cores, frozenset())


GPU = Gpu(0, "NVIDIA H100", (9, 0), 80 * 2**30, "560")


@pytest.mark.parametrize(
    ("setting", "cores", "gpus", "fronts"),
    [
        ("auto", 1, (), 1),
        ("auto", 2, (), 1),
        ("auto", 2, (GPU,), 1),
        ("auto", 16, (GPU,), 14),
        ("auto", 64, (GPU,), 16),
        ("auto", 16, (), 12),
        ("auto", 4, (), 3),
        ("3", 2, (), 3),
        (5, 64, (GPU,), 5),
    ],
)
def test_the_layout_follows_the_setting_the_cores_and_the_devices(
    setting: str | int, cores: int, gpus: tuple[Gpu, ...], fronts: int
) -> None:
    platform = Platform("nvidia-gpu" if gpus else "cpu", _cpu(cores), gpus, None, frozenset())
    assert choose_layout(setting, platform, cores).fronts == fronts


@pytest.mark.parametrize("setting", ["0", "many", -2])
def test_a_bad_workers_setting_says_what_is_expected(setting: str | int) -> None:
    platform = Platform("cpu", _cpu(2), (), None, frozenset())
    with pytest.raises(ConfigError, match="workers: expected `auto` or a count >= 1"):
        choose_layout(setting, platform, 2)


@pytest.mark.parametrize(
    ("cpu_max", "cores"), [("max 100000\n", None), ("200000 100000\n", 2), ("50000 100000", 1)]
)
def test_a_cgroup_quota_bounds_the_cores_auto_counts(cpu_max: str, cores: int | None) -> None:
    assert quota_cores(cpu_max) == cores


def test_usable_cores_reads_the_cgroup_quota(tmp_path: Path) -> None:
    (tmp_path / "cpu.max").write_text("100000 100000\n")
    assert usable_cores(tmp_path / "cpu.max") == 1
    assert usable_cores(tmp_path / "absent") == len(os.sched_getaffinity(0))


def test_edgeserve_cores_caps_the_cores_counted(tmp_path: Path) -> None:
    """What the Kubernetes manifests set from the pod's CPU request (no quota: no CPU limit)."""
    absent = tmp_path / "absent"
    assert usable_cores(absent, {"EDGESERVE_CORES": "1"}) == 1
    assert usable_cores(absent, {"EDGESERVE_CORES": "100000"}) == len(os.sched_getaffinity(0))
    with pytest.raises(ConfigError, match="EDGESERVE_CORES: expected a count of cores >= 1"):
        usable_cores(absent, {"EDGESERVE_CORES": "half"})
