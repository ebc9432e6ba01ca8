"""Bad input through the real app on a real uvicorn (ONNX Runtime on CPU), sent by httpx:
a corpus of malformed requests by class, then hypothesis fuzzing every decoder. Every answer is
a 4xx with a JSON error that says what was wrong, never a 5xx, and the next request still works.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import gzip
import io
import re
import shutil
import uuid
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import msgpack
import numpy as np
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto
from PIL import Image, ImageDraw

from edgeserve.builder import build
from edgeserve.http import create_app
from edgeserve.http.invoke import NDARRAY_EXT, pack_array
from edgeserve.runtime import Runtime
from tests.bad_requests import (
    CORPUS,
    GOOD_ROW,
    INFER,
    INPUTS,
    JSON,
    LIMIT,
    LONG_STRINGS,
    MSGPACK,
    SHM,
    Bad,
    form,
    in_shared_memory,
    payload,
    v2_body,
)
from tests.models import (
    identity_model,
    reshaping_model,
    scalar_model,
    sequence_model,
    slow_model,
    top_model,
    write_function,
)
from tests.server import running
from tests.test_backend_values import cast
from tests.test_tritonclient import MANIFEST
from tests.threaded_server import serving

OCR = Path(__file__).resolve().parents[1] / "functions" / "ocr"
FUZZ = settings(
    max_examples=120,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    root = tmp_path_factory.mktemp("identity")
    source = write_function(root / "src", lambda path: identity_model(path, INPUTS), MANIFEST)
    app = create_app(Runtime.load(build(source, root / "bundle")), max_body_bytes=LIMIT)
    with serving(app) as url, httpx.Client(base_url=url, timeout=30) as client:
        yield client


def assert_still_serving(client: httpx.Client) -> None:
    response = client.post(INFER, content=v2_body())
    assert response.status_code == 200, response.text
    outputs = {o["name"]: o["data"] for o in response.json()["outputs"]}
    assert outputs["out_FP32"] == GOOD_ROW["FP32"] and outputs["out_BYTES"] == GOOD_ROW["BYTES"]


def assert_client_error(response: Any, what: str) -> str:
    """A 4xx with a JSON `{"error": "..."}` body; the message."""
    assert 400 <= response.status_code < 500, f"{what}: {response.status_code} {response.text}"
    error = response.json()["error"]
    assert isinstance(error, str) and error, what
    return error


@pytest.mark.parametrize("bad", CORPUS, ids=lambda bad: bad.what)
def test_every_malformed_request_gets_its_4xx_and_the_server_goes_on(
    client: httpx.Client, bad: Bad
) -> None:
    response = client.request(bad.method, bad.path, content=bad.body, headers=bad.headers)
    assert response.status_code == bad.status, response.text
    assert bad.words in assert_client_error(response, bad.what)
    assert_still_serving(client)


@pytest.mark.parametrize("bad", LONG_STRINGS, ids=lambda bad: bad.what)
def test_an_error_repeats_a_client_s_long_string_cut_short(client: httpx.Client, bad: Bad) -> None:
    """Its first 64 characters, an ellipsis and its length, wherever it was sent."""
    response = client.request(bad.method, bad.path, content=bad.body, headers=bad.headers)
    assert response.status_code == bad.status, response.text[:400]
    error = assert_client_error(response, bad.what)
    assert bad.words in error and len(error) < 600, error


def test_v2_and_invoke_accept_what_they_should(client: httpx.Client) -> None:
    """The refusals above are not over-eager: ints in float tensors, nesting, msgpack bytes."""
    body = v2_body(data=[[1, 2.5, -3]])
    assert client.post(INFER, content=body).json()["outputs"][0]["data"] == [1.0, 2.5, -3.0]
    bom = "\ufeff".encode()  # a UTF-8 byte order mark, as Windows tools write JSON files
    assert client.post(INFER, content=bom + body).json()["outputs"][0]["data"] == [1, 2.5, -3]
    rows = {f"in_{dt}": [row] for dt, row in GOOD_ROW.items()}
    invoked = client.post("/invoke", content=bom + orjson.dumps(rows), headers=JSON)
    assert invoked.status_code == 200, invoked.text
    payload = {f"in_{dt}": [row] for dt, row in GOOD_ROW.items()} | {"in_BYTES": [[b"x", "y", b""]]}
    response = client.post(
        "/invoke",
        content=msgpack.packb(payload),
        headers={"content-type": "application/msgpack"},
    )
    assert response.status_code == 200, response.text
    assert response.json()["out_BYTES"] == [["x", "y", ""]]
    assert response.json()["out_INT8"] == [[-128, 0, 127]]


def test_bool_bytes_in_shared_memory_other_than_0_are_true(client: httpx.Client) -> None:
    """BOOL read from a registered region is read as Triton's backends read it: any byte but 0
    is true, and the model sees 1 (numpy viewed a byte of 9 as a bool summing as 9)."""
    key = f"/edgeserve-bools-{uuid.uuid4().hex[:8]}"
    region = Path("/dev/shm") / key[1:]
    region.write_bytes(b"\x01\x00\x01")
    register = client.post(f"{SHM}/bools/register", json={"key": key, "byte_size": 3})
    assert register.status_code == 200, register.text
    try:
        body = in_shared_memory("bools", datatype="BOOL")
        answer = client.post(INFER, content=body)
        assert answer.status_code == 200, answer.text
        outputs = {output["name"]: output["data"] for output in answer.json()["outputs"]}
        assert outputs["out_BOOL"] == [True, False, True]
        region.write_bytes(b"\x00\x09\xff")
        answer = client.post(INFER, content=body)
        assert answer.status_code == 200, answer.text
        outputs = {output["name"]: output["data"] for output in answer.json()["outputs"]}
        assert outputs["out_BOOL"] == [False, True, True]
    finally:
        client.post(f"{SHM}/bools/unregister")
        region.unlink()


def test_keys_in_several_objects_and_colons_in_strings_are_no_repeated_keys(
    client: httpx.Client,
) -> None:
    """Every tensor has its own `name` and `data`; the colons an id and BYTES hold are counted
    as theirs, so the repeated-key check finds no key given twice in one object."""
    request = orjson.loads(v2_body(input="BYTES", data=["a:b", ":", '"c":']))
    response = client.post(INFER, json={"id": "2026-11-22T23:30:00", **request})
    assert response.status_code == 200, response.text
    answer = response.json()
    outputs = {output["name"]: output["data"] for output in answer["outputs"]}
    assert (answer["id"], outputs["out_BYTES"]) == ("2026-11-22T23:30:00", ["a:b", ":", '"c":'])


def test_a_header_given_twice_is_joined_or_refused(client: httpx.Client) -> None:
    """Two Inference-Header-Content-Length headers: the last one was read, and the JSON header
    cut there ('not valid JSON: unexpected end of data: line 1 column 21'); two Content-Encodings
    kept only the last, so a body gzipped twice was undone once ('not valid JSON')."""
    body = v2_body()
    twice = [("inference-header-content-length", str(len(body)))] * 2
    response = client.post(INFER, content=body, headers=twice)
    assert response.status_code == 400
    assert response.json()["error"] == (
        f"header inference-header-content-length: given 2 times {[str(len(body))] * 2}; "
        "expected once"
    )
    types = [("content-type", "application/json"), ("content-type", "application/msgpack")]
    response = client.post("/invoke", content=orjson.dumps(payload()), headers=types)
    assert response.status_code == 400
    assert response.json()["error"].startswith("header content-type: given 2 times")
    gzipped = [("content-encoding", "gzip"), ("content-encoding", "gzip")]
    response = client.post(INFER, content=gzip.compress(gzip.compress(body)), headers=gzipped)
    assert response.status_code == 200, response.text


def test_a_rank_0_input_nested_too_deep_is_named_as_rank_0(tmp_path: Path) -> None:
    """Its one value may come bare or in a list of one; two lists read "nested deeper than
    the tensor's 1 dims", of a tensor that has none."""
    source = write_function(tmp_path / "src", scalar_model, '[function]\nname = "scalar"\n')
    app = create_app(Runtime.load(build(source, tmp_path / "bundle")))
    tensor = {"name": "x", "datatype": "FP32", "shape": []}
    with serving(app) as url, httpx.Client(base_url=url, timeout=30) as scalar:
        bare, listed, deep = (
            scalar.post("/v2/models/scalar/infer", json={"inputs": [tensor | {"data": data}]})
            for data in (3.0, [3.0], [[3.0]])
        )
        invoked = scalar.post("/invoke", json={"x": [[3.0]]})
    assert [bare.json()["outputs"][0]["data"], listed.json()["outputs"][0]["data"]] == [[9.0]] * 2
    words = "`data` is nested deeper than a rank-0 tensor's data (one value, or a list of one)"
    assert (deep.status_code, deep.json()) == (400, {"error": f"tensor `x`: FP32 []: {words}"})
    assert (invoked.status_code, invoked.json()) == (
        400,
        {"error": f"tensor `x`: FP32 []: {words}"},
    )


@pytest.mark.parametrize("boundary", ["é".encode(), b"\xe9", b"a\x80"])
def test_a_form_whose_boundary_is_not_ascii_is_refused_as_such(
    client: httpx.Client, boundary: bytes
) -> None:
    """It read "its boundary is not in the body", of a body that held it as sent."""
    body = (
        b"--" + boundary + b'\r\nContent-Disposition: form-data; name="f"; filename="a.json"\r\n'
        b"Content-Type: application/json\r\n\r\n{}\r\n--" + boundary + b"--\r\n"
    )
    content_type = b"multipart/form-data; boundary=" + boundary
    response = client.post("/invoke", content=body, headers={"content-type": content_type})
    assert response.status_code == 400
    assert response.json()["error"] == (
        "request body: multipart/form-data: its boundary holds bytes that are not ASCII; "
        "expected 1 to 70 ASCII characters (RFC 2046)"
    )


def test_a_form_part_in_base64_is_read_with_its_line_breaks(client: httpx.Client) -> None:
    """RFC 2045 wraps base64 at 76 characters: line breaks are not a bad character."""
    text = base64.encodebytes(orjson.dumps(payload()))  # lines of 76 and a newline each
    assert text.count(b"\n") > 2
    for data in (text, text.replace(b"\n", b"\r\n")):
        body, headers = form(data)
        response = client.post("/invoke", content=body, headers=headers)
        assert response.status_code == 200, response.text
        assert response.json()["out_BYTES"] == [GOOD_ROW["BYTES"]]


def test_a_numpy_array_in_msgpack_is_read_in_its_own_byte_order(client: httpx.Client) -> None:
    """An ext array of '>f4' (numpy's own spelling on a big-endian machine, or after
    byteswap) was refused as 'not valid msgpack: ... numpy dtype >f4 has no KServe v2
    datatype'; its dtype says how to read its bytes, so it is read as the same values."""
    swapped = {
        "in_FP32": np.array([[1.5, -2.0, 3.0]], ">f4"),
        "in_INT64": np.array([[1, -2, 2**40]], ">i8"),
        "in_FP16": np.array([[0.5, 1.0, 2.0]], ">f2"),
    }
    payload = {f"in_{dt}": [row] for dt, row in GOOD_ROW.items()} | {
        name: pack_array(array) for name, array in swapped.items()
    }
    response = client.post("/invoke", content=msgpack.packb(payload), headers=MSGPACK)
    assert response.status_code == 200, response.text
    for name, array in swapped.items():
        assert response.json()[name.replace("in_", "out_")] == array.tolist(), name


def test_an_element_of_a_request_split_into_batches_is_named_at_its_row_in_the_request(
    client: httpx.Client,
) -> None:
    """20 rows under max_batch_size 8 run as parts of 8, 8 and 4 rows: a BYTES element that
    is not UTF-8 in row 12 was named at [4, 1], its row in its part."""
    rows = 20
    texts: list[list[Any]] = [["a", "b", "c"] for _ in range(rows)]
    texts[12][1] = b"\xc3("
    body = {f"in_{dt}": [row] * rows for dt, row in GOOD_ROW.items()} | {"in_BYTES": texts}
    response = client.post("/invoke", content=msgpack.packb(body), headers=MSGPACK)
    error = assert_client_error(response, "bad text in row 12")
    assert error.startswith("tensor `in_BYTES`: element [12, 1] is not UTF-8"), error
    assert_still_serving(client)


# hypothesis: anything JSON or msgpack can carry, in the places a request has structure
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8)
)
JSON_VALUES = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=12,
)
DATATYPE_NAMES = st.sampled_from([*INPUTS, "FP64", "BF16", "INT4", ""]) | JSON_VALUES
SHAPES = st.lists(st.integers(-2, 4), max_size=4) | JSON_VALUES
NAMES = st.sampled_from([f"in_{dt}" for dt in INPUTS]) | JSON_VALUES
COUNTS = st.integers(-1, 40) | JSON_VALUES
SHARED_MEMORY = st.fixed_dictionaries(
    {},
    optional={
        "shared_memory_region": st.sampled_from(["r", "/dev/shm/x", "../etc"]) | JSON_VALUES,
        "shared_memory_offset": COUNTS,
        "shared_memory_byte_size": COUNTS,
        "binary_data": JSON_VALUES,
    },
)


@st.composite
def v2_inputs(draw: st.DrawFn, binary: bool) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": draw(NAMES), "datatype": draw(DATATYPE_NAMES)}
    entry["shape"] = draw(SHAPES)
    if binary:
        entry["parameters"] = {"binary_data_size": draw(COUNTS)}
    else:
        entry["data"] = draw(JSON_VALUES)
        entry["parameters"] = draw(SHARED_MEMORY)
    return entry


def requests(binary: bool) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {"inputs": st.lists(v2_inputs(binary), max_size=3) | JSON_VALUES},
        optional={
            "id": JSON_VALUES,
            "parameters": JSON_VALUES,
            "outputs": st.lists(
                st.fixed_dictionaries({"name": NAMES}, optional={"parameters": SHARED_MEMORY}),
                max_size=2,
            )
            | JSON_VALUES,
        },
    )


@FUZZ
@given(request=requests(binary=False))
def test_fuzz_v2_json(client: httpx.Client, request: dict[str, Any]) -> None:
    response = client.post(INFER, content=orjson.dumps(request))
    if response.status_code != 200:
        assert_client_error(response, repr(request))


@FUZZ
@given(
    request=requests(binary=True),
    tail=st.binary(max_size=48),
    lie=st.integers(-3, 3) | st.text("0123456789-+xe", min_size=1, max_size=4),
)
def test_fuzz_v2_binary(
    client: httpx.Client, request: dict[str, Any], tail: bytes, lie: int | str
) -> None:
    header = orjson.dumps(request)
    length = str(len(header) + lie) if isinstance(lie, int) else lie
    response = client.post(
        INFER, content=header + tail, headers={"Inference-Header-Content-Length": length}
    )
    if response.status_code != 200:
        assert_client_error(response, f"{request!r} {tail!r} {length!r}")


@FUZZ
@given(
    body=st.binary(max_size=64),
    encoding=st.sampled_from(["gzip", "deflate", "x-gzip", "br", "gzip, gzip", ""]),
    compress=st.sampled_from([None, gzip.compress, zlib.compress]),
    cut=st.integers(0, 8),
)
def test_fuzz_content_encodings(
    client: httpx.Client, body: bytes, encoding: str, compress: Any, cut: int
) -> None:
    content = compress(body) if compress else body
    content = content[: max(0, len(content) - cut)]
    response = client.post(INFER, content=content, headers={"content-encoding": encoding})
    assert_client_error(response, f"{encoding} {content!r}")


POSTS = [
    "/v2/repository/index",
    "/v2/repository/models/identity/load",
    "/v2/repository/models/other/unload",
    "/v2/systemsharedmemory/region/r/register",
    "/v2/systemsharedmemory/region/r/unregister",
    "/v2/systemsharedmemory/unregister",
]


@FUZZ
@given(path=st.sampled_from(POSTS), body=JSON_VALUES | st.binary(max_size=16))
def test_fuzz_the_other_routes_that_read_a_body(client: httpx.Client, path: str, body: Any) -> None:
    content = body if isinstance(body, bytes) else orjson.dumps(body)
    response = client.post(path, content=content)
    if response.status_code != 200:
        assert_client_error(response, f"{path} {content!r}")


MSGPACK_VALUES = st.recursive(
    SCALARS | st.binary(max_size=8) | st.floats(),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.text(max_size=6) | st.integers(-(2**63), 2**64 - 1) | st.binary(max_size=3),
            inner,
            max_size=3,
        )
        | st.builds(msgpack.ExtType, st.sampled_from([NDARRAY_EXT, 7]), st.binary(max_size=24))
    ),
    max_leaves=12,
)


@FUZZ
@given(
    payload=st.fixed_dictionaries(
        {}, optional={f"in_{dt}": MSGPACK_VALUES for dt in INPUTS} | {"x": MSGPACK_VALUES}
    )
    | MSGPACK_VALUES,
    cut=st.integers(0, 3),
)
def test_fuzz_invoke_msgpack_and_json(client: httpx.Client, payload: Any, cut: int) -> None:
    body = msgpack.packb(payload)
    body = body[: len(body) - cut]
    response = client.post("/invoke", content=body, headers={"content-type": "application/msgpack"})
    if response.status_code != 200:
        assert_client_error(response, repr(payload))
    try:
        text = orjson.dumps(payload)
    except TypeError:  # bytes, ext types and int keys have no JSON
        return
    response = client.post("/invoke", content=text, headers={"content-type": "application/json"})
    if response.status_code != 200:
        assert_client_error(response, repr(payload))


@pytest.fixture(scope="module")
def ocr(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    """functions/ocr as shipped, except a queue of 4 rows (the limit a long page meets)."""
    source = tmp_path_factory.mktemp("ocr") / "ocr"
    shutil.copytree(OCR, source, ignore=shutil.ignore_patterns("training", "samples"))
    manifest = (source / "function.toml").read_text()
    (source / "function.toml").write_text(
        manifest.replace("max_queue_size = 512", "max_queue_size = 4")
    )
    bundle = build(source, source.parent / "bundle")
    app = create_app(Runtime.load(bundle, backend="onnxruntime"))
    with serving(app) as url, httpx.Client(base_url=url, timeout=30) as client:
        yield client


def image_bytes(image: Image.Image, fmt: str) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt)
    return buffer.getvalue()


def test_an_image_mode_the_handler_cannot_convert_is_a_400_that_says_so(ocr: httpx.Client) -> None:
    lab = image_bytes(Image.new("LAB", (64, 32), (50, 0, 0)), "TIFF")
    response = ocr.post("/invoke", content=lab, headers={"content-type": "image/tiff"})
    assert response.status_code == 400
    assert "mode LAB cannot be converted to grey" in response.json()["error"]


LONG_KEY = "k" * 100
OBJECTS = [
    (b"{}", "got an object with no keys; 'image' is the only key this function reads"),
    (  # an object read "got an object", not saying what it held or what was wanted
        orjson.dumps({"img": "iVBO", "lang": "en"}),
        "got an object with the keys 'img', 'lang'; 'image' is the only key this function reads",
    ),
    (
        orjson.dumps({LONG_KEY: 1, **{f"k{i}": i for i in range(5)}}),
        f"got an object with the keys '{'k' * 64}'… (100 characters), 'k0', 'k1', 'k2' and 2 "
        "more; 'image' is the only key this function reads",
    ),
]


@pytest.mark.parametrize(
    ("body", "words"), [(b"null", "got null"), (b"[1]", "got a list"), *OBJECTS]
)
def test_a_json_body_with_no_image_is_named_in_json_s_words(
    ocr: httpx.Client, body: bytes, words: str
) -> None:
    """Not Python's: a null body read 'got NoneType'."""
    response = ocr.post("/invoke", content=body, headers=JSON)
    assert response.status_code == 400
    assert response.json()["error"].endswith(f"an object with an 'image' field, {words}")


NAN_ROW = b"[" + b",".join([b"NaN"] * 16) + b"]"


@pytest.mark.parametrize(
    ("body", "headers", "words"),
    [
        (b'{"image": null}', JSON, "HxWxC array of pixel values, got null"),
        (b'{"image": 7}', JSON, "HxWxC array of pixel values, got 7"),
        (b'{"image": {"data": []}}', JSON, "HxWxC array of pixel values, got an object"),
        (
            msgpack.packb({"image": msgpack.ExtType(5, b"xy")}),
            MSGPACK,
            "HxWxC array of pixel values, got a msgpack ext of type 5",
        ),
        (
            b'{"image": [' + b",".join([NAN_ROW] * 16) + b"]}",
            JSON,
            "'image' pixel values must be numbers from 0 to 255 (uint8)",
        ),
    ],
    ids=["null", "a number", "an object", "a msgpack ext", "NaN pixels"],
)
def test_an_image_that_is_neither_a_file_nor_pixels_is_a_400_naming_it(
    ocr: httpx.Client, body: bytes, headers: dict[str, str], words: str
) -> None:
    """They read "'image' has shape (): expected HxW..." (a msgpack ext: shape (2,)), and
    NaN pixels were cast to whatever uint8 NaN became, and read as a page."""
    response = ocr.post("/invoke", content=body, headers=headers)
    assert response.status_code == 400, response.text
    assert response.json()["error"].endswith(words)


@pytest.mark.parametrize("prefix", [b"", b"data:image/png;base64,"])
def test_an_image_sent_as_its_base64_text_gets_a_hint(ocr: httpx.Client, prefix: bytes) -> None:
    """It read only that the bytes "starting b'iVBORw0K' are not an image"."""
    png = image_bytes(Image.new("L", (40, 20), 255), "PNG")
    sent = prefix + base64.b64encode(png)
    response = ocr.post("/invoke", content=sent, headers={"content-type": "image/png"})
    assert response.status_code == 400, response.text
    assert response.json()["error"].endswith(
        "Hint: they are the base64 text of a PNG file: send the file's own bytes (curl "
        '--data-binary @page.png), or the text in JSON as {"image": "..."}'
    )


def test_a_decompression_bomb_names_one_limit_the_handler_s(ocr: httpx.Client) -> None:
    """30000x30000 one-bit pixels compress to a small PNG; Pillow refuses its header with its own
    limit, which must not appear beside the handler's as a second, contradicting one."""
    bomb = image_bytes(Image.new("1", (30_000, 30_000), 1), "PNG")
    response = ocr.post("/invoke", content=bomb, headers={"content-type": "image/png"})
    assert response.status_code == 413
    error = response.json()["error"]
    assert error.startswith("image too large: its header declares more than ")
    assert error.endswith("pixels; the limit is 25000000")
    assert "DOS attack" not in error


def test_a_page_with_more_lines_than_the_queue_holds_is_refused_at_once(ocr: httpx.Client) -> None:
    page = Image.new("L", (400, 40 * 6), 255)
    draw = ImageDraw.Draw(page)
    for line in range(6):
        draw.text((10, 40 * line + 10), f"line number {line} of the page", fill=0)
    before = ocr.get("/v2/models/ocr/stats").json()["model_stats"][0]["inference_count"]
    response = ocr.post(
        "/invoke", content=image_bytes(page, "PNG"), headers={"content-type": "image/png"}
    )
    assert response.status_code == 413, response.text
    assert "exceeds max_queue_size (4 rows)" in response.json()["error"]
    assert ocr.get("/v2/models/ocr/stats").json()["model_stats"][0]["inference_count"] == before


PIXELS = st.lists(
    st.lists(
        st.integers(-1, 256) | st.lists(st.integers(0, 255), max_size=5), min_size=7, max_size=9
    ),
    min_size=7,
    max_size=9,
)


@FUZZ
@given(image=PIXELS | JSON_VALUES | st.text(max_size=40), extra=JSON_VALUES)
def test_fuzz_json_into_the_ocr_handler(ocr: httpx.Client, image: Any, extra: Any) -> None:
    """{"image": pixels, base64 or anything}: the handler's own checks answer, never a 500."""
    response = ocr.post("/invoke", json={"image": image, "extra": extra})
    if response.status_code != 200:
        assert_client_error(response, repr(image))


@FUZZ
@given(
    body=st.binary(max_size=64),
    content_type=st.sampled_from(["image/png", "application/octet-stream", "text/plain"]),
)
def test_fuzz_invoke_raw_bytes_into_the_ocr_handler(
    ocr: httpx.Client, body: bytes, content_type: str
) -> None:
    response = ocr.post("/invoke", content=body, headers={"content-type": content_type})
    assert_client_error(response, repr(body))


PNG = image_bytes(Image.new("L", (32, 32), 255), "PNG")


@FUZZ
@given(
    flips=st.lists(
        st.tuples(st.integers(0, len(PNG) - 1), st.integers(0, 255)), min_size=1, max_size=6
    )
)
def test_fuzz_damaged_pngs_into_the_ocr_handler(
    ocr: httpx.Client, flips: list[tuple[int, int]]
) -> None:
    body = bytearray(PNG)
    for position, value in flips:
        body[position] = value
    response = ocr.post("/invoke", content=bytes(body), headers={"content-type": "image/png"})
    if response.status_code != 200:
        assert_client_error(response, repr(flips))


BATCHING = """
[function]
name = "tokens"
[batching]
max_batch_size = 8
preferred_batch_sizes = [8]
max_queue_delay_ms = 500
[backend]
prefer = ["onnxruntime"]
"""


def token_request(tokens: list[int]) -> dict[str, Any]:
    entry = {"name": "tokens", "datatype": "INT64", "shape": [1, len(tokens)], "data": tokens}
    return {"inputs": [entry]}


def test_a_value_the_model_refuses_fails_its_own_request_not_its_batch(tmp_path: Path) -> None:
    """Token 99 of a 32-token vocabulary, looked up where the door cannot see (through an
    Abs), passes every check at the door, and ONNX Runtime refuses it while running the
    batch it shares with 7 good requests: only it gets the 422 (ModelRefused)."""
    model = functools.partial(sequence_model, via="Abs")
    source = write_function(tmp_path / "tokens", model, BATCHING)
    app = create_app(Runtime.load(build(source, tmp_path / "bundle")))

    async def send_all(url: str) -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            bodies = [token_request([1, 2, 3])] * 7 + [token_request([1, 99, 3])]
            sent = (client.post("/v2/models/tokens/infer", json=body) for body in bodies)
            return await asyncio.gather(*sent)

    with serving(app) as url:
        *good, bad = asyncio.run(send_all(url))
        batches = httpx.get(f"{url}/v2/models/tokens/stats").json()["model_stats"][0]
    assert [response.status_code for response in good] == [200] * 7
    assert bad.status_code == 422
    assert "idx=99" in bad.json()["error"]
    assert batches["execution_count"] >= 2  # they met in one batch, then ran alone


@pytest.mark.parametrize("via", [None, "Cast"])
@pytest.mark.parametrize("backend", ["openvino", "onnxruntime"])
def test_a_token_past_the_embedding_table_is_a_400_on_every_backend(
    tmp_path: Path, backend: str, via: str | None
) -> None:
    """OpenVINO (the CPU default) answers token ids past an embedding's rows with zeros, not an
    error: the door bounds an input the model gathers a weight's rows by (directly, or cast to
    INT32 first as exporters do), on every route."""
    model = functools.partial(sequence_model, via=via)
    source = write_function(tmp_path / "tokens", model, '[function]\nname = "tokens"\n')
    app = create_app(Runtime.load(build(source, tmp_path / "bundle"), backend=backend))
    with serving(app) as url, httpx.Client(base_url=url, timeout=30) as client:
        assert client.post(INFER_TOKENS, json=token_request([0, 31, -32])).status_code == 200
        for tokens in ([1, 32, 3], [1, -33, 3], [1, 2, 10**6]):
            response = client.post(INFER_TOKENS, json=token_request(tokens))
            assert response.status_code == 400, (tokens, response.text)
            at, bad = next((at, id) for at, id in enumerate(tokens) if not -32 <= id <= 31)
            assert response.json()["error"] == (
                f"tensor `tokens`: value {bad} at [0, {at}] is out of range: the model looks it "
                "up in `table`, a table of 32 rows, so expected -32..31"
            )
        invoked = client.post("/invoke", json={"tokens": [[1, 40]]})
        assert invoked.status_code == 400
        assert "value 40 at [0, 1] is out of range" in invoked.json()["error"]


INFER_TOKENS = "/v2/models/tokens/infer"
PAGES = """
[function]
name = "pages"
[batching]
max_batch_size = 8
preferred_batch_sizes = [8]
max_queue_delay_ms = 200
[handler]
module = "handler"
[backend]
prefer = ["onnxruntime"]
"""
LINES_HANDLER = """
import numpy as np

def preprocess(payload, ctx):  # one item per line of tokens, as OCR makes one per text line
    return [{"tokens": np.asarray(line, dtype=np.int64)} for line in payload["lines"]]

def postprocess(items, ctx):
    return len(items)
"""


def test_when_one_item_fails_the_request_s_waiting_items_are_withdrawn(tmp_path: Path) -> None:
    """A page of 5 lines, the second holding a token past the vocabulary: the batch of all 5
    is refused, so they run one by one; once the second fails, the 3 after it never run."""
    model = functools.partial(slow_model, depth=4, rows=16, vocab=32, via="Abs")
    source = write_function(tmp_path / "pages", model, PAGES, LINES_HANDLER)
    app = create_app(Runtime.load(build(source, tmp_path / "bundle")))
    good, bad = [1] * 16, [1] * 15 + [99]
    with serving(app) as url, httpx.Client(base_url=url, timeout=30) as client:
        response = client.post("/invoke", json={"lines": [good, bad, good, good, good]})
        assert response.status_code == 422
        assert "idx=99" in response.json()["error"]
        stats = client.get("/v2/models/pages/stats").json()["model_stats"][0]
        assert (stats["execution_count"], stats["inference_count"]) == (1, 1)  # the first line
        assert client.post("/invoke", json={"lines": [good] * 3}).json() == 3


SHAPING = """
[function]
name = "shaping"
[batching]
max_batch_size = 8
preferred_batch_sizes = [4]
max_queue_delay_ms = 3000
[backend]
prefer = ["{backend}"]
precision = "fp32"
[resources]
processes_per_device = 1
"""


def tensor(name: str, datatype: str, values: list[Any]) -> dict[str, Any]:
    return {"name": name, "datatype": datatype, "shape": [1, len(values)], "data": values}


FAILING_VALUES = {  # model: (a good request, its answer, a request the model fails on, words:
    # a pattern, since each provider words it its own way)
    "reshaping": (
        [tensor("x", "FP32", [0, 1, 2, 3, 4, 5]), tensor("cols", "INT64", [6])],
        [0, 1, 2, 3, 4, 5],
        [tensor("x", "FP32", [0, 1, 2, 3, 4, 5]), tensor("cols", "INT64", [7])],
        "eshape",
    ),
    "top": (
        [tensor("x", "FP32", [3, 1, 4, 2]), tensor("k", "INT64", [2])],
        [4, 3],
        [tensor("x", "FP32", [3, 1, 4, 2]), tensor("k", "INT64", [9])],
        r"k argument \[9\] should not be greater than specified axis dim value \[4\]"
        r"|Value of K outside range. K value: 9",  # the CPU's words | CUDA's
    ),
}


async def send_together(url: str, bodies: list[dict[str, Any]]) -> list[httpx.Response]:
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        sent = (client.post("/v2/models/shaping/infer", json=body) for body in bodies)
        return await asyncio.gather(*sent)


@pytest.mark.parametrize(
    ("model", "backend", "workers"),
    [
        (reshaping_model, "onnxruntime", "1"),
        (reshaping_model, "onnxruntime", "2"),
        (reshaping_model, "openvino", "1"),
        (reshaping_model, "openvino", "2"),
        (top_model, "onnxruntime", "1"),
    ],
)
def test_a_request_the_model_fails_on_gets_a_422_and_its_batch_mates_their_answers(
    tmp_path: Path, model: Any, backend: str, workers: str
) -> None:
    """A value the door cannot judge (a Reshape's width, TopK's k, read from an input) makes
    the model fail the batch of 4 it shares with 3 good requests. That request was answered
    500 "internal server error", as if edgeserve were at fault; it now gets 422 with the
    backend's words, and the batch's 3 others, rerun one by one, their own answers: in one
    process and with the inference process behind fronts alike."""
    good, answer, bad, words = FAILING_VALUES[model.__name__.removesuffix("_model")]
    source = write_function(tmp_path / "shaping", model, SHAPING.format(backend=backend))
    with running(source, "--workers", workers) as (url, _):
        *fine, refused = asyncio.run(send_together(url, [{"inputs": good}] * 3 + [{"inputs": bad}]))
        stats = httpx.get(f"{url}/v2/models/shaping/stats").json()["model_stats"][0]
        assert (
            httpx.post(f"{url}/v2/models/shaping/infer", json={"inputs": good}).status_code == 200
        )
    for response in fine:
        assert response.status_code == 200, response.text
        assert response.json()["outputs"][0]["data"] == answer
    assert refused.status_code == 422, refused.text
    error = refused.json()["error"]
    assert error.startswith(f"{backend}: the model failed on the request's values: ")
    assert re.search(words, error) and "Exception from" not in error
    assert stats["inference_stats"]["queue"]["count"] == 4 + 4  # the batch of 4, then each alone
    assert (stats["execution_count"], stats["inference_count"]) == (3, 3)


def binary_body(datatype: str, array: np.ndarray) -> tuple[bytes, dict[str, str]]:
    """A v2 request of one input `x`, declared `datatype`, its bytes `array`'s, as binary data."""
    entry = {"name": "x", "datatype": datatype, "shape": list(array.shape)}
    header = orjson.dumps({"inputs": [entry | {"parameters": {"binary_data_size": array.nbytes}}]})
    return header + array.tobytes(), {"Inference-Header-Content-Length": str(len(header))}


def test_bf16_and_uint16_are_told_apart(tmp_path: Path, client: httpx.Client) -> None:
    """Both travel as uint16 arrays, which the door cannot tell apart: UINT16 numbers sent to a
    BF16 input ran as bf16 bits (16256 as 1.0), and BF16 sent to an FP32 input was refused as
    "got [1, 3] UINT16", a datatype the client never sent."""
    model = cast(tmp_path / "bfin.onnx", TensorProto.BFLOAT16, TensorProto.FLOAT)
    source = write_function(tmp_path / "bfin", lambda path: shutil.copy(model, path), BF16_IN)
    app = create_app(Runtime.load(build(source, tmp_path / "bundle"), backend="onnxruntime"))
    bits = np.array([[16256, 16384, 0, 49024]], np.uint16)  # 1.0, 2.0, 0.0, -1.0 as bf16
    with serving(app) as url, httpx.Client(base_url=url, timeout=30) as bfin:
        content, headers = binary_body("BF16", bits)
        answer = bfin.post("/v2/models/bfin/infer", content=content, headers=headers)
        assert answer.json()["outputs"][0]["data"] == [1.0, 2.0, 0.0, -1.0], answer.text
        content, headers = binary_body("UINT16", bits)
        refused = bfin.post("/v2/models/bfin/infer", content=content, headers=headers)
    assert refused.status_code == 400
    assert refused.json()["error"] == "tensor `x`: expected [-1, 4] BF16, got [1, 4] UINT16"
    header = v2_body(datatype="BF16", data=None, parameters={"binary_data_size": 6})
    sent = client.post(
        INFER,
        content=header + bytes(6),
        headers={"Inference-Header-Content-Length": str(len(header))},
    )
    assert sent.status_code == 400
    assert sent.json()["error"] == "tensor `in_FP32`: expected [-1, 3] FP32, got [1, 3] BF16"


BF16_IN = '[function]\nname = "bfin"\n[backend]\nprefer = ["onnxruntime"]\n'
