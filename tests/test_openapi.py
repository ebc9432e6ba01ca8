"""GET /openapi.json and the /docs page that renders it, the way a user meets them: a real
server, the document's own examples sent back to it, and the page loaded in a real headless
browser (Debian's chromium; scripts/system-deps.sh installs it) with a screenshot taken."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import onnx
import pytest
from openapi_spec_validator import validate

from edgeserve.cli import main
from edgeserve.scaffold import init_function
from tests.models import exported_names_model, pair_model, sequence_model
from tests.server import served

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def sequence_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A function adopted from an int64 [-1, -1] sequence model (no handler)."""
    root = tmp_path_factory.mktemp("openapi")
    model = sequence_model(root / "sequence.onnx")
    assert main(["init", str(root / "text"), "--model", str(model)]) == 0
    with served(root / "text") as url:
        yield url


def _browser(url: str, *flags: str) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM, "chromium is missing: `make system-deps` (scripts/system-deps.sh) installs it"
    command = [CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run"]
    command += ["--window-size=1100,1400", "--virtual-time-budget=10000", *flags, url]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=True)


def test_the_document_describes_the_models_own_tensors(sequence_url: str) -> None:
    document = httpx.get(f"{sequence_url}/openapi.json").json()
    assert document["openapi"] == "3.1.0"
    assert document["info"]["title"] == "text"
    assert set(document["paths"]) >= {"/invoke", "/v2/models/text/infer", "/v2/models/text"}
    schemas = document["components"]["schemas"]
    tokens = schemas["input_tokens"]["properties"]
    assert (tokens["name"], tokens["datatype"]) == ({"const": "tokens"}, {"const": "INT64"})
    assert tokens["data"] == {"type": "array", "items": {"type": "integer"}}
    assert schemas["output_pooled"]["description"] == "output `pooled` FP32 [-1, 8] (-1: any size)"
    assert document["x-edgeserve-tensors"]["inputs"] == [
        {"name": "tokens", "datatype": "INT64", "shape": [-1, -1]}
    ]


def test_the_documents_examples_are_requests_the_server_accepts(sequence_url: str) -> None:
    paths = httpx.get(f"{sequence_url}/openapi.json").json()["paths"]
    for path in ("/invoke", "/v2/models/text/infer"):
        example = paths[path]["post"]["requestBody"]["content"]["application/json"]["example"]
        answer = httpx.post(f"{sequence_url}{path}", json=example, timeout=30)
        assert answer.status_code == 200, (path, answer.text)
    invoked = httpx.post(
        f"{sequence_url}/invoke",
        json=paths["/invoke"]["post"]["requestBody"]["content"]["application/json"]["example"],
    ).json()
    assert list(invoked) == ["pooled"] and len(invoked["pooled"][0]) == 8


def test_a_handlers_example_is_its_sample(tmp_path: Path) -> None:
    source = init_function(tmp_path / "demo")
    with served(source) as url:
        invoke = httpx.get(f"{url}/openapi.json").json()["paths"]["/invoke"]["post"]
    sample = json.loads((source / "samples" / "request.json").read_text())
    assert invoke["requestBody"]["content"]["application/json"]["example"] == sample
    assert "`handler.preprocess`, the model and `handler.postprocess`" in invoke["description"]


def test_the_docs_page_renders_the_tensors_in_a_real_browser(
    sequence_url: str, tmp_path: Path
) -> None:
    page = httpx.get(f"{sequence_url}/docs")
    assert page.headers["content-type"].startswith("text/html")
    assert "http://" not in page.text and "https://" not in page.text  # nothing from a CDN
    dom = _browser(f"{sequence_url}/docs", "--dump-dom").stdout
    assert 'data-rendered="yes"' in dom  # the script ran and drew the document
    assert "<code>tokens</code></td><td>INT64</td><td><code>[-1, -1]</code>" in dom
    assert "<code>pooled</code></td><td>FP32</td><td><code>[-1, 8]</code>" in dom
    assert '<code class="path">/v2/models/text/infer</code>' in dom
    shot = tmp_path / "docs.png"
    _browser(f"{sequence_url}/docs", f"--screenshot={shot}")
    png = shot.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert (int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")) == (1100, 1400)
    assert len(png) > 30_000  # a drawn page, not a blank one (a blank 1100x1400 PNG is ~5 KB)


def test_a_fixed_batch_model_says_it_is_not_batched(tmp_path: Path) -> None:
    model = pair_model(tmp_path / "pair.onnx")
    assert main(["init", str(tmp_path / "pair"), "--model", str(model)]) == 0
    with served(tmp_path / "pair") as url:
        dom = _browser(f"{url}/docs", "--dump-dom").stdout
    assert "The first dims are fixed: every request runs alone." in dom
    assert "<code>features</code>" in dom and "<code>mask</code>" in dom


def test_tensor_names_of_exported_models_make_a_valid_document(tmp_path: Path) -> None:
    """TensorFlow and PyTorch exports name tensors `serving/x:0`, `onnx::Out 1`: the document
    still validates as OpenAPI 3.1 (component keys are `[A-Za-z0-9._-]+`), the schemas keep
    the names, and its examples are requests the server accepts."""
    model = exported_names_model(tmp_path / "exported.onnx")
    assert main(["init", str(tmp_path / "exported"), "--model", str(model)]) == 0
    with served(tmp_path / "exported") as url:
        document = httpx.get(f"{url}/openapi.json").json()
        validate(document)
        titles = {schema.get("title") for schema in document["components"]["schemas"].values()}
        assert {"input.1", "serving/x:0", "StatefulPartitionedCall:0", "onnx::Out 1"} <= titles
        infer = document["paths"]["/v2/models/exported/infer"]["post"]["requestBody"]
        example = infer["content"]["application/json"]["example"]
        answer = httpx.post(f"{url}/v2/models/exported/infer", json=example)
        assert answer.status_code == 200, answer.text


def test_an_image_models_document_leaves_out_examples_too_large_to_carry(tmp_path: Path) -> None:
    """An [N, 3, 224, 224] input: its /invoke and v2 examples (150,528 numbers each) made the
    document 1.5 MB, which every /docs page fetched. Past EXAMPLE_BYTES the schema alone."""
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("GlobalAveragePool", ["pixels"], ["pooled"])],
        "image",
        [onnx.helper.make_tensor_value_info("pixels", onnx.TensorProto.FLOAT, ["N", 3, 224, 224])],
        [onnx.helper.make_tensor_value_info("pooled", onnx.TensorProto.FLOAT, ["N", 3, 1, 1])],
    )
    model = tmp_path / "image.onnx"
    onnx.save(
        onnx.helper.make_model(
            graph, opset_imports=[onnx.helper.make_opsetid("", 17)], ir_version=8
        ),
        model,
    )
    assert main(["init", str(tmp_path / "image"), "--model", str(model)]) == 0
    with served(tmp_path / "image") as url:
        answer = httpx.get(f"{url}/openapi.json")
    assert len(answer.content) < 100_000
    document = answer.json()
    validate(document)
    for path in ("/invoke", "/v2/models/image/infer"):
        media = document["paths"][path]["post"]["requestBody"]["content"]["application/json"]
        assert "example" not in media and "schema" in media
