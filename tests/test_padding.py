"""Padded batching never leaks a batch-mate's length: requests of many lengths at once.

A real `edgeserve serve` runs a token model (tokens [N, L] -> embedded [N, L, 16] and pooled
[N, L // 2, 16]) whose input pads along L. Every answer must equal what the model gives that
request alone, shape included, however the requests were batched; the server's statistics
show whether they shared batches.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import numpy as np
import onnxruntime as ort
import pytest

from edgeserve.batching.padding import Cut, Padding
from edgeserve.builder import build
from edgeserve.errors import BackendError, ConfigError
from edgeserve.types import Signature, TensorSpec
from tests.models import tokens_model, write_function
from tests.server import served

BASE = """
[function]
name = "tokens"
[model.inputs.tokens]
pad_axis = 1
[batching]
max_batch_size = 32
max_queue_delay_ms = 30
[backend]
prefer = ["onnxruntime"]
"""
CUT = """
[model.outputs.embedded]
pad_axis = 1
[model.outputs.pooled]
pad_axis = 1
follows = "tokens"
ratio = 0.5
"""
LENGTHS = list(range(2, 26))


def alone(model: Path, tokens: np.ndarray) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    return dict(zip(["embedded", "pooled"], session.run(None, {"tokens": tokens}), strict=True))


def request(tokens: np.ndarray) -> dict:
    entry = {"name": "tokens", "datatype": "INT64", "shape": list(tokens.shape)}
    return {"inputs": [{**entry, "data": tokens.ravel().tolist()}]}


async def all_at_once(url: str, requests: list[np.ndarray]) -> list[dict]:
    async with httpx.AsyncClient(timeout=60) as client:
        replies = await asyncio.gather(
            *(client.post(f"{url}/v2/models/tokens/infer", json=request(t)) for t in requests)
        )
    assert all(reply.status_code == 200 for reply in replies), [r.text for r in replies]
    return [{o["name"]: o for o in reply.json()["outputs"]} for reply in replies]


def serve_and_compare(folder: Path) -> dict:
    """Send every length at once; check each answer against the model alone; the statistics."""
    rng = np.random.default_rng(1)
    requests = [rng.integers(1, 50, (1, n)) for n in LENGTHS]
    with served(folder) as url:
        answers = asyncio.run(all_at_once(url, requests))
        (stats,) = httpx.get(f"{url}/v2/models/tokens/stats").json()["model_stats"]
    for tokens, answer in zip(requests, answers, strict=True):
        expected = alone(folder / "model.onnx", tokens)
        for name, want in expected.items():
            assert answer[name]["shape"] == list(want.shape), (tokens.shape, name)
            got = np.asarray(answer[name]["data"], np.float32).reshape(want.shape)
            np.testing.assert_allclose(got, want, rtol=1e-6, err_msg=f"{name} L={tokens.shape}")
    return stats


def test_requests_of_many_lengths_share_batches_and_get_their_own_lengths(
    tmp_path: Path,
) -> None:
    folder = write_function(tmp_path / "tokens", tokens_model, BASE + CUT)
    stats = serve_and_compare(folder)
    assert stats["inference_count"] == len(LENGTHS)
    assert stats["execution_count"] < len(LENGTHS)  # lengths were padded into shared batches


def test_outputs_that_cannot_be_cut_keep_lengths_apart(tmp_path: Path) -> None:
    """No declaration for the outputs: padding would leak, so no two lengths share a batch."""
    folder = write_function(tmp_path / "tokens", tokens_model, BASE)
    stats = serve_and_compare(folder)
    assert stats["execution_count"] == stats["inference_count"] == len(LENGTHS)


def test_a_wrong_ratio_is_caught_on_the_first_padded_batch() -> None:
    signature = Signature(
        (TensorSpec("t", "INT64", (-1, -1), pad_axis=1),),
        (TensorSpec("p", "FP32", (-1, -1), pad_axis=1, follows="t", ratio=0.25),),
        True,
    )
    padding = Padding.of(signature)
    assert padding.cuts == (Cut("p", 1, "t", 1, 0.25),)
    parts = [{"p": np.zeros((1, 5))}, {"p": np.zeros((1, 5))}]  # the model halved 10: 5
    with pytest.raises(BackendError, match=r"ratio 0.25 says 2. Hint: fix \[model.outputs.p\]"):
        padding.cut_all(parts, [{"t": np.zeros((1, 10))}, {"t": np.zeros((1, 4))}], {"t": 10})


@pytest.mark.parametrize(
    ("table", "words"),
    [
        ('[model.outputs.pooled]\npad_axis = 1\nfollows = "nope"\n', "found 'nope'"),
        ('[model.outputs.pooled]\nfollows = "tokens"\n', "also give the output's pad_axis"),
        ("[model.outputs.pooled]\npad_axis = 3\n", "expected an axis in 1..2"),
        ("[model.inputs.tokens]\nratio = 0.5\n", "describe outputs only"),
    ],
)
def test_bad_declarations_fail_the_build(tmp_path: Path, table: str, words: str) -> None:
    manifest = BASE.replace("[model.inputs.tokens]\npad_axis = 1\n", "") + table
    if "inputs" not in table:
        manifest += "[model.inputs.tokens]\npad_axis = 1\n"
    folder = write_function(tmp_path / "tokens", tokens_model, manifest)
    with pytest.raises(ConfigError, match=words):
        build(folder, tmp_path / "out")
