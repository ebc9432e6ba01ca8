"""function.toml (the function's version and the integer model version the v2 API reports,
strict types) and target profiles' [settings], as strict."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgeserve.cli import main
from edgeserve.errors import ConfigError
from edgeserve.manifest import parse_manifest
from edgeserve.profiles import load_target
from edgeserve.targets.jetson_settings import JetsonSettings
from tests.models import mlp_model, write_function


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
        "f.toml: field `resources.workers`: expected an integer or 'auto' (found 'many', a string)"
    )


@pytest.mark.parametrize(
    ("name", "hint"),
    [("Two Model", 'Hint: name = "two-model"'), ("ocr.v2", 'Hint: name = "ocr-v2"'), ("…", "")],
)
def test_a_function_name_that_does_not_fit_is_told_the_nearest_that_does(
    name: str, hint: str
) -> None:
    """It read pydantic's "String should match pattern '^[a-z0-9][a-z0-9_-]{0,62}$'"."""
    with pytest.raises(ConfigError) as error:
        parse_manifest({"function": {"name": name}}, "f.toml")
    assert error.value.message.startswith(
        "f.toml: field `function.name`: expected lowercase letters, digits, '-' or '_', starting "
        f"with a letter or digit, at most 63 characters{'. ' + hint if hint else ''} (found"
    )


def test_an_open_path_is_a_path_as_requested() -> None:
    with pytest.raises(ConfigError) as error:
        parse_manifest({"function": {"name": "f"}, "auth": {"open_paths": ["metrics"]}}, "f.toml")
    assert "f.toml: field `auth.open_paths.0`: String should match pattern '^/'" in (
        error.value.message
    )


@pytest.mark.parametrize(
    ("section", "line", "said"),
    [
        (
            "batching",
            'max_batch_size = "32"',
            "field `batching.max_batch_size`: expected an integer; write it without quotes: 32 "
            "(found '32', a string)",
        ),
        (
            "backend",
            'cuda_graphs = "true"',
            "field `backend.cuda_graphs`: expected true or false; write it without quotes: true "
            "(found 'true', a string)",
        ),
        (
            "resources",
            'workers = "4"',
            "field `resources.workers`: expected an integer or 'auto'; write it without quotes: "
            "4 (found '4', a string)",
        ),
        (
            "resources",
            "processes_per_device = { gpu = 2.5 }",
            "field `resources.processes_per_device.gpu`: expected an integer or 'auto' (found "
            "2.5, a number)",
        ),
        (
            "backend",
            'prefer = ["openvno"]',
            "field `backend.prefer.0`: expected 'tensorrt' or 'openvino' or 'onnxruntime'; did "
            "you mean `openvino`? (found 'openvno')",
        ),
        (
            "backend",
            'precision = "fp61"',
            "field `backend.precision`: expected 'fp32' or 'fp16' or 'int8' or 'auto'; did you "
            "mean `fp16`? (found 'fp61')",
        ),
        (
            "resources",
            'devices = "gpu"',
            "field `resources.devices`: expected 'auto' or 'cpu' or an array; did you mean "
            "`cpu`? (found 'gpu', a string)",
        ),
    ],
)
def test_a_typo_of_a_type_or_a_name_is_an_error_naming_file_key_and_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], section: str, line: str, said: str
) -> None:
    """`max_batch_size = "32"` was read as 32 (pydantic's lax mode), `prefer = ["openvno"]`
    listed the names without the one meant."""
    folder = write_function(
        tmp_path / "f", mlp_model, f'[function]\nname = "f"\n[{section}]\n{line}'
    )
    assert main(["build", str(folder), "--out", str(tmp_path / "out")]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"{folder / 'function.toml'}: {said}" in err


def test_the_forms_the_reference_allows_still_load() -> None:
    """Strict types, yet arrays stay arrays, an integer is a number, "auto" or a count."""
    manifest = parse_manifest(
        {
            "function": {"name": "f"},
            "batching": {"max_queue_delay_ms": 2, "preferred_batch_sizes": [4, 8]},
            "backend": {"prefer": ["openvino", "onnxruntime"]},
            "model": {"inputs": {"x": {"dims": [-1, 16], "pad_value": 0}}},
            "resources": {"workers": 2, "devices": [0, 1], "processes_per_device": {"gpu": 2}},
        },
        "function.toml",
    )
    assert manifest.batching.max_queue_delay_ms == 2.0
    assert manifest.backend.prefer == ("openvino", "onnxruntime")
    assert manifest.model.inputs["x"].dims == (-1, 16)
    assert manifest.resources.devices == (0, 1)


@pytest.mark.parametrize(
    ("driver", "settings", "said"),
    [
        (
            "aws-lambda",
            'memory_mb = "4096"',
            "field `memory_mb`: expected an integer; write it without quotes: 4096",
        ),
        ("knative", "max_scale = 3.0", "field `max_scale`: expected an integer (found 3.0"),
        ("kserve", 'gpu = "1"', "field `gpu`: expected an integer; write it without quotes: 1"),
        (
            "jetson",
            'hosts = ["a"]\nssh_port = "22"',
            "field `ssh_port`: expected an integer; write it without quotes: 22",
        ),
        ("jetson", 'hosts = ["a"]\ngroups = { g = "a" }', "field `groups.g`: expected an array"),
    ],
)
def test_a_target_profiles_settings_are_as_strict_as_the_manifest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], driver: str, settings: str, said: str
) -> None:
    """`memory_mb = "4096"` in a profile was read as 4096 (the manifest refused the same typo);
    deploy stops there, before anything is built or reached."""
    folder = write_function(tmp_path / "f", mlp_model, '[function]\nname = "f"\n')
    (folder / "mine.toml").write_text(f'driver = "{driver}"\n[settings]\n{settings}\n')
    assert main(["deploy", str(folder), "--target", "mine"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"{folder / 'mine.toml'} [settings]: {said}" in err


def test_a_target_profiles_arrays_paths_and_tables_still_load(tmp_path: Path) -> None:
    """Strict types, yet a profile's arrays (a group's hosts too), a path given as text and a
    table per host load as before."""
    (tmp_path / "lab.toml").write_text(
        'driver = "jetson"\n[settings]\nhosts = ["a", "b"]\ngroups = { pair = ["a", "b"] }\n'
        'ssh_config = "~/.ssh/lab"\nhealth_timeout_s = 60\n[settings.overrides.b]\nport = 9000\n'
    )
    settings = load_target(tmp_path / "lab.toml").settings_as(JetsonSettings)
    assert settings.select(("pair",)) == ("a", "b")
    assert settings.ssh_config == Path("~/.ssh/lab")
    assert settings.health_timeout_s == 60.0
    assert settings.overrides["b"].port == 9000
