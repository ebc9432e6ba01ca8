"""Triton's CUDA shared-memory extension with the stock tritonclient utilities (needs a GPU),
over HTTP and over gRPC.

tritonclient.utils.cuda_shared_memory allocates GPU memory and exports CUDA IPC handles (it needs
cuda-python 12.x, whose `cuda.cudart` it imports); a real `edgeserve serve` in another process
(a CUDA IPC handle opens only in another process than its maker's) opens them, reads inputs from
them and writes outputs into them. Without a GPU, or those packages, the module is skipped.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from edgeserve.builder import build
from edgeserve.bundle import Bundle
from edgeserve.hardware import probe_gpus
from tests.models import identity_model, write_function
from tests.server import running
from tests.test_grpc import grpc_url
from tests.test_sharedmemory import MANIFEST, X  # the same identity function, the same input

try:
    with warnings.catch_warnings():  # cuda-python 12.9 warns that cuda.cudart is deprecated
        warnings.simplefilter("ignore", FutureWarning)
        import tritonclient.utils.cuda_shared_memory as cudashm
except (ImportError, RuntimeError) as error:  # RuntimeError: it found no `cuda.cudart`
    pytest.skip(f"tritonclient's CUDA shm utilities: {error}", allow_module_level=True)
if not probe_gpus():
    pytest.skip("needs an NVIDIA GPU", allow_module_level=True)

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def urls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """The identity function served once: its HTTP `host:port` and its gRPC one."""
    root = tmp_path_factory.mktemp("cudashm")

    def model(path: Path) -> Path:
        return identity_model(path, ("FP32",))

    bundle: Bundle = build(write_function(root / "src", model, MANIFEST), root / "bundle")
    with running(bundle.root, "--grpc-port", "0") as (url, server):
        yield url.removeprefix("http://"), grpc_url(server)


@pytest.fixture(scope="module")
def client(urls: tuple[str, str]) -> Iterator[triton.InferenceServerClient]:
    client = triton.InferenceServerClient(urls[0])
    yield client
    client.unregister_cuda_shared_memory()
    client.close()


@pytest.fixture
def regions(client: triton.InferenceServerClient) -> Iterator[tuple[object, object]]:
    """Two GPU regions, "in" holding X and "out" of the same size, registered."""
    made = [cudashm.create_shared_memory_region(name, X.nbytes, 0) for name in ("in", "out")]
    cudashm.set_shared_memory_region(made[0], [X])
    for name, handle in zip(("in", "out"), made, strict=True):
        client.register_cuda_shared_memory(name, cudashm.get_raw_handle(handle), 0, X.nbytes)
    yield made[0], made[1]
    client.unregister_cuda_shared_memory()
    for handle in made:
        cudashm.destroy_shared_memory_region(handle)


def test_inputs_and_outputs_travel_through_gpu_memory(
    client: triton.InferenceServerClient, regions: tuple[object, object]
) -> None:
    _, out = regions
    assert sorted(client.get_cuda_shared_memory_status(), key=lambda r: r["name"]) == [
        {"name": "in", "device_id": 0, "byte_size": X.nbytes},
        {"name": "out", "device_id": 0, "byte_size": X.nbytes},
    ]
    tensor = triton.InferInput("in_FP32", [4, 3], "FP32")
    tensor.set_shared_memory("in", X.nbytes)
    wanted = triton.InferRequestedOutput("out_FP32")
    wanted.set_shared_memory("out", X.nbytes)
    result = client.infer("identity", [tensor], outputs=[wanted])
    assert "data" not in result.get_output("out_FP32")  # in the region, as Triton answers
    got = cudashm.get_contents_as_numpy(out, np.float32, [4, 3])
    np.testing.assert_array_equal(got, X)


def test_an_unregistered_region_is_refused(
    client: triton.InferenceServerClient, regions: tuple[object, object]
) -> None:
    client.unregister_cuda_shared_memory("in")
    tensor = triton.InferInput("in_FP32", [4, 3], "FP32")
    tensor.set_shared_memory("in", X.nbytes)
    with pytest.raises(InferenceServerException) as error:
        client.infer("identity", [tensor])
    assert error.value.status() == "400"
    assert "`in` is not registered" in error.value.message()


def test_a_handle_that_does_not_open_is_a_400(client: triton.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException) as error:
        client.register_cuda_shared_memory("bad", b"A" * 88, 0, 1024)  # base64 of 66 bytes
    assert error.value.status() == "400"
    assert "64-byte cudaIpcMemHandle_t" in error.value.message()


def test_grpc_reads_and_writes_gpu_regions(urls: tuple[str, str]) -> None:
    """tritonclient.grpc registers its own regions over gRPC; its outputs land in GPU memory."""
    remote = triton_grpc.InferenceServerClient(urls[1])
    made = [cudashm.create_shared_memory_region(f"g{name}", X.nbytes, 0) for name in "io"]
    try:
        cudashm.set_shared_memory_region(made[0], [X])
        for name, handle in zip(("gi", "go"), made, strict=True):
            remote.register_cuda_shared_memory(name, cudashm.get_raw_handle(handle), 0, X.nbytes)
        status = remote.get_cuda_shared_memory_status(as_json=True)["regions"]
        assert sorted(region["name"] for region in status.values()) == ["gi", "go"]
        tensor = triton_grpc.InferInput("in_FP32", [4, 3], "FP32")
        tensor.set_shared_memory("gi", X.nbytes)
        wanted = triton_grpc.InferRequestedOutput("out_FP32")
        wanted.set_shared_memory("go", X.nbytes)
        result = remote.infer("identity", [tensor], outputs=[wanted])
        assert not any(result.get_response().raw_output_contents)  # in the region, as Triton
        got = cudashm.get_contents_as_numpy(made[1], np.float32, [4, 3])
        np.testing.assert_array_equal(got, X)
    finally:
        remote.unregister_cuda_shared_memory()
        remote.close()
        for handle in made:
            cudashm.destroy_shared_memory_region(handle)
