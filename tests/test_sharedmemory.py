"""Triton's system shared-memory extension with the stock tritonclient and its shm utilities.

The client creates POSIX shared memory (tritonclient.utils.shared_memory, its own C library),
registers it over HTTP, and names regions in place of tensor data; a real uvicorn serves an
ONNX Identity model on ONNX Runtime.
"""

from __future__ import annotations

import gc
import os
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.http as triton
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException, serialize_byte_tensor, serialized_byte_size

from edgeserve import cudamemory
from edgeserve.builder import build
from edgeserve.bundle import Bundle
from edgeserve.http import create_app
from edgeserve.runtime import Runtime
from edgeserve.sharedmemory import Regions, Slice
from tests.models import identity_model, write_function
from tests.server import Server, running
from tests.threaded_server import serving

MANIFEST = """
[function]
name = "identity"
[batching]
max_batch_size = 8
max_queue_delay_ms = 1
[backend]
prefer = ["onnxruntime"]
"""
X = np.arange(12, dtype=np.float32).reshape(4, 3) / 4
N = np.arange(12, dtype=np.int64).reshape(4, 3) * -3
WORDS = np.array([[b"a", b"bc", b""]] * 4, dtype=object)


def x_from_region(name: str, offset: int = 0, size: int = X.nbytes) -> list[triton.InferInput]:
    """The identity model's inputs: in_FP32 named in region `name`, the others in the body."""
    tensor = triton.InferInput("in_FP32", [4, 3], "FP32")
    tensor.set_shared_memory(name, size, offset=offset)
    return [
        tensor,
        triton.InferInput("in_INT64", [4, 3], "INT64").set_data_from_numpy(N),
        triton.InferInput("in_BYTES", [4, 3], "BYTES").set_data_from_numpy(WORDS),
    ]


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Bundle:
    root = tmp_path_factory.mktemp("shm")

    def model(path: Path) -> Path:
        return identity_model(path, ("FP32", "INT64", "BYTES"))

    return build(write_function(root / "src", model, MANIFEST), root / "bundle")


@pytest.fixture(scope="module")
def url(bundle: Bundle) -> Iterator[str]:
    with serving(create_app(Runtime.load(bundle))) as base_url:
        yield base_url


@pytest.fixture(scope="module")
def client(url: str) -> Iterator[triton.InferenceServerClient]:
    client = triton.InferenceServerClient(url.removeprefix("http://"))
    yield client
    client.unregister_system_shared_memory()
    client.close()
    del client
    # tracebacks kept by pytest.raises hold the client in cycles: collect them on this thread,
    # since geventhttpclient refuses to close its pool from another (a uvicorn thread's GC)
    gc.collect()


@pytest.fixture
def region(client: triton.InferenceServerClient) -> Iterator[tuple[str, str, object]]:
    """A fresh 4 KiB POSIX shared-memory object: (region name, key, handle); unregistered and
    destroyed afterwards."""
    name = f"r{uuid.uuid4().hex[:8]}"
    handle = shm.create_shared_memory_region(name, f"/{name}", 4096)
    yield name, f"/{name}", handle
    client.unregister_system_shared_memory(name)
    shm.destroy_shared_memory_region(handle)


def test_inputs_and_outputs_travel_through_one_region(
    client: triton.InferenceServerClient, region: tuple[str, str, object]
) -> None:
    name, key, handle = region
    words = serialize_byte_tensor(WORDS)
    words_size = serialized_byte_size(words)
    shm.set_shared_memory_region(handle, [X, N])  # X at 0, N right after it
    shm.set_shared_memory_region(handle, [words], offset=X.nbytes + N.nbytes)
    client.register_system_shared_memory(name, key, 4096)
    assert client.get_system_shared_memory_status(name) == [
        {"name": name, "key": key, "offset": 0, "byte_size": 4096}
    ]
    inputs = [
        triton.InferInput("in_FP32", [4, 3], "FP32"),
        triton.InferInput("in_INT64", [4, 3], "INT64"),
        triton.InferInput("in_BYTES", [4, 3], "BYTES"),
    ]
    inputs[0].set_shared_memory(name, X.nbytes)
    inputs[1].set_shared_memory(name, N.nbytes, offset=X.nbytes)
    inputs[2].set_shared_memory(name, words_size, offset=X.nbytes + N.nbytes)
    out_at = 2048
    outputs = [triton.InferRequestedOutput("out_FP32"), triton.InferRequestedOutput("out_INT64")]
    outputs[0].set_shared_memory(name, 1024, offset=out_at)
    outputs[1].set_shared_memory(name, 1024, offset=out_at + 1024)
    outputs.append(triton.InferRequestedOutput("out_BYTES", binary_data=False))
    result = client.infer("identity", inputs, outputs=outputs)
    fp32 = result.get_output("out_FP32")
    assert "data" not in fp32 and "parameters" not in fp32  # in the region, as Triton answers
    got = shm.get_contents_as_numpy(handle, np.float32, fp32["shape"], offset=out_at)
    np.testing.assert_array_equal(got, X)
    got = shm.get_contents_as_numpy(handle, np.int64, [4, 3], offset=out_at + 1024)
    np.testing.assert_array_equal(got, N)
    assert result.as_numpy("out_BYTES").tolist() == [["a", "bc", ""]] * 4


def test_a_registration_may_cover_part_of_the_object(
    client: triton.InferenceServerClient, region: tuple[str, str, object]
) -> None:
    name, key, handle = region
    shm.set_shared_memory_region(handle, [X], offset=1000)
    client.register_system_shared_memory(name, key, X.nbytes, offset=1000)
    inputs = x_from_region(name)  # offsets count from the registered window
    result = client.infer("identity", inputs)
    np.testing.assert_array_equal(result.as_numpy("out_FP32"), X)
    client.unregister_system_shared_memory(name)
    with pytest.raises(InferenceServerException) as error:
        client.infer("identity", inputs)
    assert error.value.status() == "400"
    assert f"shared memory region `{name}` is not registered" in error.value.message()


@pytest.mark.parametrize(
    ("key", "offset", "byte_size", "words"),
    [
        ("/no-such-key-i16", 0, 16, "cannot open key '/no-such-key-i16'"),
        ("KEY", 0, 8192, "must lie within key"),
        ("KEY", 4096, 1, "must lie within key"),
        ("KEY", 0, 0, "byte_size must be > 0"),
        ("/a/b", 0, 4, "`key` must be a shared-memory name"),
    ],
)
def test_bad_registrations_are_refused_with_the_reason(
    client: triton.InferenceServerClient,
    region: tuple[str, str, object],
    key: str,
    offset: int,
    byte_size: int,
    words: str,
) -> None:
    name, real_key, _ = region
    with pytest.raises(InferenceServerException) as error:
        client.register_system_shared_memory(
            name, real_key if key == "KEY" else key, byte_size, offset=offset
        )
    assert error.value.status() == "400"
    assert words in error.value.message()
    assert client.get_system_shared_memory_status() == []


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"offset": 0, "byte_size": 16}, "lacks ['key']"),
        ({"key": "/k"}, "lacks ['byte_size']"),
        ({"key": "/k", "offset": -1, "byte_size": 1}, "`offset` must be a non-negative integer"),
        ({"key": "/k", "byte_size": "16"}, "`byte_size` must be a non-negative integer"),
        ({"key": "/a\u0000b", "byte_size": 16}, "`key` must be a shared-memory name"),
    ],
)
def test_malformed_registrations_get_400(url: str, body: dict[str, object], words: str) -> None:
    """What the stock client never sends, sent raw."""
    response = httpx.post(f"{url}/v2/systemsharedmemory/region/r/register", json=body)
    assert response.status_code == 400
    assert words in response.json()["error"]


def test_status_and_unregister_of_an_unknown_region(
    client: triton.InferenceServerClient, url: str
) -> None:
    client.unregister_system_shared_memory("never-registered")  # a no-op, as in Triton
    response = httpx.get(f"{url}/v2/systemsharedmemory/region/never-registered/status")
    assert response.status_code == 404
    assert "no system shared memory region named `never-registered`" in response.json()["error"]


def test_shared_memory_windows_are_checked_before_running(
    client: triton.InferenceServerClient, region: tuple[str, str, object]
) -> None:
    name, key, _ = region
    client.register_system_shared_memory(name, key, 64)
    for size, offset, words in (
        (X.nbytes, 32, "runs past region"),
        (X.nbytes - 4, 4, "needs 48 bytes, but shared_memory_byte_size is 44"),
    ):
        with pytest.raises(InferenceServerException) as error:
            client.infer("identity", x_from_region(name, offset, size))
        assert error.value.status() == "400" and words in error.value.message()
    inputs = x_from_region(name)
    inputs[0].set_data_from_numpy(X)
    small = triton.InferRequestedOutput("out_FP32")
    small.set_shared_memory(name, 16)
    with pytest.raises(InferenceServerException) as error:
        client.infer("identity", inputs, outputs=[small])
    assert error.value.status() == "400"
    assert "output `out_FP32`: needs 48 bytes" in error.value.message()


def test_an_object_shrunk_after_registering_is_a_400_not_a_dead_server(
    client: triton.InferenceServerClient, region: tuple[str, str, object]
) -> None:
    """Reading a mapping past its object's end kills the process (SIGBUS): a client that
    truncates its object after registering it gets a 400, and the server serves on."""
    name, key, handle = region
    shm.set_shared_memory_region(handle, [X])
    client.register_system_shared_memory(name, key, 1024)
    first = client.infer("identity", x_from_region(name))
    np.testing.assert_array_equal(first.as_numpy("out_FP32"), X)
    os.truncate(f"/dev/shm/{name}", 16)
    with pytest.raises(InferenceServerException) as error:
        client.infer("identity", x_from_region(name))
    assert error.value.status() == "400"
    assert f"key '{key}' is now 16 bytes" in error.value.message()
    output = triton.InferRequestedOutput("out_FP32")
    output.set_shared_memory(name, X.nbytes, offset=64)
    inputs = x_from_region(name)
    inputs[0].set_data_from_numpy(X)
    with pytest.raises(InferenceServerException, match="is now 16 bytes"):
        client.infer("identity", inputs, outputs=[output])  # nor written past it
    after = client.infer("identity", inputs)
    np.testing.assert_array_equal(after.as_numpy("out_FP32"), X)


WAITING = MANIFEST.replace("max_queue_delay_ms = 1", "max_queue_delay_ms = 600")
"""A batch waits 0.6 s for company: a lone request sits in the queue while its client acts."""


def test_an_object_shrunk_while_its_request_waits_is_never_read_past_its_end(
    tmp_path: Path,
) -> None:
    """A check of the object's size before a request cannot stop a shrink right after it: the
    server used to map the object and let the request's tensor be a view of the mapping, so a
    client that shrank the object while its request waited for a batch killed `edgeserve serve`
    (SIGBUS) with every request in flight. Now the request runs on what was read when it
    arrived, the next one is a 400, and the server serves on."""
    source = write_function(
        tmp_path / "src", lambda p: identity_model(p, ("FP32", "INT64", "BYTES")), WAITING
    )
    with serving_a_region(source, 1 << 20, X) as (url, server, client, name):
        answers: list[httpx.Response | httpx.HTTPError] = []
        waiting = threading.Thread(target=lambda: answers.append(_infer(url, name)))
        waiting.start()
        time.sleep(0.3)  # the request is in the queue, its tensor read
        os.truncate(f"/dev/shm/{name}", 0)
        waiting.join(timeout=30)
        assert server.process.poll() is None, f"server died: {server.process.returncode}"
        first = answers[0]
        assert isinstance(first, httpx.Response), first
        assert first.status_code == 200, first.text
        assert first.json()["outputs"][0]["data"] == X.reshape(-1).tolist()
        with pytest.raises(InferenceServerException) as error:
            client.infer("identity", x_from_region(name))
        assert error.value.status() == "400"
        assert f"key '/{name}' is now 0 bytes" in error.value.message()
        assert httpx.get(f"{url}/v2/health/ready").status_code == 200


def test_inputs_in_shared_memory_are_held_to_the_body_limit(tmp_path: Path) -> None:
    """Inputs are copied out of their region, so they are held to the limit a body is (1 MB
    here): a client naming 4 MiB of a sparse object gets a 413 before anything is read, as it
    would for a body that size, and a request within it is served."""
    manifest = WAITING.replace("max_queue_delay_ms = 600", "max_queue_delay_ms = 1")
    source = write_function(
        tmp_path / "src",
        lambda p: identity_model(p, ("FP32",), row=1024),
        manifest + "[resources]\nmax_body_mb = 1\n",
    )
    with serving_a_region(source, 4 << 20) as (_, _, client, name):
        for rows, status in ((1024, "413"), (16, None)):
            tensor = triton.InferInput("in_FP32", [rows, 1024], "FP32")
            tensor.set_shared_memory(name, rows * 4096)
            if status is None:
                result = client.infer("identity", [tensor])
                assert result.as_numpy("out_FP32").shape == (rows, 1024)
                continue
            with pytest.raises(InferenceServerException) as error:
                client.infer("identity", [tensor])
            assert error.value.status() == status
            words = "shared memory add up to 4194304 bytes, over the limit of 1048576"
            assert words in error.value.message()


@contextmanager
def serving_a_region(
    source: Path, size: int, data: np.ndarray | None = None
) -> Iterator[tuple[str, Server, triton.InferenceServerClient, str]]:
    """`edgeserve serve SOURCE` with a fresh object of `size` bytes (holding `data`) registered
    whole: (url, server, a tritonclient, the region's name)."""
    name = f"r{uuid.uuid4().hex[:8]}"
    handle = shm.create_shared_memory_region(name, f"/{name}", size)
    try:
        if data is not None:
            shm.set_shared_memory_region(handle, [data])
        with running(source) as (url, server):
            client = triton.InferenceServerClient(url.removeprefix("http://"))
            try:
                client.register_system_shared_memory(name, f"/{name}", size)
                yield url, server, client, name
            finally:
                client.close()
                del client
                gc.collect()
    finally:
        shm.destroy_shared_memory_region(handle)


def _infer(url: str, region: str) -> httpx.Response | httpx.HTTPError:
    """X from `region` (the other inputs in the body) as v2 JSON; out_FP32 only."""
    place = {"shared_memory_region": region, "shared_memory_byte_size": X.nbytes}
    body = {
        "inputs": [
            {"name": "in_FP32", "datatype": "FP32", "shape": [4, 3], "parameters": place},
            {"name": "in_INT64", "datatype": "INT64", "shape": [4, 3], "data": N.tolist()},
            {"name": "in_BYTES", "datatype": "BYTES", "shape": [4, 3], "data": [["a"] * 3] * 4},
        ],
        "outputs": [{"name": "out_FP32"}],
    }
    try:
        return httpx.post(f"{url}/v2/models/identity/infer", json=body, timeout=30)
    except httpx.HTTPError as exc:  # the server died under it: reported by the test
        return exc


def test_unregistered_regions_leave_no_file_descriptor_open(tmp_path: Path) -> None:
    """A client that registered and unregistered regions of fresh names (one per session) left
    the server two file descriptors each, until it could accept no connection: now
    unregistering closes them."""
    source = write_function(
        tmp_path / "src", lambda p: identity_model(p, ("FP32", "INT64", "BYTES")), MANIFEST
    )
    name = f"r{uuid.uuid4().hex[:8]}"
    handle = shm.create_shared_memory_region(name, f"/{name}", 4096)
    try:
        with running(source, "--workers", "1") as (url, server):
            fds = Path(f"/proc/{server.process.pid}/fd")
            before = len(list(fds.iterdir()))
            with httpx.Client(base_url=f"{url}/v2/systemsharedmemory") as client:
                for session in range(200):
                    body = {"key": f"/{name}", "offset": 0, "byte_size": 64}
                    register = client.post(f"/region/s{session}/register", json=body)
                    assert register.status_code == 200, register.text
                    assert client.post(f"/region/s{session}/unregister").status_code == 200
                assert client.get("/status").json() == []
            assert len(list(fds.iterdir())) < before + 10
    finally:
        shm.destroy_shared_memory_region(handle)


def test_a_front_lets_go_of_regions_another_front_unregistered(
    tmp_path: Path, region: tuple[str, str, object]
) -> None:
    """Fronts of `--workers N` share registrations: a region one front opened for a request
    and another front unregistered is closed by the first at its next registration change."""
    _, key, _ = region
    store = tmp_path / "regions"
    first, second = Regions(store=store), Regions(store=store)
    fds = Path("/proc/self/fd")
    before = len(list(fds.iterdir()))
    for session in range(50):
        first.register("system", f"s{session}", {"key": key, "byte_size": 64})
        second.read("input", Slice(f"s{session}", 0, 8))  # opened by the second front too
        first.unregister("system", f"s{session}")
    second.unregister("system", "never-registered")
    assert len(list(fds.iterdir())) <= before + 1


def test_a_registry_shared_by_processes_takes_names_of_any_length(
    tmp_path: Path, region: tuple[str, str, object]
) -> None:
    """A store keeps a file per name; a name of 300 characters (past a file name's 255 bytes
    as hex) registers, shows and unregisters as a short one does."""
    _, key, _ = region
    regions, name = Regions(store=tmp_path / "regions"), "r" * 300
    regions.register("system", name, {"key": key, "byte_size": 64})
    assert regions.status("system", name)[0]["name"] == name
    regions.unregister("system", name)
    assert regions.status("system") == []


def test_only_clients_on_this_machine_may_use_shared_memory(
    url: str, region: tuple[str, str, object]
) -> None:
    """A remote client, as a reverse proxy on this machine forwards it (uvicorn trusts the
    loopback proxy's X-Forwarded-For), could map any object in /dev/shm: refused."""
    name, key, _ = region
    body = {"key": key, "offset": 0, "byte_size": 16}
    path = f"{url}/v2/systemsharedmemory/region/{name}/register"
    remote = httpx.post(path, json=body, headers={"X-Forwarded-For": "203.0.113.7"})
    assert remote.status_code == 403
    assert remote.json()["error"].startswith(
        "system shared memory is for clients on this machine; 203.0.113.7 is not on a loopback"
    )
    for kind, named in (("system", "system"), ("cuda", "CUDA")):  # each route names its kind
        status = httpx.get(
            f"{url}/v2/{kind}sharedmemory/status", headers={"X-Forwarded-For": "203.0.113.7"}
        )
        assert status.status_code == 403
        assert status.json()["error"].startswith(f"{named} shared memory is for clients")
    assert httpx.post(path, json=body).status_code == 200
    tensor = {"name": "in_FP32", "datatype": "FP32", "shape": [1, 3]}
    others = [
        {"name": "in_INT64", "datatype": "INT64", "shape": [1, 3], "data": [1, 2, 3]},
        {"name": "in_BYTES", "datatype": "BYTES", "shape": [1, 3], "data": ["a", "b", "c"]},
    ]
    sneaky = {
        "inputs": [
            {**tensor, "parameters": {"shared_memory_region": name, "shared_memory_byte_size": 12}},
            *others,
        ]
    }
    infer = httpx.post(
        f"{url}/v2/models/identity/infer",
        json=sneaky,
        headers={"X-Forwarded-For": "203.0.113.7"},
    )
    assert infer.status_code == 403  # a region registered locally is not readable remotely
    local = httpx.post(f"{url}/v2/models/identity/infer", json=sneaky)
    assert local.status_code == 200, local.text


def test_a_symlink_in_dev_shm_is_not_followed(url: str, tmp_path: Path) -> None:
    target = tmp_path / "secret"
    target.write_bytes(b"x" * 64)
    link = Path("/dev/shm") / f"i16-link-{uuid.uuid4().hex[:8]}"
    link.symlink_to(target)
    try:
        response = httpx.post(
            f"{url}/v2/systemsharedmemory/region/link/register",
            json={"key": f"/{link.name}", "offset": 0, "byte_size": 16},
        )
    finally:
        link.unlink()
    assert response.status_code == 400
    assert f"cannot open key '/{link.name}'" in response.json()["error"]


@pytest.mark.skipif(cudamemory.available(), reason="this machine serves CUDA regions")
def test_cuda_shared_memory_without_cuda_region_support(
    client: triton.InferenceServerClient,
) -> None:
    """Listed as empty and unregistered as a no-op (clients clean up both kinds); register
    says what to use instead."""
    assert client.get_cuda_shared_memory_status() == []
    client.unregister_cuda_shared_memory()
    with pytest.raises(InferenceServerException) as error:
        client.register_cuda_shared_memory("gpu0", b"\0" * 64, 0, 1024)
    assert error.value.status() == "400"
    assert "Hint: use system shared memory (/v2/systemsharedmemory)" in error.value.message()


def test_processes_sharing_a_store_share_registrations(
    bundle: Bundle, tmp_path: Path, region: tuple[str, str, object]
) -> None:
    """Two servers of one function, as the front processes of `workers` are: a region
    registered through one serves requests that reach the other, and a re-registration under
    the same name is seen by both."""
    name, key, handle = region
    store = tmp_path / "regions"
    apps = [create_app(Runtime.load(bundle), regions=Regions(store=store)) for _ in range(2)]
    with serving(apps[0]) as first_url, serving(apps[1]) as second_url:
        first, second = (
            triton.InferenceServerClient(u.removeprefix("http://")) for u in (first_url, second_url)
        )
        try:
            shm.set_shared_memory_region(handle, [X])
            first.register_system_shared_memory(name, key, 1024)
            assert second.get_system_shared_memory_status(name)[0]["key"] == key
            with pytest.raises(InferenceServerException, match="already registered"):
                second.register_system_shared_memory(name, key, 64)
            inputs = x_from_region(name)
            result = second.infer("identity", inputs)
            np.testing.assert_array_equal(result.as_numpy("out_FP32"), X)
            second.unregister_system_shared_memory(name)
            first.register_system_shared_memory(name, key, 1024, offset=X.nbytes)
            shm.set_shared_memory_region(handle, [X * 2], offset=X.nbytes)
            result = second.infer("identity", inputs)  # mapped anew: the new window
            np.testing.assert_array_equal(result.as_numpy("out_FP32"), X * 2)
            first.unregister_system_shared_memory()
            with pytest.raises(InferenceServerException, match="is not registered"):
                second.infer("identity", inputs)
        finally:
            for client in (first, second):
                client.close()
            del first, second
            gc.collect()
