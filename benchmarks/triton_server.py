"""Serve one benchmark model with a real Triton server (PyTriton) and its dynamic batcher.

Runs under the separate PyTriton venv (benchmarks/.venv-triton), never the project's:

    benchmarks/.venv-triton/bin/python benchmarks/triton_server.py MODEL.onnx NAME PORT \
        --threads 0 --max-batch 32 --delay-us 2000 [--cuda]

The bound callable runs the same ONNX model with ONNX Runtime and the same thread settings as
edgeserve's onnxruntime backend (intra-op `threads`, one inter-op thread, sequential).
"""

from __future__ import annotations

import argparse

import numpy as np
import onnxruntime as ort
from pytriton.decorators import batch
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig, TritonSecurityConfig


def session(path: str, threads: int, cuda: bool) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if not cuda:
        return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    ort.preload_dlls()  # onnxruntime-gpu: the pip CUDA and cuDNN libraries
    gpu = ("CUDAExecutionProvider", {"device_id": "0", "use_tf32": "0"})  # as edgeserve's
    return ort.InferenceSession(path, options, providers=[gpu, "CPUExecutionProvider"])


def warm_shape(arg: ort.NodeArg, rows: int) -> list[int]:
    """`rows` on the batch axis, 1 on any other dynamic axis."""
    return [rows, *(d if isinstance(d, int) and d > 0 else 1 for d in arg.shape[1:])]


def _dtype(arg: ort.NodeArg) -> np.dtype:
    return np.dtype(np.float16 if arg.type == "tensor(float16)" else np.float32)


def tensors(args: list[ort.NodeArg]) -> list[Tensor]:
    """Triton's shapes exclude the batch axis; dynamic dims stay -1."""
    return [
        Tensor(
            name=a.name,
            dtype=np.float32,
            shape=tuple(d if isinstance(d, int) else -1 for d in a.shape[1:]),
        )
        for a in args
    ]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("name")
    parser.add_argument("port", type=int)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--max-batch", type=int, default=32)
    parser.add_argument("--delay-us", type=int, default=2000)
    parser.add_argument("--cuda", action="store_true", help="ONNX Runtime's CUDA provider")
    args = parser.parse_args()
    sess = session(args.model, args.threads, args.cuda)
    outputs = [o.name for o in sess.get_outputs()]

    if args.cuda:  # every batch size once: cuDNN's search for a new shape is not measured
        for rows in range(1, args.max_batch + 1):
            sess.run(
                None, {a.name: np.zeros(warm_shape(a, rows), _dtype(a)) for a in sess.get_inputs()}
            )

    @batch
    def infer(**inputs: np.ndarray) -> dict[str, np.ndarray]:
        return dict(zip(outputs, sess.run(outputs, inputs), strict=True))

    config = TritonConfig(
        http_port=args.port, grpc_port=args.port + 1, metrics_port=args.port + 2, log_verbose=0
    )
    # perf_analyzer reads the statistics endpoint, which PyTriton 0.7 restricts to a token of its
    # own by default: nothing restricted here (loopback, a benchmark)
    unrestricted = TritonSecurityConfig(restricted_endpoints=[])
    with Triton(config=config, security_config=unrestricted) as triton:
        triton.bind(
            model_name=args.name,
            infer_func=infer,
            inputs=tensors(sess.get_inputs()),
            outputs=tensors(sess.get_outputs()),
            config=ModelConfig(
                max_batch_size=args.max_batch,
                batcher=DynamicBatcher(max_queue_delay_microseconds=args.delay_us),
            ),
            strict=False,
        )
        triton.serve()


if __name__ == "__main__":
    main()
