"""The manifest's overrides of a tensor (`[model.inputs.<name>]`, `[model.outputs.<name>]`)
checked against the model's own dims: each error names function.toml, the field, what was found
and what was expected."""

from __future__ import annotations

from pathlib import Path

from edgeserve.errors import ConfigError


def check_pad_axis(field: str, axis: int, dims: tuple[int, ...], where: Path) -> None:
    """A pad_axis names a dynamic axis past the batch: a fixed one has nothing to pad."""
    found = f"{where}: field `{field}`: found {axis}"
    if not 0 < axis < len(dims):
        axes = f"an axis in 1..{len(dims) - 1}" if len(dims) > 1 else "no axis (nothing to pad)"
        raise ConfigError(
            f"{found}, expected {axes} of the dims {list(dims)} (axis 0 is the batch)"
        )
    if dims[axis] != -1:
        dynamic = [k for k, dim in enumerate(dims) if k and dim == -1]
        raise ConfigError(
            f"{found}, but that axis is fixed at {dims[axis]} in the model (dims {list(dims)}), "
            "so no request is shorter: nothing to pad; expected a dynamic axis "
            + (f"(-1): one of {dynamic}" if dynamic else "(-1), and there is none: remove it")
        )


def class_labels(field: str, name: str | None, where: Path) -> tuple[str, ...]:
    """An output's class labels, one a line of a UTF-8 file beside function.toml (Triton's
    `label_filename`): the classification extension answers `value:index:label`, or
    `value:index` where the line is empty."""
    if name is None:
        return ()
    path = where.parent / name
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise ConfigError(
            f"{where}: field `{field}`: cannot read {path}: {reason}; expected a text file, "
            "one class label a line"
        ) from None
    return tuple(line.removesuffix("\r") for line in text.split("\n"))  # as Triton: \n only


def size_bounds(
    field: str, dims: tuple[int, ...], bound: tuple[int, ...] | None, where: Path, least: int
) -> tuple[int, ...] | None:
    """A size per axis for the dynamic dims (-1: none), the fixed ones left as they are."""
    if bound is None:
        return None
    fits = len(bound) == len(dims) and all(
        b == -1 or (b >= least and d in (-1, b)) for d, b in zip(dims, bound, strict=False)
    )
    if not fits:
        raise ConfigError(
            f"{where}: field `{field}`: found {list(bound)}, expected one size >= {least} per "
            f"axis of the dims {list(dims)}, or -1 for none (a fixed dim keeps its size)"
        )
    return bound


def merge_dims(
    field: str,
    model: tuple[int, ...],
    wanted: tuple[int, ...],
    where: Path,
    any_rank: bool = False,
) -> tuple[int, ...]:
    """An override may fix a dynamic dim, never contradict a fixed one; `any_rank`: the model
    declares no shape, so the override gives the rank too."""
    conflict = (not any_rank and len(model) != len(wanted)) or any(
        (m != -1 and w != m) or w < -1 for m, w in zip(model, wanted, strict=False)
    )
    if conflict or min(wanted, default=0) < -1:
        fit = "dims of any rank" if any_rank else f"dims that fit the model's {list(model)}"
        raise ConfigError(
            f"{where}: field `{field}.dims`: found {list(wanted)}, expected {fit} (a fixed dim "
            "can't change; -1 marks a dynamic one)"
        )
    return wanted
