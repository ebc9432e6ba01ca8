"""A corpus of malformed requests, by class, each with the status and words a client must read.

They are sent to a function serving `tests.models.identity_model` over INPUTS (one Identity
per datatype, `in_<DT>` [N, 3] -> `out_<DT>`), with no handler, under a body limit of LIMIT.
"""

from __future__ import annotations

import base64
import gzip
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import msgpack
import numpy as np
import orjson

from edgeserve.datatypes import DATATYPES
from edgeserve.http.invoke import NDARRAY_EXT, pack_array

INPUTS = ("FP32", "FP16", "INT64", "INT8", "UINT8", "BOOL", "BYTES")
LIMIT = 64 * 1024
INFER = "/v2/models/identity/infer"
GOOD_ROW: dict[str, list[Any]] = {
    "FP32": [1.5, -2.0, 3.0],
    "FP16": [0.5, 1.0, 2.0],
    "INT64": [1, -2, 3],
    "INT8": [-128, 0, 127],
    "UINT8": [0, 1, 255],
    "BOOL": [True, False, True],
    "BYTES": ["a", "", "c"],
}


@dataclass(frozen=True)
class Bad:
    """One malformed request: what it is, where it goes, what must come back."""

    what: str
    body: bytes
    status: int
    words: str
    path: str = INFER
    headers: dict[str, str] = field(default_factory=dict)
    method: str = "POST"


def v2_body(**changes: Any) -> bytes:
    """A valid JSON infer request for every input, with one input's fields changed.

    `changes` go to the input named by `changes.pop("input")` (default in_FP32)."""
    target = "in_" + changes.pop("input", "FP32")
    inputs = []
    for datatype, row in GOOD_ROW.items():
        entry = {"name": f"in_{datatype}", "datatype": datatype, "shape": [1, 3], "data": row}
        if entry["name"] == target:
            entry = {k: v for k, v in {**entry, **changes}.items() if v is not None}
        inputs.append(entry)
    return orjson.dumps({"inputs": inputs})


def payload(**changes: Any) -> dict[str, Any]:
    """A valid `/invoke` payload (one row per input) with some inputs' values replaced."""
    return {f"in_{dt}": [row] for dt, row in GOOD_ROW.items()} | {
        f"in_{dt}": value for dt, value in changes.items()
    }


DEEP = "@deep@"


def nest(body: bytes, levels: int, leaf: bytes = b"1") -> bytes:
    """`body` with the string DEEP replaced by `leaf` in `levels` lists (deeper than orjson
    writes, as deep as it reads)."""
    return body.replace(orjson.dumps(DEEP), b"[" * levels + leaf + b"]" * levels)


def with_request(**fields: Any) -> bytes:
    """A valid JSON infer request with request-level fields (outputs, parameters) set."""
    return orjson.dumps({**orjson.loads(v2_body()), **fields})


def with_nan(body: bytes, *swaps: tuple[bytes, bytes]) -> bytes:
    """`body` with a NaN field first (read by Python's json, which orjson refuses) and each
    (old, new) swapped in: what orjson cannot write, a lone surrogate or a huge integer."""
    body = b'{"n": NaN, ' + body[1:]
    for old, new in swaps:
        body = body.replace(old, new, 1)
    return body


MANY_UNKNOWN = [
    {"name": f"x{i}", "datatype": "FP32", "shape": [0], "data": []} for i in range(1000)
]


def lying_gzip(size: int | None = None, crc: int | None = None) -> bytes:
    """A valid request gzipped, its trailer's CRC-32 or uncompressed size replaced."""
    body = bytearray(gzip.compress(v2_body()))
    if crc is not None:
        body[-8:-4] = crc.to_bytes(4, "little")
    if size is not None:
        body[-4:] = size.to_bytes(4, "little")
    return bytes(body)


def binary_fp32(size: Any, tail: bytes, header_length: str | None = None) -> Bad:
    header = orjson.dumps(
        {
            "inputs": [
                {
                    "name": "in_FP32",
                    "datatype": "FP32",
                    "shape": [1, 3],
                    "parameters": {"binary_data_size": size},
                }
            ]
        }
    )
    length = str(len(header)) if header_length is None else header_length
    return Bad(
        f"binary size {size!r}, length {length}",
        header + tail,
        400,
        "",
        headers={"Inference-Header-Content-Length": length},
    )


def binary_twice() -> Bad:
    """A binary request whose input gives binary_data_size twice: 4 bytes, then 12."""
    good = binary_fp32(12, b"\0" * 12)
    header = good.body[:-12].replace(b'{"binary', b'{"binary_data_size":4,"binary')
    return replace(
        good,
        what="binary_data_size given twice",
        body=header + b"\0" * 12,
        words="key `binary_data_size` is given 2 times in `inputs[0].parameters`",
        headers={"Inference-Header-Content-Length": str(len(header))},
    )


def respelled(spell: Callable[[int], str]) -> Bad:
    """A binary request whose Inference-Header-Content-Length is the right count as Python's
    int() reads it, which is no HTTP byte count (a sign, digit grouping)."""
    good = binary_fp32(12, b"\0" * 12)
    length = spell(int(good.headers["Inference-Header-Content-Length"]))
    return replace(
        good,
        what=f"header length {length!r}",
        words=f"Inference-Header-Content-Length: expected a byte count in 1..{len(good.body)}",
        headers={"Inference-Header-Content-Length": length},
    )


def _msgpack(value: Any) -> bytes:
    return msgpack.packb(value, use_bin_type=True, strict_types=False)


JSON = {"content-type": "application/json"}
MSGPACK = {"content-type": "application/msgpack"}


def _msgpack_map(items: list[tuple[Any, Any]]) -> bytes:
    """A msgpack map of `items` as they are, a key given twice included (packb takes dicts)."""
    assert len(items) < 16  # one fixmap byte
    return bytes([0x80 | len(items)]) + b"".join(_msgpack(k) + _msgpack(v) for k, v in items)


NAN = float("nan")
INT64_WHERE = "tensor `in_INT64`: INT64 [-1, 3]"


def to_invoke(what: str, body: Any, words: str, headers: dict[str, str] = JSON) -> Bad:
    """A 400 from `/invoke`; a body that is not bytes yet is packed as `headers` say."""
    if not isinstance(body, bytes):
        body = _msgpack(body) if headers is MSGPACK else orjson.dumps(body)
    return Bad(what, body, 400, words, path="/invoke", headers=headers)


def ext(data: bytes) -> msgpack.ExtType:
    return msgpack.ExtType(NDARRAY_EXT, data)


def array_ext(dtype: str) -> msgpack.ExtType:
    return pack_array(np.zeros((1, 3), dtype))


def form(data: bytes, encoding: str = "base64", **disposition: str) -> tuple[bytes, dict[str, str]]:
    """A multipart/form-data body of one JSON file sent with a Content-Transfer-Encoding, and its
    headers; `disposition`: name and filename (a field "file", a file "rows.json")."""
    names = {"name": "file", "filename": "rows.json"} | disposition
    params = "".join(f'; {key}="{value}"' for key, value in names.items())
    body = (
        (
            f"--B\r\nContent-Disposition: form-data{params}\r\nContent-Type: application/json\r\n"
            f"Content-Transfer-Encoding: {encoding}\r\n\r\n"
        ).encode()
        + data
        + b"\r\n--B--\r\n"
    )
    return body, {"content-type": "multipart/form-data; boundary=B"}


def bad_form(what: str, data: bytes, words: str, encoding: str = "base64") -> Bad:
    body, headers = form(data, encoding)
    return Bad(what, body, 400, words, path="/invoke", headers=headers)


FORM_PART = 'request body: multipart/form-data: part 1 (field "file", file "rows.json")'


ONCE = "expected each key once in an object (readers differ on which one counts"
GZIP = {"content-encoding": "gzip"}
EXT = f"msgpack ext {NDARRAY_EXT} (a numpy array as [dtype, shape, bytes])"
SHM = "/v2/systemsharedmemory/region"
EXT_WHERE = f"request body: {EXT}"  # an ext sent as no input: the body itself
FP32_WHERE = "tensor `in_FP32`: FP32 [1, 3]"
FP32_NAME = "tensor `in_FP32`"

CORPUS: list[Bad] = [
    # v2 JSON: not a request at all
    Bad("not json", b"{not json", 400, "not valid JSON"),
    Bad("a list", b"[1, 2]", 400, "request body: expected a JSON object"),
    Bad("empty body", b"", 400, "not valid JSON"),
    Bad("inputs not a list", b'{"inputs": 3}', 400, "request `inputs`: expected a JSON list"),
    Bad(  # neither this nor a nameless input said which one: "an input: expected ..."
        "input not an object",
        with_request(inputs=[orjson.loads(v2_body())["inputs"][0], 7]),
        400,
        "request `inputs[1]`: expected a JSON object, got 7",
    ),
    Bad(  # it named no byte
        "invalid utf-8",
        b'{"inputs": "\xff"}',
        400,
        "request body: not UTF-8 text, so not JSON: byte 12 (0xff): invalid start byte (another",
    ),
    Bad(
        "latin-1 after a NaN",
        '{"inputs": [NaN, "é"]}'.encode("latin-1"),
        400,
        "request body: not UTF-8 text, so not JSON: byte 18 (0xe9): invalid continuation byte",
    ),
    Bad(
        "utf-16 json",
        '{"inputs": []}'.encode("utf-16"),
        400,
        "not UTF-8 text, so not JSON: byte 0 (0xff): invalid start byte",
    ),
    Bad(
        "id a number",
        orjson.dumps({"id": 5, **orjson.loads(v2_body())}),
        400,
        "request `id`: expected a string, got 5",
    ),
    Bad(
        "invoke msgpack sent as json",
        msgpack.packb(payload()),
        400,
        "(0x87): invalid start byte (another encoding, or msgpack sent with",
        path="/invoke",
        headers={"content-type": "application/json"},
    ),
    # what is missing or null, in JSON's words: it was "got NoneType", "got None", "got dict"
    Bad("no inputs", b"{}", 400, "request `inputs`: expected a JSON list, got nothing (the key is"),
    Bad(
        "an /invoke body, as samples/request.json, sent to v2 infer",
        orjson.dumps(payload()),
        400,
        "(the key is missing; the body holds `in_FP32`, `in_FP16`, `in_INT64`, tensors by name "
        "as /invoke takes them). Hint: POST this body to /invoke, or send KServe v2's",
    ),
    Bad("inputs an object", b'{"inputs": {}}', 400, "expected a JSON list, got an object"),
    Bad(
        "shape missing",
        v2_body(shape=None),
        400,
        f"{FP32_NAME}: `shape` must be a list of non-negative ints, got nothing (the key is "
        "missing)",
    ),
    Bad(
        "datatype missing",
        v2_body(datatype=None),
        400,
        f"{FP32_NAME}: `datatype` is missing; expected one of [",
    ),
    Bad(
        "datatype null",
        nest(v2_body(datatype=DEEP), 0, b"null"),
        400,
        f"{FP32_NAME}: unknown datatype null; expected",
    ),
    to_invoke(
        "invoke null",
        b"null",
        "'in_UINT8', 'in_BOOL', 'in_BYTES'], got null",
    ),
    # v2 JSON: wrong types, datatypes, shapes
    Bad(
        "name missing",
        v2_body(input="INT64", name=None),
        400,
        "request `inputs[2]`: expected a string `name`, got nothing (the key is missing)",
    ),
    Bad(  # "a requested output: ..."
        "output not an object",
        with_request(outputs=[{"name": "out_FP32"}, None]),
        400,
        "request `outputs[1]`: expected a JSON object, got null",
    ),
    Bad(
        "output name a number",
        with_request(outputs=[{"name": 5}]),
        400,
        "request `outputs[0]`: expected a string `name`, got 5",
    ),
    Bad("unknown datatype", v2_body(datatype="FP8"), 400, "unknown datatype 'FP8'"),
    Bad("datatype a number", v2_body(datatype=32), 400, "unknown datatype 32"),
    Bad("shape negative", v2_body(shape=[1, -3]), 400, "non-negative ints"),
    Bad("shape booleans", v2_body(shape=[True, 3]), 400, "non-negative ints"),
    Bad("shape a string", v2_body(shape="1,3"), 400, "non-negative ints"),
    Bad("count mismatch", v2_body(shape=[2, 3]), 400, f"{FP32_WHERE[:-6]}[2, 3]: expected 6"),
    Bad(  # it read "inputs {'in_FP32': 2, 'in_FP16': 1, ...}: expected every input to have ..."
        "rows differ",
        v2_body(input="FP16", shape=[2, 3], data=[0.5] * 6),
        400,
        "inputs `in_FP32`, `in_INT64`, `in_INT8`, `in_UINT8`, `in_BOOL`, `in_BYTES` (1 row) and "
        "`in_FP16` (2 rows): every input must have the same number of rows (axis 0, the batch "
        "axis), at least 1",
    ),
    Bad("wrong dims", v2_body(shape=[3, 1]), 400, "tensor `in_FP32`: expected [-1, 3] FP32"),
    Bad(  # it said what was expected, not that the batch axis was the one missing
        "no batch axis",
        v2_body(shape=[3]),
        400,
        "tensor `in_FP32`: expected [-1, 3] FP32, got [3] FP32. Hint: the first dim is the batch "
        "axis, which this tensor lacks: one row is [1, 3] (in /invoke JSON, one more level",
    ),
    Bad("wrong datatype", v2_body(datatype="FP64"), 400, "expected [-1, 3] FP32, got [1, 3] FP64"),
    # a wrong datatype is named before the data is read: it was "expected integers, found
    # fractions", and the client fixed its data
    Bad(
        "INT32 for FP32, fractions",
        v2_body(datatype="INT32"),
        400,
        "tensor `in_FP32`: expected [-1, 3] FP32, got [1, 3] INT32",
    ),
    Bad(
        "BOOL for INT64",
        v2_body(input="INT64", datatype="BOOL"),
        400,
        "tensor `in_INT64`: expected [-1, 3] INT64, got [1, 3] BOOL",
    ),
    replace(
        binary_fp32(12, b"\0" * 12),
        what="FP16 for FP32, binary of FP32's size",
        body=binary_fp32(12, b"\0" * 12).body.replace(b'"FP32"', b'"FP16"'),
        words="tensor `in_FP32`: expected [-1, 3] FP32, got [1, 3] FP16",
    ),
    Bad("huge shape", v2_body(shape=[10**12, 10**12]), 400, "more elements than a tensor can"),
    Bad(
        "shape past int64 with a zero dim",
        v2_body(shape=[0, 2**62, 2**62], data=[]),
        400,
        "shape [0, 4611686018427387904, 4611686018427387904] describes more elements",
    ),
    # dims past 64 bits reach the decoder as floats: they were named as such ("got
    # [1.8446744073709552e+19, 3]"), as if the client had sent a fraction
    Bad(
        "shape past 64 bits",
        nest(v2_body(shape=DEEP), 1, b"18446744073709551616, 3"),
        400,
        "tensor `in_FP32`: shape [18446744073709551616, 3] describes more elements than",
    ),
    Bad(
        "shape past 64 bits, negative",
        nest(v2_body(shape=DEEP), 1, b"-18446744073709551616, 3"),
        400,
        "`shape` must be a list of non-negative ints, got [-18446744073709551616, 3]",
    ),
    Bad(  # it showed Python's repr: got [1, {'a': ''}]
        "shape holding an object",
        v2_body(input="INT64", shape=[1, {"a": "", "b": None}]),
        400,
        'tensor `in_INT64`: `shape` must be a list of non-negative ints, got [1, {"a": "", '
        '"b": null}]',
    ),
    # v2 JSON: values v2 refuses
    Bad(
        "FP32 null", v2_body(data=[None, 1, 2]), 400, f"{FP32_WHERE}: expected numbers, found null"
    ),
    Bad("FP32 string", v2_body(data=["1", 2, 3]), 400, "expected numbers, found strings"),
    Bad("FP32 boolean", v2_body(data=[True, 2, 3]), 400, "expected numbers, found booleans"),
    Bad("FP32 object", v2_body(data=[{}, 2, 3]), 400, "expected numbers, found objects"),
    Bad("FP16 overflow", v2_body(input="FP16", data=[1e6, 0, 0]), 400, "out of the range of FP16"),
    Bad("FP32 overflow", v2_body(data=[1e300, 0, 0]), 400, "out of the range of FP32"),
    Bad(
        "INT64 true",
        v2_body(input="INT64", data=[True, 1, 2]),
        400,
        "expected integers, found booleans",
    ),
    Bad(
        "INT64 fraction",
        v2_body(input="INT64", data=[1.5, 1, 2]),
        400,
        "expected integers, found fractions",
    ),
    Bad(
        "INT64 too big",
        v2_body(input="INT64", data=[2**63, 1, 2]),
        400,
        "out of the range of INT64",
    ),
    Bad(
        "INT8 300",
        v2_body(input="INT8", data=[300, 1, 2]),
        400,
        "out of the range of INT8 (-128 .. 127)",
    ),
    Bad("UINT8 -1", v2_body(input="UINT8", data=[-1, 1, 2]), 400, "out of the range of UINT8"),
    Bad("BOOL 1", v2_body(input="BOOL", data=[1, 0, 1]), 400, "expected booleans, found integers"),
    Bad(
        "BYTES 1",
        v2_body(input="BYTES", data=[1, "a", "b"]),
        400,
        "expected strings, found integers",
    ),
    Bad(
        "nested 1000 deep",
        nest(v2_body(data=DEEP), 1000),
        400,
        "nested deeper than the tensor's 2 dims",
    ),
    Bad(
        "BYTES nested deep",
        nest(v2_body(input="BYTES", data=DEEP), 900, b'"a"'),
        400,
        "nested deeper",
    ),
    Bad("ragged", v2_body(shape=[3, 1], data=[[1], [2, 3], []]), 400, "`data` is ragged"),
    Bad("unknown input", v2_body(name="in_nope"), 400, "unknown ['in_nope']; missing ['in_FP32']"),
    Bad(
        "misspelt input",
        v2_body(name="in_FP23"),
        400,
        "unknown ['in_FP23']; missing ['in_FP32']; did you mean `in_FP32` for `in_FP23`?",
    ),
    Bad(
        "misspelt output",
        orjson.dumps({**orjson.loads(v2_body()), "outputs": [{"name": "out_FP23"}]}),
        400,
        "the model has no such output; its outputs are ['out_BOOL', 'out_BYTES', 'out_FP16', "
        "'out_FP32', 'out_INT64', 'out_INT8', 'out_UINT8']; did you mean `out_FP32`?",
    ),
    Bad(
        "given twice",
        v2_body(name="in_INT64", datatype="INT64", data=[1, 2, 3]),
        400,
        "given twice",
    ),
    Bad(
        "unknown output",
        orjson.dumps({**orjson.loads(v2_body()), "outputs": [{"name": "z"}]}),
        400,
        "output `z`: the model has no such output",
    ),
    Bad(
        "bad timeout",
        orjson.dumps({**orjson.loads(v2_body()), "parameters": {"timeout": -1}}),
        400,
        "parameters.timeout",
    ),
    Bad(
        "unknown model",
        v2_body(),
        400,
        "Request for unknown model: 'other' is not found",
        path="/v2/models/other/infer",
    ),
    Bad(
        "unknown version",
        v2_body(),
        404,
        "Request for unknown model: 'identity' version 9 is not found",
        path="/v2/models/identity/versions/9/infer",
    ),
    *(
        Bad(
            f"load with parameters {parameters!r}",
            orjson.dumps({"parameters": parameters}),
            400,
            "load `identity`: `parameters`: expected a JSON object, got",
            path="/v2/repository/models/identity/load",
        )
        for parameters in (5, [1, "a"], True, "config", None, [], 0, False, "")  # falsy: taken
    ),
    *(
        Bad(
            f"{path}: a body past the limit",
            b"{" + b" " * LIMIT + b"}",
            413,
            f"request body: over the limit of {LIMIT} bytes",
            path=path,
        )
        for path in (
            "/v2/repository/index",
            "/v2/repository/models/identity/load",
            "/v2/systemsharedmemory/region/r/register",
        )
    ),
    Bad(
        "index of ready models, ready not a boolean",
        b'{"ready": "no"}',
        400,
        "`ready`: expected true or false, got 'no'",
        path="/v2/repository/index",
    ),
    *(
        Bad(
            f"{path}: a JSON {body.decode()} for an object",
            body,
            400,
            f"{path}: expected a JSON object, got {words}",  # JSON's words, not Python's
            path=path,
        )
        for path in (
            "/v2/repository/index",
            "/v2/repository/models/identity/load",
            "/v2/systemsharedmemory/region/r/register",
        )
        for body, words in ((b"null", "null"), (b"[1]", "a list"), (b"true", "true"))
    ),
    *(
        Bad(
            f"region {field} {value!r}",
            orjson.dumps({"key": "/input0", "byte_size": 8} | {field: value}),
            400,
            f"`{field}` must be {expected}, got {words}",
            path=f"{SHM}/r/register",
        )
        for field, expected in (
            ("key", "a shared-memory name like '/input0'"),
            ("byte_size", "a non-negative integer"),
        )
        for value, words in ((None, "null"), (True, "true"), ({"v": 1}, "an object"))
    ),
    *(
        Bad(  # the colons in strings were counted by recursion: a 500 (RecursionError)
            f"{path}: a string with a colon beside 1000 nested lists",
            b'{"in_BYTES": ["a:b"], "in_FP32": ' + b"[" * 1000 + b"1" + b"]" * 1000 + b"}",
            400,
            "nested too deep to check that no object gives a key twice",
            path=path,
            headers=JSON,
        )
        for path in ("/invoke", "/v2/repository/index")
    ),
    Bad("shape of 10000 dims", v2_body(shape=[1] * 10_000, data=[1]), 400, "has 10000 dims"),
    Bad(
        "1000 dims, nested as deep",
        nest(v2_body(shape=[1] * 1000, data=DEEP), 1000),
        400,
        "tensor `in_FP32`: `shape` has 1000 dims; expected at most 32",
    ),
    Bad(
        "INT64 past 64 bits (a float to JSON parsers)",
        nest(v2_body(input="INT64", data=DEEP), 1, b"18446744073709551616, 1, 2"),
        400,
        "a value (18446744073709551616) is out of the range of INT64",
    ),
    Bad(
        "output asked twice",
        with_request(outputs=[{"name": "out_FP32"}, {"name": "out_FP32"}]),
        400,
        "output `out_FP32`: requested twice",
    ),
    Bad(  # a million of them, in 56 MB, held the event loop for 9 s
        "5000 inputs",
        orjson.dumps({"inputs": [{}] * 5000}),
        400,
        "request `inputs`: 5000 tensors; expected at most 4096 (a model has fewer)",
    ),
    Bad(
        "5000 outputs asked",
        with_request(outputs=[{}] * 5000),
        400,
        "request `outputs`: 5000 tensors; expected at most 4096 (a model has fewer)",
    ),
    Bad(
        "3000 outputs asked",
        with_request(outputs=[{"name": f"o{i}"} for i in range(3000)]),
        400,
        "output `o0`: the model has no such output",
    ),
    Bad(
        "NaN, and a lone surrogate as the id",
        with_nan(v2_body(), (b"{", b'{"id": "\\ud800", ')),
        400,
        "surrogates not allowed",
    ),
    Bad(
        "NaN, and a lone surrogate in BYTES data",
        with_nan(v2_body(), (b'"a"', b'"\\ud800"')),
        400,
        "surrogates not allowed",
    ),
    Bad(
        "NaN, and a timeout of 400 digits",
        with_nan(with_request(parameters={"timeout": 7}), (b":7", b":1" + b"0" * 400)),
        400,
        "Integer exceeds 64-bit range",
    ),
    # with a NaN in it, any other mistake was blamed on the NaN ("unexpected character ...
    # line 1 column 7", which Python's json and Triton read): now on what is wrong
    Bad(
        "NaN, then a value missing",
        with_nan(v2_body(), (b"[1.5,", b"[1.5,,")),
        400,
        "request body: not valid JSON: Expecting value: line 1 column 84 (char 83)",
    ),
    Bad(
        "NaN, then nested 5000 deep",
        with_nan(nest(v2_body(data=DEEP), 5000)),
        400,
        "request body: not valid JSON: nested too deep to read",
    ),
    Bad(
        "NaN, and an integer of 5000 digits",
        with_nan(v2_body(input="INT64"), (b"[1,", b"[1" + b"0" * 5000 + b",")),
        400,
        "request body: not valid JSON: an integer of over 4300 digits",
    ),
    Bad(
        "binary_data a string",
        with_request(outputs=[{"name": "out_FP32", "parameters": {"binary_data": "no"}}]),
        400,
        "output `out_FP32`: `parameters`: binary_data: expected true or false, got 'no'",
    ),
    Bad(
        "binary_data_output a number",
        with_request(parameters={"binary_data_output": 1}),
        400,
        "request `parameters`: binary_data_output: expected true or false, got 1",
    ),
    Bad(
        "a request parameter that is an object",
        with_request(parameters={"tag": {"nested": 1}}),
        400,
        "request `parameters`: `tag`: expected a string, number or boolean, got an object",
    ),
    Bad(
        "an output parameter that is null",
        with_request(outputs=[{"name": "out_FP32", "parameters": {"classification": None}}]),
        400,
        "output `out_FP32`: `parameters`: `classification`: expected a string, number or "
        "boolean, got null",
    ),
    Bad(
        "1000 unknown inputs",
        with_request(inputs=[*orjson.loads(v2_body())["inputs"], *MANY_UNKNOWN]),
        400,
        "unknown ['x0', 'x1', 'x10', 'x100', 'x101', 'x102', 'x103', 'x104', 'x105', 'x106'] "
        "and 990 more",
    ),
    # a key given twice in one object: the last one was read, silently (Triton reads the first)
    Bad(
        "inputs given twice",
        b'{"inputs": [], ' + v2_body()[1:],
        400,
        f"request body: key `inputs` is given 2 times in the top-level object; {ONCE}",
    ),
    Bad(
        "a tensor with two data keys",
        v2_body().replace(b'"data":', b'"data":[9,9,9],"data":', 1),
        400,
        f"request body: key `data` is given 2 times in `inputs[0]`; {ONCE}",
    ),
    Bad(
        "a request parameter given three times",
        with_request(parameters={"timeout": 1}).replace(
            b'"timeout":1', b'"timeout":1,' * 2 + b'"timeout":0'
        ),
        400,
        f"key `timeout` is given 3 times in `parameters`; {ONCE}",
    ),
    Bad(
        "a key given twice, and a NaN",
        with_nan(v2_body().replace(b'"shape":', b'"shape":[3],"shape":', 2)),
        400,
        f"key `shape` is given 2 times in `inputs[0]`; {ONCE}",
    ),
    Bad(
        "a key given twice beside a colon written as an escape",
        b'{"id": "a\\u003ab", "inputs": [], ' + v2_body()[1:],
        400,
        f"request body: key `inputs` is given 2 times in the top-level object; {ONCE}",
    ),
    binary_twice(),
    to_invoke(
        "invoke input given twice",
        b'{"in_FP32": [[1, 2, 3]], ' + orjson.dumps(payload())[1:],
        f"request body: key `in_FP32` is given 2 times in the top-level object; {ONCE}",
    ),
    Bad(
        "index with ready given twice",
        b'{"ready": true, "ready": false}',
        400,
        f"/v2/repository/index: body: key `ready` is given 2 times in the top-level object; {ONCE}",
        path="/v2/repository/index",
    ),
    Bad("GET on infer", b"", 405, "Method Not Allowed", method="GET"),
    Bad(  # Triton's 404, not a redirect built from the Host header
        "metadata with a trailing slash",
        b"",
        404,
        "Not Found",
        path="/v2/models/identity/",
        method="GET",
        headers={"Host": "elsewhere.example"},
    ),
    # the binary extension: lies in Inference-Header-Content-Length and binary_data_size
    binary_fp32(12, b"\0" * 12, "100000"),
    binary_fp32(12, b"\0" * 12, "-5"),
    binary_fp32(12, b"\0" * 12, "twelve"),
    binary_fp32(12, b"\0" * 12, "0"),
    replace(  # it read "request body: not valid JSON: ...", for a body that is not all JSON
        binary_fp32(12, b"\0" * 12, "3"),
        words="request JSON header (the body's first Inference-Header-Content-Length bytes): "
        "not valid JSON: unexpected end of data: line 1 column 4 (char 3). Hint: "
        "Inference-Header-Content-Length (3 bytes here) is the length of the JSON header alone",
    ),
    replace(
        binary_fp32(12, b"\0" * 12, str(len(binary_fp32(12, b"").body) + 4)),
        words="is the length of the JSON header alone; the inputs' binary data follows it",
    ),
    Bad(
        "binary JSON header a list",
        b'[{"name": "in_FP32"}]' + b"\0" * 12,
        400,
        "request JSON header (the body's first Inference-Header-Content-Length bytes): expected "
        "a JSON object, got a list",
        headers={"Inference-Header-Content-Length": "21"},
    ),
    binary_fp32(12, b"\0" * 8),
    binary_fp32(8, b"\0" * 8),
    binary_fp32(12, b"\0" * 16),
    binary_fp32(True, b"\0"),
    replace(binary_fp32(-4, b""), words="expected a non-negative integer byte count, got -4"),
    binary_fp32("12", b"\0" * 12),
    replace(binary_fp32(12.0, b"\0" * 12), words="binary_data_size: expected a non-negative"),
    binary_fp32(2**63, b"\0" * 12),
    respelled(lambda length: f"+{length}"),
    respelled(lambda length: f"{length // 10}_{length % 10}"),
    # encodings and sizes: bombs and lies
    Bad("gzip bomb", gzip.compress(b"\0" * (LIMIT * 64)), 413, "over the limit", headers=GZIP),
    Bad("not gzip", b"plain text", 400, "not valid gzip data", headers=GZIP),
    Bad("gzip then junk", gzip.compress(v2_body()) + b"junk", 400, "4 bytes follow", headers=GZIP),
    Bad(
        "two gzip members",
        gzip.compress(b"{") + gzip.compress(b"}"),
        400,
        "several members",
        headers=GZIP,
    ),
    Bad("truncated gzip", gzip.compress(v2_body())[:-12], 400, "truncated gzip", headers=GZIP),
    Bad("gzip lying about its size", lying_gzip(size=5), 400, "incorrect length", headers=GZIP),
    Bad("gzip with a wrong CRC", lying_gzip(crc=0), 400, "incorrect data check", headers=GZIP),
    Bad(
        "deflate bomb",
        zlib.compress(b"[" * (LIMIT * 8)),
        413,
        "over the limit",
        headers={"content-encoding": "deflate"},
    ),
    Bad(
        "unknown encoding",
        v2_body(),
        400,
        "Content-Encoding 'br' is not supported",
        headers={"content-encoding": "br"},
    ),
    Bad("too long", b" " * (LIMIT + 1), 413, "over the limit of 65536 bytes"),
    # /invoke form uploads whose part does not decode: it was skipped over (`@@@@` + base64)
    # or decoded to nothing, and the handler got what was left
    *(
        bad_form(
            f"form part of base64 {data[:12]!r}",
            data,
            f"{FORM_PART}: its base64 does not decode: {why}; expected the letters A-Z a-z, "
            "digits, `+` and `/`, then `=` padding to a multiple of 4 characters",
        )
        for data, why in [
            (b"!!!!", "Only base64 data is allowed"),
            (b"@@@@" + base64.b64encode(orjson.dumps(payload())), "Only base64 data is allowed"),
            (b"====", "Leading padding not allowed"),
            (b"YQ==YQ==", "Excess data after padding"),
            (b"abc", "Incorrect padding"),
            (b"\xff\xfe", "Only base64 data is allowed"),
            (base64.urlsafe_b64encode(b"\xfb\xff"), "Only base64 data is allowed"),
        ]
    ),
    bad_form(
        "form part of an unknown transfer encoding",
        b"begin 644 rows.json",
        f"{FORM_PART}: Content-Transfer-Encoding `x-uuencode` is not supported; expected base64, "
        "quoted-printable, 7bit, 8bit or binary (or none)",
        encoding="x-uuencode",
    ),
    # /invoke without a handler: JSON, msgpack, raw bytes
    Bad(  # it said "got bytes", not why they were bytes
        "invoke raw bytes",
        b"\x89PNG",
        400,
        "got 4 bytes sent as no Content-Type, which is not JSON or msgpack. Hint: send them with "
        "Content-Type: application/json (or application/msgpack)",
        path="/invoke",
    ),
    Bad(  # an image to a model of tensors: the hint was to send JSON, not how to take images
        "invoke PNG without a handler",
        b"\x89PNG\r\n\x1a\n",
        400,
        "got 8 bytes sent as image/png, which is not JSON or msgpack. Hint: without a handler, "
        "/invoke takes only the model's tensors; to take the file itself, add a handler.py "
        "whose preprocess decodes it into them and name it in function.toml, [handler] module",
        path="/invoke",
        headers={"content-type": "image/png"},
    ),
    Bad(  # the v2 route read it as "not UTF-8 text, so not JSON (... msgpack ...?)"
        "v2 PNG",
        b"\x89PNG\r\n\x1a\n",
        400,
        "request body: 8 bytes sent as image/png; a KServe v2 request is a JSON object naming "
        "the input tensors (their data in it, or as binary after it: "
        "Inference-Header-Content-Length). Hint: POST the file to /invoke, where a handler's",
        headers={"content-type": "image/png"},
    ),
    Bad(  # it read "not UTF-8 text, so not JSON (... msgpack sent with Content-Type
        # application/json?)", to a client that had sent application/msgpack
        "v2 msgpack",
        _msgpack(payload()),
        400,
        "bytes sent as application/msgpack; a KServe v2 request is JSON (binary tensors follow "
        "a JSON header: Inference-Header-Content-Length). Hint: POST msgpack to /invoke",
        headers=MSGPACK,
    ),
    Bad(  # it read "not valid JSON: unexpected content after document", no word of the header
        "invoke a binary v2 request",
        binary_fp32(12, b"\0" * 12).body,
        400,
        "not valid JSON: unexpected content after document: line 1 column 101 (char 100). Hint: "
        "the request has an Inference-Header-Content-Length header, which only the v2 route "
        "reads",
        path="/invoke",
        headers={
            "Inference-Header-Content-Length": binary_fp32(12, b"").headers[
                "Inference-Header-Content-Length"
            ],
            **JSON,
        },
    ),
    Bad(
        "invoke JSON sent as text",
        orjson.dumps(payload()),
        400,
        "bytes sent as text/plain, which is not JSON or msgpack",
        path="/invoke",
        headers={"content-type": "text/plain"},
    ),
    to_invoke("invoke list", b"[1]", "expected a JSON object (or msgpack map) with the inputs"),
    to_invoke("invoke unknown", payload() | {"zz": 1}, "unknown ['zz']"),
    to_invoke(
        "invoke INT64 1.5", payload(INT64=[[1.5, 1, 2]]), f"{INT64_WHERE}: expected integers"
    ),
    to_invoke("invoke INT64 true", payload(INT64=[[True, 1, 2]]), "found booleans"),
    to_invoke("invoke INT8 300", payload(INT8=[[300, 1, 2]]), "out of the range of INT8"),
    to_invoke("invoke INT64 huge", payload(INT64=[[2**64 - 1, 1, 2]]), "out of the range of INT64"),
    to_invoke("invoke FP32 null", payload(FP32=[[None, 1, 2]]), "found null"),
    to_invoke("invoke FP32 string", payload(FP32=[["1", 1, 2]]), "found strings"),
    to_invoke("invoke ragged", payload(FP32=[[1, 2, 3], [1]]), "ragged"),
    to_invoke(
        "invoke no batch axis",
        payload(FP32=[1, 2, 3]),
        "expected [-1, 3] FP32, got [3] FP32. Hint: the first dim is the batch axis",
    ),
    to_invoke("invoke wrong dims", payload(FP32=[[1, 2]]), "expected [-1, 3] FP32, got [1, 2]"),
    to_invoke("invoke deep", nest(orjson.dumps(payload(FP32=DEEP)), 1000), "nested deeper"),
    *(  # msgpack's own words named Python's types and its reader's strict_map_key argument
        to_invoke(f"msgpack {kind} keys", {key: 2}, f"a map key is {kind}; expected str", MSGPACK)
        for key, kind in ((1, "an integer"), (None, "nil"), ((1,), "an array"))
    ),
    to_invoke(
        "msgpack str not UTF-8",
        b"\x81\xa7in_FP32\xa2\xff\xfe",
        "not valid msgpack: a str is not UTF-8 (invalid start byte at its byte 0); send bytes as",
        MSGPACK,
    ),
    to_invoke(  # it read "not valid msgpack: code must be 0~127"
        "msgpack reserved ext",
        _msgpack(payload(FP32=msgpack.ExtType(5, b""))).replace(b"\xc7\x00\x05", b"\xc7\x00\xfe"),
        "tensor `in_FP32`: msgpack ext -2: a type msgpack reserves; expected ext 0 to 127",
        MSGPACK,
    ),
    to_invoke(  # it read "unknown [\"b'k'\"]", Python's repr of bytes
        "msgpack bytes keys",
        payload() | {b"k": 1},
        "keys that are not strings: bytes (a msgpack bin) of the text 'k'; expected names as "
        "strings (msgpack str, not bin)",
        MSGPACK,
    ),
    to_invoke(  # it read "got 3 bytes sent as application/msgpack, which is not JSON or msgpack"
        "msgpack bin body",
        b"\xc4\x03abc",
        "the inputs ['in_FP32', 'in_FP16', 'in_INT64', 'in_INT8', 'in_UINT8', 'in_BOOL', "
        "'in_BYTES'], got bytes (a msgpack bin) of the text 'abc'",
        MSGPACK,
    ),
    to_invoke(  # it read "got ExtType(code=5, data=b'x')"
        "msgpack ext body", msgpack.ExtType(5, b"x"), "got a msgpack ext of type 5", MSGPACK
    ),
    to_invoke(
        "msgpack key given twice",
        _msgpack_map([*payload().items(), ("in_FP32", [[9, 9, 9]])]),
        "request body: msgpack map key 'in_FP32' is given 2 times; expected each key once",
        MSGPACK,
    ),
    to_invoke(  # it read "not valid msgpack: malformed data (FormatError)", a Python class
        "msgpack garbage",
        b"\xc1\xc1",
        "not valid msgpack: malformed data: a byte that starts no msgpack type (such as 0xc1)",
        MSGPACK,
    ),
    to_invoke(  # "Unpack failed: incomplete input"
        "msgpack truncated",
        _msgpack(payload())[:-3],
        "request body: not valid msgpack: the data ends before its value does (cut short, or",
        MSGPACK,
    ),
    to_invoke(  # "3 exceeds max_array_len(2)": an argument of msgpack's Python reader
        "msgpack array cut short",
        b"\x93\x01",
        "not valid msgpack: an array is longer than the bytes left: the data ends before",
        MSGPACK,
    ),
    to_invoke(  # "unpack(b) received extra data."
        "msgpack trailing bytes",
        _msgpack(payload()) + b"\x01\x02",
        "not valid msgpack: 2 bytes after its first value; expected one value",
        MSGPACK,
    ),
    to_invoke("msgpack deep", b"\x91" * 5000 + b"\x01", "nested deeper than msgpack", MSGPACK),
    to_invoke("msgpack NaN into INT64", payload(INT64=[[NAN, 1, 2]]), "found fractions", MSGPACK),
    to_invoke("msgpack FP32 bytes", payload(FP32=[[b"1", 1, 2]]), "found bytes", MSGPACK),
    to_invoke(  # it read "tensor `in_BYTES`: onnxruntime takes UTF-8 text only"
        "msgpack bin not UTF-8 into BYTES",
        payload(BYTES=[["a", b"\xc3(", "c"]]),
        "tensor `in_BYTES`: element [0, 1] is not UTF-8 (invalid continuation byte at its byte 0),"
        " and onnxruntime takes UTF-8 text only; send text, or binary data encoded as text "
        "(base64)",
        MSGPACK,
    ),
    to_invoke(  # it read "found Timestamp", "found ExtType": Python's names
        "msgpack timestamp into FP32",
        payload(FP32=[[msgpack.Timestamp(0), 1, 2]]),
        "tensor `in_FP32`: FP32 [-1, 3]: expected numbers, found msgpack timestamps",
        MSGPACK,
    ),
    to_invoke(
        "msgpack exts into INT64",
        payload(INT64=[[msgpack.ExtType(9, b""), msgpack.ExtType(5, b"x"), None]]),
        f"{INT64_WHERE}: expected integers, found null, msgpack exts of type 5, 9",
        MSGPACK,
    ),
    to_invoke(
        "msgpack array ext as a value",
        payload(FP32=[array_ext("<f4")]),
        "found numpy arrays (msgpack ext 1) where values belong",
        MSGPACK,
    ),
    to_invoke(
        "msgpack ext datetime",
        payload(FP32=array_ext("M8[s]")),
        f"tensor `in_FP32`: {EXT}: dtype '<M8[s]' has no KServe v2 datatype; expected one of "
        "'|b1', '|u1', '<u2', '<u4', '<u8', '|i1', '<i2', '<i4', '<i8', '<f2', '<f4', '<f8', or "
        "text as '<U<n>' or '|S<n>' (either byte order: '>f4' is float32 too)",
        MSGPACK,
    ),
    to_invoke("msgpack ext complex", payload(FP32=array_ext(">c8")), "dtype '>c8' has no", MSGPACK),
    *(  # numpy took them, then failed making them str: a 422 blaming the model, or a 500
        # (SystemError: "invalid maximum character passed to PyUnicode_New")
        to_invoke(
            f"msgpack ext text of code point {code:#x}",
            payload(
                BYTES=ext(_msgpack(["<U2", [1, 3], b"a\0\0\0" * 5 + code.to_bytes(4, "little")]))
            ),
            f"tensor `in_BYTES`: {EXT}: text of dtype '<U2': element 2 holds {code:#x}, past "
            "Unicode's last code point (0x10ffff)",
            MSGPACK,
        )
        for code in (0x110000, 0xFFFFFFFF)
    ),
    to_invoke("msgpack ext FP64", payload(FP32=array_ext("f8")), "got [1, 3] FP64", MSGPACK),
    to_invoke("msgpack ext cut", ext(b"\x93\x01"), "not valid msgpack", MSGPACK),
    to_invoke("msgpack ext object", ext(_msgpack(["|O", [1], bytes(8)])), "numpy array", MSGPACK),
    to_invoke(
        "msgpack ext size",
        ext(_msgpack(["<f4", [1, 3], bytes(8)])),
        f"{EXT_WHERE}: <f4 [1, 3] needs 12 bytes, its data has 8",
        MSGPACK,
    ),
    to_invoke(
        "msgpack ext negative dim",
        ext(_msgpack(["<f4", [-1, 3], bytes(12)])),
        f"{EXT_WHERE}: `shape` must be a list of non-negative ints, got [-1, 3]",
        MSGPACK,
    ),
    to_invoke(
        "msgpack ext shape past int64",
        payload(FP32=ext(_msgpack(["<f4", [0, 2**62, 2**62], b""]))),
        "describes more elements than a tensor can hold",
        MSGPACK,
    ),
    to_invoke(
        "msgpack ext garbage",
        ext(b"\xc1"),
        f"{EXT_WHERE}: its data is not valid msgpack: malformed data",
        MSGPACK,
    ),
    to_invoke(
        "msgpack ext of one field",
        ext(_msgpack([1])),
        f"{EXT_WHERE}: expected a list of 3 (dtype, shape, bytes), got a list of 1",
        MSGPACK,
    ),
    *(  # it read "found int 5", "found NoneType None", "found dict {'a': 1}"
        to_invoke(
            f"msgpack ext of {found}",
            payload(FP32=ext(_msgpack(fields))),
            f"tensor `in_FP32`: {EXT}: expected a list of 3 (dtype, shape, bytes), got {found}",
            MSGPACK,
        )
        for fields, found in (
            (5, "5"),
            (None, "null"),
            ({"a": 1}, "an object"),
            (b"\x00\x01", "2 bytes (a msgpack bin)"),
            (msgpack.ExtType(4, b"zz"), "a msgpack ext of type 4"),
        )
    ),
    to_invoke(  # it read "request body: ...": the ext was an item of the input's list
        "msgpack ext in a list",
        payload(FP32=[[1, 2, 3], ext(_msgpack(5))]),
        f"tensor `in_FP32`, item [1]: {EXT}: expected a list of 3",
        MSGPACK,
    ),
    to_invoke(  # it read "found dtype '<f4' and data of type str"
        "msgpack ext of text data",
        ext(_msgpack(["<f4", [1], "abcd"])),
        f"{EXT_WHERE}: data, its third item: expected bytes (a msgpack bin), got a string",
        MSGPACK,
    ),
    to_invoke(  # it read "found dtype b'<f4' and data of type bytes"
        "msgpack ext of a bin dtype",
        payload(FP32=ext(_msgpack([b"<f4", [1, 3], bytes(12)]))),
        f"{EXT}: dtype, its first item: expected a string such as '<f4', got bytes (a msgpack "
        "bin) of the text '<f4'",
        MSGPACK,
    ),
    *(  # it read "got [1, b'\\x03']", "got ExtType(code=3, data=b'x')", "Timestamp(seconds=1, ..."
        to_invoke(
            f"msgpack ext shape of {found}",
            payload(FP32=ext(_msgpack(["<f4", shape, bytes(12)]))),
            f"{EXT}: `shape` must be a list of non-negative ints, got {found}",
            MSGPACK,
        )
        for shape, found in (
            (b"\x01\x03", "2 bytes (a msgpack bin)"),
            ([1, b"\x03"], "[1, <1 byte (a msgpack bin)>]"),
            (msgpack.ExtType(3, b"x"), "a msgpack ext of type 3"),
            ([msgpack.Timestamp(1), 3], "[<a msgpack timestamp>, 3]"),
        )
    ),
]

# a client's strings of 50,000 characters (under the body and header limits), in each place an
# error names one: the error repeated them whole, 50 KB of message for one bad name
LONG = "n" * 50_000
CUT = f"{'n' * 64}… (50000 characters)"  # what an error repeats of LONG
CUT_REPR = f"'{'n' * 64}'… (50000 characters)"
CUT_PATH = f"/{'n' * 63}… (50001 characters)"  # the same after a slash


def in_shared_memory(region: str, datatype: str = "FP32") -> bytes:
    """A request whose in_<datatype> [1, 3] is read from `region`, the others sent as JSON."""
    size = 3 * DATATYPES[datatype].size
    place = {"shared_memory_region": region, "shared_memory_byte_size": size}
    return v2_body(input=datatype, data=None, parameters=place)


LONG_STRINGS: list[Bad] = [
    Bad("input name", v2_body(name=LONG), 400, f"unknown ['{CUT}']"),
    Bad("input name, bad datatype", v2_body(name=LONG, datatype="FP8"), 400, f"tensor `{CUT}`"),
    Bad("datatype", v2_body(datatype=LONG), 400, f"unknown datatype {CUT_REPR}; expected"),
    Bad("shape", v2_body(shape=LONG), 400, f"non-negative ints, got {CUT_REPR}"),
    Bad(
        "shape's item",
        v2_body(shape=[1, LONG]),
        400,
        f'non-negative ints, got [1, "{"n" * 59}… (a list of 2)',
    ),
    Bad("output name", with_request(outputs=[{"name": LONG}]), 400, f"output `{CUT}`: the model"),
    Bad(
        "request parameter name",
        with_request(parameters={LONG: [1]}),
        400,
        f"request `parameters`: `{CUT}`: expected a string",
    ),
    Bad("timeout", with_request(parameters={"timeout": LONG}), 400, f"got {CUT_REPR}"),
    Bad(
        "binary_data_output",
        with_request(parameters={"binary_data_output": LONG}),
        400,
        f"binary_data_output: expected true or false, got {CUT_REPR}",
    ),
    Bad("region name", in_shared_memory(LONG), 400, f"shared memory region `{CUT}` is not"),
    Bad(
        "model in the URL",
        v2_body(),
        400,
        f"Request for unknown model: '{CUT}' is not found",
        path=f"/v2/models/{LONG}/infer",
    ),
    Bad("a path to no route", b"", 404, f"no route POST {CUT_PATH}", path=f"/{LONG}"),
    Bad(
        "version in the URL",
        b"",
        404,
        f"version {CUT} is not found",
        path=f"/v2/models/identity/versions/{LONG}",
        method="GET",
    ),
    Bad(
        "model to load",
        b"",
        400,
        f"cannot load `{CUT}`",
        path=f"/v2/repository/models/{LONG}/load",
    ),
    Bad(
        "region to register",
        orjson.dumps({"key": "/edgeserve-no-such-object", "byte_size": 8}),
        400,
        f"system shared memory region `{CUT}`: cannot open key",
        path=f"{SHM}/{LONG}/register",
    ),
    Bad(
        "region key",
        orjson.dumps({"key": LONG, "byte_size": 8}),
        400,
        f"cannot open key {CUT_REPR}",
        path=f"{SHM}/r/register",
    ),
    Bad(
        "region status",
        b"",
        404,
        f"no system shared memory region named `{CUT}` is registered",
        path=f"{SHM}/{LONG}/status",
        method="GET",
    ),
    Bad(
        "Content-Encoding",
        v2_body(),
        400,
        f"Content-Encoding {CUT_REPR} is not supported",
        headers={"content-encoding": LONG},
    ),
    Bad(
        "Inference-Header-Content-Length",
        v2_body(),
        400,
        f"got {CUT_REPR}",
        headers={"Inference-Header-Content-Length": LONG},
    ),
    Bad(
        "Content-Type of raw bytes",
        b"\x89PNG",
        400,
        f"4 bytes sent as {CUT}, which is not JSON",
        path="/invoke",
        headers={"content-type": LONG},
    ),
    to_invoke(
        "msgpack array's dtype",
        payload(FP32=ext(_msgpack([LONG, [1, 3], bytes(12)]))),
        f"dtype {CUT_REPR} has no KServe v2 datatype",
        MSGPACK,
    ),
    to_invoke("invoke input name", payload() | {LONG: 1}, f"unknown ['{CUT}']"),
    to_invoke(
        "input name of a msgpack array",
        payload() | {LONG: ext(_msgpack(["|b1", [1], b"\x01\x00"]))},
        f"tensor `{CUT}`: {EXT}: |b1 [1] needs 1 bytes, its data has 2",
        MSGPACK,
    ),
]
