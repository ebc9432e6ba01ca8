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
