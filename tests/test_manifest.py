"""function.toml: the function's version and the integer model version the v2 API reports."""

from __future__ import annotations

import pytest

from edgeserve.errors import ConfigError
from edgeserve.manifest import parse_manifest


@pytest.mark.parametrize(
    ("version", "model_version"),
    [("1", "1"), ("12", "12"), ("1.0.0", "1"), ("2.3", "2"), ("v3.1.4-rc1", "3"), ("0.9.1", "0")],
)
def test_a_version_maps_to_an_integer_model_version(version: str, model_version: str) -> None:
    manifest = parse_manifest({"function": {"name": "f", "version": version}}, "function.toml")
    assert manifest.function.model_version == model_version


@pytest.mark.parametrize("version", ["beta", "", "1.2.3.4", "1..2"])
def test_a_version_without_a_model_version_is_refused(version: str) -> None:
    with pytest.raises(ConfigError) as error:
        parse_manifest({"function": {"name": "f", "version": version}}, "function.toml")
    assert "function.toml: field `function.version`" in error.value.message
    assert 'semantic version ("1.2.0"' in error.value.message


@pytest.mark.parametrize(
    "requirement",
    ["$$$ not a req", "numpy>>>1", "-r /etc/passwd", "numpy\n--index-url http://elsewhere"],
)
def test_a_handler_requirement_is_one_pep_508_requirement(requirement: str) -> None:
    """Each went into the requirements files as written: an option, a second line."""
    with pytest.raises(ConfigError) as error:
        parse_manifest(
            {"function": {"name": "f"}, "handler": {"requirements": ["pillow>=10", requirement]}},
            "function.toml",
        )
    assert error.value.message.startswith(
        f"function.toml: field `handler.requirements`: {requirement!r} is not a requirement "
        "like 'pillow>=10' (PEP 508): "
    )
    assert "\n" not in error.value.message  # one line, no caret drawing


def test_a_field_of_several_types_gets_one_line_naming_them() -> None:
    with pytest.raises(ConfigError) as error:
        parse_manifest({"function": {"name": "f"}, "resources": {"workers": "many"}}, "f.toml")
    assert error.value.message == (
        "f.toml: field `resources.workers`: Input should be a valid integer, unable to parse "
        "string as an integer or Input should be 'auto' (found 'many')"
    )


def test_an_open_path_is_a_path_as_requested() -> None:
    with pytest.raises(ConfigError) as error:
        parse_manifest({"function": {"name": "f"}, "auth": {"open_paths": ["metrics"]}}, "f.toml")
    assert "f.toml: field `auth.open_paths.0`: String should match pattern '^/'" in (
        error.value.message
    )
