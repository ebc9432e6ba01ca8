"""Target profiles: the shipped ones load and validate; search order; errors name file and field."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgeserve.aws_lambda.driver import DRIVER
from edgeserve.aws_lambda.settings import LambdaSettings
from edgeserve.errors import ConfigError
from edgeserve.kinds import KINDS
from edgeserve.profiles import SHIPPED_DIR, load_target
from edgeserve.targets import driver_for
from tests.aws_lambda_support import write_profile

REPO_TARGETS = Path(__file__).parent.parent / "targets"


@pytest.mark.parametrize("name", ["aws-lambda", "local"])
def test_shipped_profiles_are_the_repos_and_load(
    name: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)  # no ./targets here: the packaged copy is found
    profile = load_target(name)
    assert profile.source == SHIPPED_DIR / f"{name}.toml"
    assert profile.source.read_text() == (REPO_TARGETS / f"{name}.toml").read_text()
    assert profile.driver in KINDS


def test_the_shipped_lambda_profile_validates() -> None:
    settings = load_target("aws-lambda").settings_as(LambdaSettings)
    assert (settings.package_type, settings.alias, settings.environment) == (
        "zip",
        "live",
        {"EDGESERVE_BACKEND": "onnxruntime"},
    )
    assert driver_for(load_target("aws-lambda")) is DRIVER


def test_search_order_function_dir_then_cwd_targets(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    function_dir, cwd = tmp_path / "fn", tmp_path / "cwd"
    (cwd / "targets").mkdir(parents=True)
    function_dir.mkdir()
    monkeypatch.chdir(cwd)
    write_profile(cwd / "targets" / "aws-lambda.toml", "memory_mb = 512\n")
    assert load_target("aws-lambda", function_dir).settings_as(LambdaSettings).memory_mb == 512
    write_profile(function_dir / "aws-lambda.toml", "memory_mb = 1024\n")
    assert load_target("aws-lambda", function_dir).settings_as(LambdaSettings).memory_mb == 1024


def test_unknown_settings_key_names_file_and_field(tmp_path: Path) -> None:
    profile = load_target(write_profile(tmp_path / "p.toml", "memroy_mb = 512\n"))
    with pytest.raises(ConfigError, match=r"p.toml \[settings\]: field `memroy_mb`: unknown key"):
        profile.settings_as(LambdaSettings)


def test_out_of_range_setting_says_what_was_expected(tmp_path: Path) -> None:
    profile = load_target(write_profile(tmp_path / "p.toml", "timeout_s = 901\n"))
    with pytest.raises(
        ConfigError,
        match=r"field `timeout_s`: Input should be less than or equal to 900 \(found 901\)",
    ):
        profile.settings_as(LambdaSettings)


def test_unknown_top_level_key_and_driver(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_text('driver = "aws-lambda"\nregion = "us-east-1"\n')
    with pytest.raises(ConfigError, match="field `region`: unknown key"):
        load_target(path)
    path.write_text('driver = "azure"\n')
    with pytest.raises(ConfigError, match="unknown driver 'azure'"):
        load_target(path)


def test_missing_profile_lists_where_it_looked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(
        ConfigError, match=r"no nowhere.toml in .*shipped profiles: \[.*'aws-lambda'"
    ):
        load_target("nowhere", tmp_path)


def test_local_target_has_nothing_to_deploy() -> None:
    with pytest.raises(ConfigError, match="nothing to deploy; Hint: run it with `edgeserve serve`"):
        driver_for(load_target("local"))
