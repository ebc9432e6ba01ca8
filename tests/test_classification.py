"""Triton's classification extension through the stock tritonclient on a real uvicorn: an
output asked for with `class_count` comes back as its top classes, `value:index:label`."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.http as triton
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from edgeserve.builder import build
from edgeserve.errors import ConfigError
from edgeserve.http import create_app
from edgeserve.runtime import Runtime
from tests.models import classifier_model, identity_model, pair_model, write_function
from tests.threaded_server import serving

# a label with a line separator inside (lines split on \n alone, as Triton's), one left empty
# (no label then), CRLF line endings, and none for the last class
LABELS = ["air\u2028plane", "car", "", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
MANIFEST = """
[function]
name = "classes"
[model.outputs.probabilities]
labels = "labels.txt"
[batching]
max_batch_size = 8
"""


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("classes")
    source = write_function(root / "src", classifier_model, MANIFEST)
    (source / "labels.txt").write_bytes("\r\n".join(LABELS[:9]).encode() + b"\r\n")
    bundle = build(source, root / "bundle")
    with serving(create_app(Runtime.load(bundle, backend="onnxruntime"))) as base_url:
        yield base_url


@pytest.fixture(scope="module")
def client(url: str) -> Iterator[triton.InferenceServerClient]:
    client = triton.InferenceServerClient(url.removeprefix("http://"), network_timeout=30)
    yield client
    client.close()


def pixels(rows: int) -> triton.InferInput:
    x = np.random.default_rng(rows).random((rows, 3, 32, 32), np.float32)
    return triton.InferInput("pixels", list(x.shape), "FP32").set_data_from_numpy(x)


def one_page(parameters: dict[str, object]) -> dict[str, object]:
    """A JSON request of one image whose output asks for `parameters`."""
    image = {"name": "pixels", "shape": [1, 3, 32, 32], "datatype": "FP32", "data": [0.5] * 3072}
    return {"inputs": [image], "outputs": [{"name": "probabilities", "parameters": parameters}]}


def expected_top(probabilities: np.ndarray, count: int) -> list[list[str]]:
    """What Triton's server answers: highest first, the value as C++'s std::to_string writes it."""
    tops = []
    for row in probabilities:
        order = sorted(range(len(row)), key=lambda i: -row[i])[:count]
        tops.append(
            [f"{row[i]:f}:{i}" + (f":{LABELS[i]}" if i < 9 and LABELS[i] else "") for i in order]
        )
    return tops


@pytest.mark.parametrize("binary", [True, False])
def test_class_count_answers_the_top_classes_of_each_row(
    client: triton.InferenceServerClient, binary: bool
) -> None:
    inputs = [pixels(3)]
    plain = client.infer("classes", inputs).as_numpy("probabilities")
    asked = triton.InferRequestedOutput("probabilities", binary_data=binary, class_count=4)
    result = client.infer("classes", inputs, outputs=[asked])
    top = result.as_numpy("probabilities")
    assert top.shape == (3, 4)
    assert result.get_output("probabilities")["datatype"] == "BYTES"
    as_text = [[v.decode() if isinstance(v, bytes) else v for v in row] for row in top]
    assert as_text == expected_top(plain, 4)


def test_a_count_past_the_classes_gives_every_class(client: triton.InferenceServerClient) -> None:
    asked = triton.InferRequestedOutput("probabilities", class_count=50)
    top = client.infer("classes", [pixels(1)], outputs=[asked]).as_numpy("probabilities")
    assert top.shape == (1, 10)
    assert sorted(int(item.split(b":")[1]) for item in top[0]) == list(range(10))


def test_server_metadata_lists_the_extension(client: triton.InferenceServerClient) -> None:
    assert "classification" in client.get_server_metadata()["extensions"]


@pytest.mark.parametrize(
    ("parameters", "words"),
    [
        ({"classification": 0}, "expected a count of classes >= 1, got 0"),
        ({"classification": "3"}, "expected a count of classes >= 1, got '3'"),
        ({"classification": True}, "expected a count of classes >= 1, got true"),
    ],
)
def test_a_bad_classification_request_is_a_400(
    url: str, parameters: dict[str, object], words: str
) -> None:
    answer = httpx.post(f"{url}/v2/models/classes/infer", json=one_page(parameters), timeout=30)
    assert answer.status_code == 400, answer.text
    assert words in answer.json()["error"]


def test_classes_are_not_written_to_shared_memory(
    url: str, client: triton.InferenceServerClient
) -> None:
    """tritonclient refuses to ask for it; a hand-made request gets a 400 that says so."""
    region = shm.create_shared_memory_region("classes", "/edgeserve-classes", 4096)
    client.register_system_shared_memory("classes", "/edgeserve-classes", 4096)
    place = {"shared_memory_region": "classes", "shared_memory_byte_size": 4096}
    try:
        answer = httpx.post(
            f"{url}/v2/models/classes/infer",
            json=one_page({"classification": 2, **place}),
            timeout=30,
        )
    finally:
        client.unregister_system_shared_memory("classes")
        shm.destroy_shared_memory_region(region)
    assert answer.status_code == 400
    assert "not written to shared memory" in answer.json()["error"]


def test_labels_name_an_output_and_a_file_that_reads(tmp_path: Path) -> None:
    source = write_function(tmp_path / "missing", classifier_model, MANIFEST)
    with pytest.raises(ConfigError, match=r"labels`: cannot read .*labels.txt: No such file"):
        build(source, tmp_path / "b1")
    on_input = MANIFEST.replace("[model.outputs.probabilities]", "[model.inputs.pixels]")
    source = write_function(tmp_path / "input", classifier_model, on_input)
    (source / "labels.txt").write_text("a\n")
    with pytest.raises(ConfigError, match="labels name an output's classes"):
        build(source, tmp_path / "b2")


def test_a_text_output_cannot_be_ranked(tmp_path: Path) -> None:
    """Only numeric outputs: Triton's answer for a BYTES one is a 400 too."""
    manifest = '[function]\nname = "words"\n[backend]\nprefer = ["onnxruntime"]\n'
    source = write_function(tmp_path / "words", lambda p: identity_model(p, ("BYTES",)), manifest)
    with serving(create_app(Runtime.load(build(source, tmp_path / "b")))) as url:
        client = triton.InferenceServerClient(url.removeprefix("http://"))
        strings = np.array([[b"a", b"b", b"c"]], dtype=object)
        words = triton.InferInput("in_BYTES", [1, 3], "BYTES").set_data_from_numpy(strings)
        asked = triton.InferRequestedOutput("out_BYTES", class_count=1)
        with pytest.raises(InferenceServerException) as error:
            client.infer("words", [words], outputs=[asked])
        client.close()
    assert error.value.status() == "400"
    assert "the output is BYTES; classes are ranked from a numeric output" in error.value.message()


def test_a_model_that_does_not_batch_ranks_its_whole_output(tmp_path: Path) -> None:
    """No batch axis (max_batch_size 0): the output is one vector, answered as [count]."""
    manifest = '[function]\nname = "pair"\n[backend]\nprefer = ["onnxruntime"]\n'
    source = write_function(tmp_path / "pair", pair_model, manifest)
    features = np.array([[0.5, 3.0, -1.0, 2.0]], np.float32)
    with serving(create_app(Runtime.load(build(source, tmp_path / "b")))) as url:
        client = triton.InferenceServerClient(url.removeprefix("http://"))
        inputs = [
            triton.InferInput("features", [1, 4], "FP32").set_data_from_numpy(features),
            triton.InferInput("mask", [1, 4], "INT32").set_data_from_numpy(
                np.array([[1, 1, 1, 0]], np.int32)
            ),
        ]
        asked = triton.InferRequestedOutput("masked", class_count=2)
        top = client.infer("pair", inputs, outputs=[asked]).as_numpy("masked")
        client.close()
    assert top.tolist() == [b"3.000000:1", b"0.500000:0"]


def test_nan_ranks_last(tmp_path: Path) -> None:
    """Triton's order for NaN is undefined; ranked first, it would crowd out every class."""
    manifest = '[function]\nname = "pair"\n[backend]\nprefer = ["onnxruntime"]\n'
    source = write_function(tmp_path / "pair", pair_model, manifest)
    features = np.array([[np.nan, 3.0, -np.inf, 2.0]], np.float32)
    with serving(create_app(Runtime.load(build(source, tmp_path / "b")))) as url:
        client = triton.InferenceServerClient(url.removeprefix("http://"))
        inputs = [
            triton.InferInput("features", [1, 4], "FP32").set_data_from_numpy(features),
            triton.InferInput("mask", [1, 4], "INT32").set_data_from_numpy(
                np.ones((1, 4), np.int32)
            ),
        ]
        asked = triton.InferRequestedOutput("masked", class_count=4)
        top = client.infer("pair", inputs, outputs=[asked]).as_numpy("masked")
        client.close()
    assert top.tolist() == [b"3.000000:1", b"2.000000:3", b"-inf:2", b"nan:0"]
