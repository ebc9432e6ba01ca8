"""Requests that fail, time out or are given up, with front processes (`serve --workers 2`) as
in one process: the client reads the same answer, and what will not be answered costs no
compute. Through the CLI and a real server; compute is read from the server's own statistics
(v2 stats and /metrics), which count every row a batch ran."""

from __future__ import annotations

import functools
import re
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from edgeserve.builder import build
from edgeserve.http import create_app
from edgeserve.runtime import Runtime
from tests.models import slow_model, write_function
from tests.server import running
from tests.test_bad_input import LINES_HANDLER, PAGES  # the page of lines, one item each
from tests.test_workers import function as mlp_function
from tests.test_workers import infer_body
from tests.threaded_server import serving

GOOD, BAD = [1] * 16, [1] * 15 + [99]  # 99: past the 32-row table, seen by ONNX Runtime only
HOLD_MS = 1500  # how long a lone request waits for company


def pages(folder: Path, delay_ms: float = 200, timeout_ms: float = 30_000) -> Path:
    model = functools.partial(slow_model, depth=4, rows=16, vocab=32, via="Abs")
    batching = f"max_queue_delay_ms = {delay_ms}\ntimeout_ms = {timeout_ms}"
    manifest = PAGES.replace("max_queue_delay_ms = 200", batching)
    return write_function(folder, model, manifest, LINES_HANDLER)


def token_body(tokens: list[int], **parameters: int) -> dict:
    entry = {"name": "tokens", "datatype": "INT64", "shape": [1, len(tokens)], "data": tokens}
    return {"inputs": [entry], "parameters": parameters}


def stats(url: str) -> dict:
    """The function's v2 statistics (execution_count, inference_count, inference_stats)."""
    return httpx.get(f"{url}/v2/models/stats", timeout=5).json()["model_stats"][0]


def metric(url: str, name: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=5).text
    match = re.search(rf"^{name}\{{[^}}]*\}} (\S+)$", text, re.MULTILINE)
    assert match is not None, f"{name} not in /metrics"
    return float(match.group(1))


def answers(folder: Path, workers: str) -> list[tuple[int, str | None, dict]]:
    """What a client reads for errors raised in the batcher: a value the backend refuses
    (422), a deadline that passes in the queue (504), and the good request beside them."""
    infer = "/v2/models/pages/infer"
    with running(folder, "--workers", workers) as (url, _), httpx.Client(base_url=url) as client:
        sent = [
            client.post(infer, json=token_body(BAD), timeout=30),
            client.post(infer, json=token_body(GOOD, timeout=200_000), timeout=30),
            client.post(infer, json=token_body(GOOD), timeout=30),
            client.post("/invoke", json={"lines": [GOOD, BAD]}, timeout=30),
        ]
    return [(r.status_code, r.headers.get("retry-after"), r.json()) for r in sent]


def test_an_error_in_the_inference_process_reaches_the_client_as_in_one_process(
    tmp_path: Path,
) -> None:
    folder = pages(tmp_path / "pages", delay_ms=HOLD_MS)
    alone, split = answers(folder, "1"), answers(folder, "2")
    assert split == alone
    (bad, _, refused), (late, _, expired), (ok, _, _), (page, _, _) = split
    assert (bad, ok, page, late) == (422, 200, 422, 504)
    assert "idx=99" in refused["error"]
    assert expired == {
        "error": "deadline passed while queued; not run: the request's own timeout ran out: "
        "parameters.timeout = 200000 µs (200 ms from its arrival). Hint: ask for more (the "
        "function allows up to [batching] timeout_ms = 30000), or leave parameters.timeout out; "
        "a batch waits for company up to [batching] max_queue_delay_ms = 1500, as long as that "
        "limit or longer: lower it"
    }


def test_a_504_names_the_function_s_timeout_when_that_ran_out(tmp_path: Path) -> None:
    """A request without a timeout of its own, on v2 and /invoke, under [batching] timeout_ms:
    the 504 said "deadline passed while queued; not run", naming no limit to raise."""
    folder = pages(tmp_path / "pages", delay_ms=HOLD_MS, timeout_ms=300)
    app = create_app(Runtime.load(build(folder, tmp_path / "bundle")))
    with serving(app) as url, httpx.Client(base_url=url, timeout=30) as client:
        expired = [
            client.post("/v2/models/pages/infer", json=token_body(GOOD)),
            client.post("/invoke", json={"lines": [GOOD]}),
        ]
    for response in expired:
        assert response.status_code == 504
        assert response.json() == {
            "error": "deadline passed while queued; not run: the function's request timeout ran "
            "out: [batching] timeout_ms = 300 in function.toml (Triton's "
            "default_timeout_microseconds), from the request's arrival. Hint: raise it, or send "
            "fewer requests at once; a batch waits for company up to [batching] "
            "max_queue_delay_ms = 1500, as long as that limit or longer: lower it"
        }


def test_a_failed_item_withdraws_its_request_s_waiting_items(tmp_path: Path) -> None:
    """As in one process (test_bad_input): a page of 5 lines, the second refused by the model;
    the batch of 5 fails, they run one by one, and once the second fails the 3 after it are
    withdrawn in the inference process, not run."""
    with running(pages(tmp_path / "pages"), "--workers", "2") as (url, _):
        response = httpx.post(f"{url}/invoke", json={"lines": [GOOD, BAD, GOOD, GOOD, GOOD]})
        assert response.status_code == 422
        assert "idx=99" in response.json()["error"]
        ran = stats(url)
        assert (ran["execution_count"], ran["inference_count"]) == (1, 1)  # the first line
        assert httpx.post(f"{url}/invoke", json={"lines": [GOOD] * 3}).json() == 3


def test_a_request_that_times_out_in_the_queue_is_never_computed(tmp_path: Path) -> None:
    """Triton's `timeout` (µs) of 200 ms against a batch that waits 1.5 s for company: 504
    at about 200 ms, and past the 1.5 s no batch ran it; a request without one then runs."""
    folder = mlp_function(tmp_path / "mlp", delay_ms=HOLD_MS)
    body = infer_body(np.full((1, 16), 0.5, np.float32))
    with running(folder, "--workers", "2") as (url, _):
        started = time.monotonic()
        expired = httpx.post(
            f"{url}/v2/models/mlp/infer", json={**body, "parameters": {"timeout": 200_000}}
        )
        waited = time.monotonic() - started
        assert expired.status_code == 504, expired.text
        assert waited < 1.0
        time.sleep(HOLD_MS / 1000 + 0.3)
        assert metric(url, "nv_inference_count") == 0
        assert stats(url)["inference_stats"]["queue"]["count"] == 0  # no batch took it
        assert httpx.post(f"{url}/v2/models/mlp/infer", json=body).status_code == 200
        assert metric(url, "nv_inference_count") == 1


def test_a_client_that_hangs_up_has_its_items_withdrawn(tmp_path: Path) -> None:
    folder = mlp_function(tmp_path / "mlp", delay_ms=HOLD_MS)
    body = infer_body(np.full((1, 16), 0.5, np.float32))
    with running(folder, "--workers", "2") as (url, _):
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{url}/v2/models/mlp/infer", json=body, timeout=0.3)
        time.sleep(HOLD_MS / 1000 + 0.3)
        assert metric(url, "nv_inference_count") == 0
        assert stats(url)["inference_stats"]["queue"]["count"] == 0
