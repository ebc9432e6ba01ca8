"""Target profiles (targets/*.toml): which driver deploys a function, and that driver's settings.

    driver = "aws-lambda"          # a target kind: a name in edgeserve.kinds.KINDS
    description = "..."
    [settings]                     # the driver's own model: unknown keys, wrong types are errors
    region = "us-east-1"

`load_target(name_or_path, function_dir)` looks for `<name>.toml` in the function's folder, then
in ./targets/, then among the profiles shipped inside the package (edgeserve/templates/targets/).
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from edgeserve.errors import ConfigError, did_you_mean
from edgeserve.kinds import kind_named
from edgeserve.validation import describe_validation_error

SHIPPED_DIR = Path(__file__).parent / "templates" / "targets"

Settings = TypeVar("Settings", bound=BaseModel)


class _ProfileFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    driver: str
    description: str = ""
    settings: dict[str, Any] = {}


@dataclass(frozen=True)
class TargetProfile:
    """A loaded profile: its name (the file stem), driver, settings, and the file it came from."""

    name: str
    driver: str
    description: str
    settings: dict[str, Any]
    source: Path

    def settings_as(self, model: type[Settings]) -> Settings:
        """The `[settings]` table validated by a driver's model; errors name this file."""
        try:
            return model.model_validate(self.settings)
        except ValidationError as exc:
            where = f"{self.source} [settings]"
            raise ConfigError(describe_validation_error(exc, where, model)) from None


def load_target(name_or_path: str | Path, function_dir: Path | None = None) -> TargetProfile:
    """Find and validate a target profile by name (`aws-lambda`) or by path (`my/lambda.toml`)."""
    path = find_target(str(name_or_path), function_dir)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
        head = _ProfileFile.model_validate(data)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(exc, str(path), _ProfileFile)) from None
    kind_named(head.driver, f"{path}: field `driver`")
    return TargetProfile(path.stem, head.driver, head.description, head.settings, path)


def is_path(name_or_path: str) -> bool:
    """Whether `--target` names a profile file (`lab.toml`, `x/lab`) rather than a name."""
    given = Path(name_or_path)
    return given.suffix == ".toml" or len(given.parts) > 1


def target_name(name_or_path: str) -> str:
    """The name a target goes by: a profile file's stem, else the name as given."""
    return Path(name_or_path).stem if is_path(name_or_path) else name_or_path


def find_target(name_or_path: str, function_dir: Path | None = None) -> Path:
    """The profile file: a path as given, else the first `<name>.toml` on the search path."""
    given = Path(name_or_path)
    if is_path(name_or_path):
        if given.is_file():
            return given
        raise ConfigError(f"target profile {given}: no such file")
    places = [*([function_dir] if function_dir else []), Path("targets"), SHIPPED_DIR]
    for folder in places:
        candidate = folder / f"{name_or_path}.toml"
        if candidate.is_file():
            return candidate
    shipped = sorted(path.stem for path in SHIPPED_DIR.glob("*.toml"))
    known = sorted({path.stem for folder in places for path in folder.glob("*.toml")})
    raise ConfigError(
        f"target {name_or_path!r}: no {name_or_path}.toml in {', '.join(map(str, places))}"
        f"{did_you_mean(name_or_path, known)} (shipped profiles: {shipped})"
    )
