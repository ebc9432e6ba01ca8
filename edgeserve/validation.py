"""pydantic's ValidationError as edgeserve says it, for the manifest and target profiles alike:
one line per field with the file, what was expected (a type in TOML's words, the names of a set
with the closest to what was found) and what was found."""

from __future__ import annotations

import re
from typing import Any, get_args, get_origin

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator
from pydantic_core import ErrorDetails

from edgeserve.errors import did_you_mean


class StrictTable(BaseModel):
    """A TOML table as edgeserve reads one (function.toml, a target profile's [settings]):
    unknown keys and values of the wrong type are errors, and so are inf and nan. Not strict,
    `max_batch_size = "32"` was read as 32 and `memory_mb = "4096"` as 4096, so a typo of a
    type passed unseen (a quoted number is often one of a key meant otherwise); an integer where
    a number is asked (`max_queue_delay_ms = 2`) still is one. `max_queue_delay_ms = inf` built,
    then every request waited for company until its deadline."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, strict=True)

    @model_validator(mode="before")
    @classmethod
    def _arrays_are_tuples(cls, data: Any) -> Any:
        """TOML (and a bundle's JSON) has arrays where the schema, frozen, has tuples, which
        strict mode takes only as tuples: each array of this table's keys becomes one."""
        return arrays_as_tuples(data)


def arrays_as_tuples(table: Any) -> Any:
    """A table (a dict) with each array among its values as a tuple; anything else as it is."""
    if not isinstance(table, dict):
        return table
    return {key: tuple(v) if isinstance(v, list) else v for key, v in table.items()}


def describe_validation_error(exc: ValidationError, source: str, schema: type[BaseModel]) -> str:
    """One line per problem: file, dotted field, what was expected, what was found; `schema`:
    the model validated, whose keys "did you mean" offers."""
    models = _model_names(schema)
    lines: dict[tuple[str, str], list[str]] = {}  # (field, found) -> what each type wanted
    kinds: dict[tuple[str, str], str] = {}  # a type error's found: with its type, in TOML's words
    for error in exc.errors():
        loc = tuple(part for part in error["loc"] if not _is_type_tag(part, models))
        where = ".".join(str(part) for part in loc) or "(top level)"
        found = error.get("input")
        if error["type"] == "extra_forbidden":
            known = _known_keys(error["loc"], schema)
            hint = did_you_mean(str(error["loc"][-1]), known) or f"; expected one of {known}"
            lines[(f"{where}`: unknown key (found {found!r}){hint}", "")] = []
        elif error["type"] == "missing":
            lines[(f"{where}`: required but missing", "")] = []
        else:
            lines.setdefault((where, repr(found)), []).extend(_wanted(error))
            if error["type"] in _TYPES and type(found) in _TOML_TYPES:
                kinds[(where, repr(found))] = f"{found!r}, {_TOML_TYPES[type(found)]}"
    return "\n".join(
        f"{source}: field `{field}`: {_either(wanted)} (found {kinds.get((field, found), found)})"
        if wanted
        else f"{source}: field `{field}"
        for (field, found), wanted in lines.items()
        if not (wanted and _inside(field, lines))  # a table's own keys say what is wrong
    )


def _inside(field: str, lines: dict[tuple[str, str], list[str]]) -> bool:
    """Whether another line is about a key inside `field`: a union's table (`{ gpu = 0 }` for
    processes_per_device) was also reported as not being the union's integer or 'auto'."""
    return any(other.startswith(f"{field}.") for other, _ in lines)


def _either(wanted: list[str]) -> str:
    """What each type of a union expected, as one ("expected an integer or 'auto'"), then
    the hints."""
    words = " or ".join(text for text in wanted if text and not text.startswith(";"))
    return words.replace(" or expected ", " or ") + "".join(t for t in wanted if t.startswith(";"))


_TYPES = {  # pydantic's type errors, in TOML's words
    "int_type": "an integer",
    "float_type": "a number",
    "bool_type": "true or false",
    "string_type": "a string",
    "tuple_type": "an array",
    "dict_type": "a table",
    "model_type": "a table",
}
_TOML_TYPES = {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}
_TOML_TYPES |= {tuple: "an array", list: "an array", dict: "a table"}
_QUOTED = {"int_type": int, "float_type": float, "bool_type": {"true", "false"}.__contains__}


def _wanted(error: ErrorDetails) -> list[str]:
    """What the field expected, and a hint starting with ";": a type in TOML's words (quotes
    around a value of that type), one of a set of names (the closest to what was found), else
    pydantic's own words."""
    message = str(error["msg"]).removeprefix("Value error, ")
    found = error.get("input")
    if error["type"] == "literal_error":
        names = re.findall(r"'([^']*)'", str(error.get("ctx", {}).get("expected", "")))
        close = did_you_mean(found, names) if isinstance(found, str) else ""
        return [f"expected {' or '.join(map(repr, names))}", close]
    if (wanted := _TYPES.get(error["type"])) is None:
        return [message]
    quoted = isinstance(found, str) and _parses(found, _QUOTED.get(error["type"]))
    return [f"expected {wanted}", f"; write it without quotes: {found}" if quoted else ""]


def _parses(text: str, reader: Any) -> bool:
    try:
        return reader is not None and reader(text) is not False
    except ValueError:
        return False


_TYPE_TAG = re.compile(r"\w*\[.*|(constrained|function)-.+|int|str|float|bool")


def _is_type_tag(part: int | str, models: set[str]) -> bool:
    """A location part naming one type of a union ("literal['auto']", "constrained-int"), not
    a field: what each type wanted becomes one "or" of the field's one line."""
    return isinstance(part, str) and (_TYPE_TAG.fullmatch(part) is not None or part in models)


def _model_names(annotation: Any) -> set[str]:
    """The names of the models `annotation` holds, at any depth: pydantic tags a union's
    model (`processes_per_device`'s PerDeviceKind) by its name."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        inner = (_model_names(field.annotation) for field in annotation.model_fields.values())
        return {annotation.__name__}.union(*inner)
    return set().union(*(_model_names(arg) for arg in get_args(annotation)))


def _union_model(annotation: Any, name: str) -> type[BaseModel] | None:
    """The model of a union named `name` (pydantic's tag for it in an error's location)."""
    for arg in get_args(annotation):
        if isinstance(arg, type) and issubclass(arg, BaseModel) and arg.__name__ == name:
            return arg
    return None


def _known_keys(loc: tuple[int | str, ...], root: type[BaseModel]) -> list[str]:
    """The keys the schema allows beside the last part of `loc` (for "did you mean")."""
    schema: Any = root
    parts = list(loc[:-1])
    while parts and isinstance(schema, type) and issubclass(schema, BaseModel):
        field = schema.model_fields.get(str(parts.pop(0)))
        if field is None:
            return []
        schema = field.annotation
        if parts and (tagged := _union_model(schema, str(parts[0]))) is not None:
            schema, parts = tagged, parts[1:]  # the union's table pydantic tagged by its name
        if get_origin(schema) is dict:  # [model.inputs.<name>]: skip the tensor's name
            schema = get_args(schema)[1]
            parts = parts[1:]
    if isinstance(schema, type) and issubclass(schema, BaseModel):
        return list(schema.model_fields)
    return []
