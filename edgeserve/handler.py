"""The function's own handler module (`[handler] module`): imported from a file, held to its
contract, and blamed in the user's words when it breaks.

    preprocess(payload, ctx) -> list[dict[str, np.ndarray]]   one dict per item: every model
                                                               input, of its datatype, without
                                                               the batch axis when batching
    postprocess(items, ctx) -> anything JSON or msgpack can carry

A mistake in the handler is the function author's, not the client's: a broken import fails the
build (and `serve`) naming the user's file and line; a contract violation at serve time answers
500 with what was returned and what was expected (and logs the file); `InvalidInput` raised by
the handler about its payload answers 400, and so does an item whose dim sizes do not fit the
model (the sizes may be the client's: see `check_items`).
"""

from __future__ import annotations

import traceback
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from edgeserve.datatypes import DATATYPES, from_numpy
from edgeserve.errors import ConfigError, HandlerError
from edgeserve.imports import digest, import_module, is_own, missing_hint, plain
from edgeserve.types import Signature, TensorDict, TensorSpec

ITEMS_TYPE = "list[dict[str, np.ndarray]]"


def import_handler(path: Path, shown_as: Path | None = None) -> ModuleType:
    """Import the handler at `path`; errors and tracebacks name `shown_as` (the user's source
    file when `path` is its copy in a cached bundle) and the line.

    A handler is run once per process while its text is unchanged (build imports it for the
    dry run and for each image sample of the precision check; serving a source folder runs
    those checks on the source's file, then serves its copy in the bundle cache, shown as that
    same file): a handler may do at import what can be done only once, such as registering a
    Prometheus metric."""
    shown = shown_as or path
    try:
        key = (str(shown.resolve()), digest(path))
    except OSError:  # no such file: the import says so, in the user's words
        return _import(path, shown)
    if (module := _IMPORTED.get(key)) is None:
        module = _IMPORTED[key] = _import(path, shown)
    return module


_IMPORTED: dict[tuple[str, bytes], ModuleType] = {}


def _import(path: Path, shown: Path) -> ModuleType:
    try:
        return import_module(path, shown)
    except SyntaxError as exc:
        file = exc.filename if is_own(exc.filename or "") else shown  # maybe one of its modules
        code = f": {exc.text.strip()}" if exc.text else ""
        raise ConfigError(
            f"{file}:{exc.lineno}: syntax error in the handler: {exc.msg}{code}"
        ) from None
    except (Exception, SystemExit) as exc:  # sys.exit() at import ended the CLI silently
        raise ConfigError(
            f"{where(exc, shown)}: the handler failed to import: {plain(exc)}"
            + _import_hint(exc, shown)
        ) from exc


def unmet_requirements(requirements: Sequence[str]) -> list[tuple[str, str | None]]:
    """The `[handler] requirements` this Python does not meet, each with the version installed
    (None: not installed). A requirement whose marker rules this machine out is met. The bundle
    pins them for its targets, but serving here imports the handler with what is here."""
    from packaging.requirements import Requirement  # the manifest checked that each parses

    unmet: list[tuple[str, str | None]] = []
    for text in requirements:
        wanted = Requirement(text)
        if wanted.marker is not None and not wanted.marker.evaluate():
            continue
        try:
            installed = metadata.version(wanted.name)
        except metadata.PackageNotFoundError:
            unmet.append((text, None))
            continue
        if not wanted.specifier.contains(installed, prereleases=True):
            unmet.append((text, installed))
    return unmet


def where(exc: BaseException, shown: Path) -> str:
    """`file:line` of the deepest frame of `exc` inside the handler or one of its own modules,
    else the handler's file alone."""
    frames = traceback.extract_tb(exc.__traceback__)
    own = [frame for frame in frames if frame.filename == str(shown) or is_own(frame.filename)]
    return f"{own[-1].filename}:{own[-1].lineno}" if own else str(shown)


def _import_hint(exc: BaseException, shown: Path) -> str:
    return missing_hint(exc, shown) if isinstance(exc, ModuleNotFoundError) else ""


def check_items(items: Any, signature: Signature, *, sizes: bool = True) -> list[TensorDict]:
    """preprocess's result, checked against the contract; HandlerError says what is wrong.

    What the handler's code alone decides is always checked: a list of dicts of the model's
    inputs, ndarrays of each input's datatype and rank. Dim sizes (`sizes`) may come from the
    request (a handler passing a client's array along): at serve time they are left to the
    check at the door, which answers the client 400 naming the tensor; build checks them on
    the function's own samples.
    """
    if not isinstance(items, list | tuple):
        raise HandlerError(f"handler.preprocess returned {_kind(items)}; expected {ITEMS_TYPE}")
    expected = {spec.name: _item_dims(spec, signature) for spec in signature.inputs}
    for position, item in enumerate(items):
        _check_item(position, item, expected, signature, sizes)
    return list(items)


def item_place(index: int, signature: Signature) -> str:
    """Where an error about one of preprocess's items happened, as serve and build say it."""
    batch = ", run as a batch of one row" if signature.batched else ""
    return f"handler.preprocess's item {index}{batch}"


def one_row(item: TensorDict, signature: Signature) -> TensorDict:
    """An item as a batch of one row: a batch axis added to each of its tensors (but to an
    optional input sent whole: `Signature.whole`)."""
    whole = signature.whole
    return {n: v if n in whole else np.asarray(v)[np.newaxis] for n, v in item.items()}


def _item_dims(spec: TensorSpec, signature: Signature) -> tuple[int, ...]:
    """An item's dims: without the batch axis where the model batches (an optional input
    without one, sent whole, keeps its own dims)."""
    return spec.dims[1:] if signature.batched and spec.name not in signature.whole else spec.dims


def _check_item(
    position: int,
    item: Any,
    dims: dict[str, tuple[int, ...]],
    signature: Signature,
    sizes: bool,
) -> None:
    where_ = f"handler.preprocess item {position}"
    if not isinstance(item, dict):
        raise HandlerError(f"{where_} is {_kind(item)}; expected {ITEMS_TYPE}")
    required = {spec.name for spec in signature.required}
    if not required <= set(item) <= set(dims):
        optional = sorted(set(dims) - required)
        also = f" (and any of the optional {optional})" if optional else ""
        raise HandlerError(
            f"{where_} has keys {sorted(map(str, item))}; expected the model's inputs "
            f"{sorted(required)}{also}"
        )
    for spec in signature.inputs:
        if spec.name not in item:  # an optional input: the model's default
            continue
        value = item[spec.name]
        if not isinstance(value, np.ndarray):
            raise HandlerError(f"{where_}, `{spec.name}` is {_kind(value)}; expected np.ndarray")
        want = dims[spec.name]
        fits = not spec.ranked or (
            value.ndim == len(want)
            and (not sizes or all(w in (-1, g) for w, g in zip(want, value.shape, strict=False)))
        )
        if value.dtype != DATATYPES[spec.datatype].numpy or not fits:
            raise HandlerError(
                f"{where_}, `{spec.name}`: got {_datatype(value)} {list(value.shape)}; "
                f"expected {spec.datatype} {list(want)}" + (" (-1: any size)" if -1 in want else "")
            )


def _kind(value: Any) -> str:
    """What a value is, for messages: `dict`, `str 'abc'`, `ndarray float64 [3]`."""
    if isinstance(value, np.ndarray):
        return f"ndarray {_datatype(value)} {list(value.shape)}"
    return type(value).__name__


def _datatype(array: np.ndarray) -> str:
    try:
        return from_numpy(array.dtype).name
    except ValueError:
        return str(array.dtype)
