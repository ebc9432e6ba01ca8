"""Rows the GPU reads where they lie: the fronts' arenas registered with CUDA (registered.py).

The registry's bookkeeping (chunks registered on first use, a retired arena unregistered after
its last copy) is checked on any machine against a stand-in for libcudart that records calls:
CUDA cannot exist on CI. The copies themselves run on a GPU (skipped without one): a batch of
large rows from an arena and from plain memory answers as the CPU does, through the backend and
through `edgeserve serve --workers 2`.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.http as triton

from edgeserve.backends import load_backend
from edgeserve.backends.registered import CHUNK, DIRECT_BYTES, Registry
from edgeserve.hardware import probe_gpus
from edgeserve.manifest import ModelSection
from edgeserve.shapes import ShapeRange
from edgeserve.signature import read_signature
from edgeserve.workers.arena import Arena
from tests.models import mlp_model, write_function
from tests.server import running

NO_CUDA = not probe_gpus() or "CUDAExecutionProvider" not in ort.get_available_providers()
WIDE = DIRECT_BYTES // 4 + 1000  # FP32 columns: one row is read in place


class RecordingCudart:
    """Stands in for libcudart (none on CI): every call succeeds and is recorded."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int, int]] = []
        self.held = self.released = self

    def cudaHostRegister(self, address: int, size: int, flags: int) -> int:
        self.calls.append(("register", address, size))
        return 0

    def cudaHostUnregister(self, address: int) -> int:
        self.calls.append(("unregister", address, 0))
        return 0

    def check(self, status: int, call: str) -> None:
        assert status == 0


def test_arenas_register_by_chunk_and_unregister_after_the_last_copy_cuda_stand_in() -> None:
    registry = Registry()
    cudart = RecordingCudart()
    arena = Arena.create(2 * CHUNK + 4096)
    start = int(np.frombuffer(arena.buffer, np.uint8, count=1).ctypes.data)
    registry.share(arena.buffer)  # not enabled: nothing is kept
    assert registry.lease(start, 10) is None

    registry.enable(cudart)  # type: ignore[arg-type]
    registry.share(arena.buffer)
    first = registry.lease(start + 100, 1000)
    again = registry.lease(start + 2000, 1000)
    assert first is not None and again is first
    assert cudart.calls == [("register", start, CHUNK)]
    assert registry.lease(start + CHUNK - 10, 20) is None  # across two chunks: staged
    assert registry.lease(start - 1, 10) is None  # outside every arena
    last = registry.lease(start + 2 * CHUNK, 4096)  # the short last chunk
    assert last is first
    assert cudart.calls[-1] == ("register", start + 2 * CHUNK, 4096)
    assert registry.registered_bytes() == CHUNK + 4096

    registry.retire(arena.buffer)  # three copies still read it: nothing is unregistered yet
    assert registry.lease(start + 100, 10) is None
    for _ in range(2):
        registry.release(first)
    assert not [call for call in cudart.calls if call[0] == "unregister"]
    registry.release(first)
    unregistered = sorted(address for kind, address, _ in cudart.calls if kind == "unregister")
    assert unregistered == [start, start + 2 * CHUNK]
    assert registry.registered_bytes() == 0
    arena.close()


def wide_model(path: Path) -> Path:
    return mlp_model(path, n_in=WIDE, hidden=8, n_out=3)


def reference(model: Path, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


@pytest.mark.gpu
@pytest.mark.skipif(NO_CUDA, reason="needs onnxruntime-gpu with CUDA and an NVIDIA GPU")
def test_rows_from_an_arena_and_from_plain_memory_answer_as_the_cpu_on_cuda(tmp_path: Path) -> None:
    from edgeserve.backends.registered import REGISTRY

    model = wide_model(tmp_path / "model.onnx")
    signature = read_signature(model, ModelSection())
    profile = {"x": ShapeRange((1, WIDE), (4, WIDE), (8, WIDE))}
    backend: Any = load_backend(
        "onnxruntime", model, signature=signature, device="cuda:0", profile=profile
    )
    arena = Arena.create(64 * 2**20)
    REGISTRY.share(arena.buffer)
    rng = np.random.default_rng(0)
    try:
        for sizes in ((1, 2, 1, 3), (2, 1), (1,)):  # fewer rows each time: the rows past refill
            requests = [rng.random((rows, WIDE), np.float32) for rows in sizes]
            offset, parts = 0, []
            for index, x in enumerate(requests):
                if index % 2:  # every other request from plain memory (staged by the CPU)
                    parts.append({"x": x})
                    continue
                placed = arena.place({"x": x}, offset, x.nbytes)
                offset += -(-x.nbytes // 4096) * 4096
                parts.append(arena.tensors(placed))
            outputs = backend.infer(backend.assemble(parts, {"x": 0.0}))["y"]
            expected = reference(model, np.concatenate(requests))
            np.testing.assert_allclose(outputs, expected, rtol=1e-3, atol=1e-3)
        assert REGISTRY.registered_bytes() >= DIRECT_BYTES  # the arena's rows were read in place
    finally:
        REGISTRY.retire(arena.buffer)
        backend.close()
    assert REGISTRY.registered_bytes() == 0
    arena.close()


MANIFEST = """
[function]
name = "wide"
[batching]
max_batch_size = 8
max_queue_delay_ms = 2
[backend]
prefer = ["onnxruntime"]
precision = "fp32"
"""


@pytest.mark.gpu
@pytest.mark.skipif(NO_CUDA, reason="needs onnxruntime-gpu with CUDA and an NVIDIA GPU")
def test_fronts_rows_read_in_place_answer_each_request_on_cuda(tmp_path: Path) -> None:
    folder = write_function(tmp_path / "wide", wide_model, MANIFEST)
    rng = np.random.default_rng(1)
    requests = [rng.random((1 + index % 2, WIDE), np.float32) for index in range(48)]
    with running(folder, "--workers", "3") as (url, _), ThreadPoolExecutor(12) as pool:
        client = triton.InferenceServerClient(url.removeprefix("http://"), concurrency=12)

        def infer(x: np.ndarray) -> np.ndarray:
            tensor = triton.InferInput("x", list(x.shape), "FP32")
            tensor.set_data_from_numpy(x, binary_data=True)
            return client.infer("wide", [tensor]).as_numpy("y")

        answers = list(pool.map(infer, requests))
    expected = [reference(folder / "model.onnx", x) for x in requests]
    for answer, wanted in zip(answers, expected, strict=True):
        np.testing.assert_allclose(answer, wanted, rtol=1e-3, atol=1e-3)
