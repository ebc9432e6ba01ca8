"""The `/invoke` codec as pure functions: bodies in, results out, table-driven."""

from __future__ import annotations

import math
from typing import Any

import msgpack
import numpy as np
import pytest

from edgeserve.http.invoke import encode_result

NAN, INF = math.nan, math.inf
NON_FINITE_RESULTS: list[tuple[str, Any, bytes]] = [
    ("python floats", {"y": [[NAN, INF, -INF, 0.5]]}, b'{"y":[[NaN,Infinity,-Infinity,0.5]]}'),
    (
        "a float32 array, each value in its own shortest form",
        {"y": np.array([[NAN, 0.1, -INF]], np.float32)},
        b'{"y":[[NaN,0.1,-Infinity]]}',
    ),
    ("a float16 array", {"y": np.array([0.5, NAN], np.float16)}, b'{"y":[0.5,NaN]}'),
    (
        "a float array cut on an axis (not contiguous)",
        {"y": np.array([[1.0, 7.0, -INF], [NAN, 7.0, 2.0]])[:, ::2]},
        b'{"y":[[1.0,-Infinity],[NaN,2.0]]}',
    ),
    (
        "numpy scalars beside a null and a string that reads null",
        {"a": None, "b": "null", "c": [np.float32(NAN), np.float64(-INF)]},
        b'{"a":null,"b":"null","c":[NaN,-Infinity]}',
    ),
    ("a rank-0 array", {"z": np.array(INF, np.float32)}, b'{"z":Infinity}'),
    ("an object array", {"o": np.array([NAN, "x"], dtype=object)}, b'{"o":[NaN,"x"]}'),
    ("a tuple", {"t": (1.0, NAN)}, b'{"t":[1.0,NaN]}'),
]


@pytest.mark.parametrize(
    ("result", "expected"),
    [case[1:] for case in NON_FINITE_RESULTS],
    ids=[case[0] for case in NON_FINITE_RESULTS],
)
def test_json_writes_floats_that_are_not_finite_as_tokens_not_null(
    result: Any, expected: bytes
) -> None:
    """orjson writes NaN and the infinities as null, which reads back as None (or as NaN for
    an infinity); Triton and Python's json write them as NaN, Infinity and -Infinity, and
    read them back."""
    assert encode_result(result, None) == (expected, "application/json")


def test_json_of_a_finite_answer_is_orjson_s_own() -> None:
    result = {"y": np.array([[0.1, 2.5]], np.float32), "n": None, "s": "null"}
    assert encode_result(result, None)[0] == b'{"y":[[0.1,2.5]],"n":null,"s":"null"}'


def test_a_rank_0_array_is_a_number_in_json_as_in_msgpack() -> None:
    """It was `[2.25]` in JSON (ascontiguousarray makes a rank-0 array 1-d) and 2.25 in msgpack."""
    assert encode_result({"y": np.array(2.25, np.float32)}, None)[0] == b'{"y":2.25}'
    assert encode_result({"y": np.array(3, np.int64)}, None)[0] == b'{"y":3}'
    packed, _ = encode_result({"y": np.array(2.25, np.float32)}, "application/msgpack")
    assert msgpack.unpackb(packed) == {"y": 2.25}
