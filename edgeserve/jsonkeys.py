"""Keys given twice in one object of a JSON document, which JSON leaves to its reader: orjson
and Python's json keep the last, Triton's RapidJSON the first, so two servers (or a proxy and a
server) would read two different requests in one body. edgeserve refuses them.

The check costs a count over the bytes on the common path (`check_keys`); only a document whose
strings hold colons, or whose objects its decoder did not count, is read a second time.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from edgeserve.errors import InvalidInput, echo

_BOM = b"\xef\xbb\xbf"


def check_keys(text: bytes, seen: int, where: str, document: Any = None) -> None:
    """Refuse a JSON document, read already, that gives a key twice in one object: each reader
    keeps its own (orjson and Python's json the last, Triton's RapidJSON the first), so two
    servers, or a proxy and a server, would read two different requests in it.

    `seen`: the keys of the objects its decoder counted (some or all). A key is followed by a
    colon, and any other colon lies in a string, so a document with no more colons than `seen`
    repeats no key: a count over its bytes, 0.1 us on a small request. Otherwise (colons in
    strings, objects the decoder did not count, or a repeated key) Python's json reads it again
    to tell, which costs a few times orjson's reading. With the `document` read, colons in its
    strings are counted first (`colons`), so text that holds colons (a BYTES tensor of
    prompts) is not read again."""
    count = text.count(b":")
    if count <= seen or (document is not None and count + _escaped(text) <= _counted(document)):
        return
    found = _repeated(text[3:] if text[:3] == _BOM else text, where)
    if found is not None:
        raise InvalidInput(
            f"{where}: key `{echo(found.key)}` is given {found.times} times in {found.path}; "
            "expected each key once in an object (readers differ on which one counts: "
            "Triton's the first, Python's the last)"
        )


def count_keys(value: Any) -> int:
    """The keys of `value`'s objects, nested in objects and in lists of objects, for
    `check_keys`; other lists (tensor data) are not walked: objects there, if any, are counted
    by `check_keys`'s second reading."""
    if type(value) is not dict:
        return 0
    count = len(value)
    for item in value.values():
        if type(item) is dict:
            count += count_keys(item)
        elif type(item) is list and item and type(item[0]) is dict:
            count += sum(map(count_keys, item))
    return count


def _escaped(text: bytes) -> int:
    """Colons a string writes as an escape (`\\u003a`): `colons` counts them, the text not."""
    return text.count(b"\\u003a") + text.count(b"\\u003A")


def _counted(document: Any) -> int:
    """`colons(document)`, or -1 for a document nested deeper than Python recurses (orjson
    reads 1024 levels): it is read again, which refuses it as too deep to check."""
    try:
        return colons(document)
    except RecursionError:
        return -1


def colons(value: Any) -> int:
    """The colons a document's text holds if no object repeats a key: one per key, and those
    in keys and strings. A list whose first item is a number is taken for numbers (tensor
    data; not walked): a string later in it is left out, so such a document is read again
    (`check_keys`), never passed wrongly."""
    kind = type(value)
    if kind is str:
        return value.count(":")
    if kind is dict:
        return sum(1 + key.count(":") + colons(item) for key, item in value.items())
    if kind is list and value and type(value[0]) in (str, dict, list):
        return sum(map(colons, value))
    return 0


class _Repeated(dict[str, Any]):
    """An object in which `key` was given `times` times (Python's json kept the last)."""

    key = ""
    times = 0
    path = "the top-level object"


def _repeated(text: bytes, where: str) -> _Repeated | None:
    """The first object of `text` (a document orjson read) to repeat a key, with its place."""
    repeats = 0

    def objects(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        nonlocal repeats
        found = dict(pairs)
        if len(found) == len(pairs):
            return found
        repeats += 1
        marked = _Repeated(found)
        counts = Counter(key for key, _ in pairs)  # not pairs.count per key: 100k keys
        marked.key, marked.times = next((k, n) for k, n in counts.items() if n > 1)
        return marked

    try:
        document = json.loads(text.decode("utf-8"), object_pairs_hook=objects)
    except RecursionError:  # orjson reads 1024 levels, Python's json about 990
        raise InvalidInput(
            f"{where}: nested too deep to check that no object gives a key twice"
        ) from None
    except ValueError:  # what orjson read and Python's json does not: no answer to give
        return None
    return _located(document) if repeats else None


def _located(document: Any) -> _Repeated | None:
    """The first `_Repeated` in `document` (depth first, in document order), its path set."""
    pending: list[tuple[Any, str]] = [(document, "")]
    while pending:
        value, path = pending.pop()
        if isinstance(value, _Repeated):
            value.path = f"`{path}`" if path else value.path
            return value
        if isinstance(value, dict):
            named = (
                (item, f"{path}.{echo(key)}" if path else echo(key)) for key, item in value.items()
            )
        else:
            named = ((item, f"{path}[{at}]") for at, item in enumerate(value))
        pending.extend(
            reversed([(item, at) for item, at in named if isinstance(item, dict | list)])
        )
    return None
