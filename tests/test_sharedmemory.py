"""Triton's system shared-memory extension with the stock tritonclient and its shm utilities.

The client creates POSIX shared memory (tritonclient.utils.shared_memory, its own C library),
registers it over HTTP, and names regions in place of tensor data; a real uvicorn serves an
ONNX Identity model on ONNX Runtime.
"""

from __future__ import annotations

import gc
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.http as triton
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException, serialize_byte_tensor, serialized_byte_size

from edgeserve.builder import build
from edgeserve.http import create_app
from edgeserve.runtime import Runtime
from tests.models import identity_model, write_function
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


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("shm")

    def model(path: Path) -> Path:
        return identity_model(path, ("FP32", "INT64", "BYTES"))

    source = write_function(root / "src", model, MANIFEST)
    with serving(create_app(Runtime.load(build(source, root / "bundle")))) as base_url:
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
    tensor = triton.InferInput("in_FP32", [4, 3], "FP32")
    tensor.set_shared_memory(name, X.nbytes)  # offsets count from the registered window
    others = [
        triton.InferInput("in_INT64", [4, 3], "INT64").set_data_from_numpy(N),
        triton.InferInput("in_BYTES", [4, 3], "BYTES").set_data_from_numpy(WORDS),
    ]
    result = client.infer("identity", [tensor, *others])
    np.testing.assert_array_equal(result.as_numpy("out_FP32"), X)
    client.unregister_system_shared_memory(name)
    with pytest.raises(InferenceServerException) as error:
        client.infer("identity", [tensor, *others])
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
    tensor = triton.InferInput("in_FP32", [4, 3], "FP32")
    others = [
        triton.InferInput("in_INT64", [4, 3], "INT64").set_data_from_numpy(N),
        triton.InferInput("in_BYTES", [4, 3], "BYTES").set_data_from_numpy(WORDS),
    ]
    for size, offset, words in (
        (X.nbytes, 32, "runs past region"),
        (X.nbytes - 4, 4, "needs 48 bytes, its data has 44"),
    ):
        tensor.set_shared_memory(name, size, offset=offset)
        with pytest.raises(InferenceServerException) as error:
            client.infer("identity", [tensor, *others])
        assert error.value.status() == "400" and words in error.value.message()
    tensor.set_data_from_numpy(X)
    small = triton.InferRequestedOutput("out_FP32")
    small.set_shared_memory(name, 16)
    with pytest.raises(InferenceServerException) as error:
        client.infer("identity", [tensor, *others], outputs=[small])
    assert error.value.status() == "400"
    assert "output `out_FP32`: needs 48 bytes" in error.value.message()
