"""hardware.probe() on fixture trees made from real device files, and on this machine."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from edgeserve.backends import Choice
from edgeserve.backends import probe as probe_for_backends
from edgeserve.hardware import (
    Cpu,
    Jetson,
    Platform,
    describe,
    jetpack_for,
    parse_l4t,
    probe,
    probe_cpu,
    probe_gpus,
)

FIXTURES = Path(__file__).parent / "fixtures"
ORIN_CPU = Cpu("ARM Cortex-A78AE", 12, frozenset({"asimd"}))


@pytest.mark.parametrize(
    ("tree", "jetson"),
    [
        (
            "agx-orin-jp62",
            Jetson("NVIDIA Jetson AGX Orin Developer Kit", "tegra234", (8, 7), "36.4.3", "6.2"),
        ),
        (
            "orin-nano-super-container",  # a container without /etc/nv_tegra_release
            Jetson(
                "NVIDIA Jetson Orin Nano Engineering Reference Developer Kit Super",
                "tegra234",
                (8, 7),
                None,
                None,
            ),
        ),
        (
            "xavier-nx-jp5",
            Jetson("NVIDIA Jetson Xavier NX Developer Kit", "tegra194", (7, 2), "35.4.1", "5.1.2"),
        ),
    ],
)
def test_jetson_is_detected_from_files_without_nvml(tree: str, jetson: Jetson) -> None:
    platform = probe(FIXTURES / "jetson" / tree)
    assert platform.kind == "jetson"
    assert platform.jetson == jetson
    assert platform.gpus == ()  # NVML is never asked on a Jetson
    assert platform.has_cuda


def test_the_sysfs_device_tree_is_read_when_proc_has_none(tmp_path: Path) -> None:
    base = tmp_path / "sys/firmware/devicetree/base"
    base.mkdir(parents=True)
    for name in ("model", "compatible"):
        source = FIXTURES / "jetson/xavier-nx-jp5/proc/device-tree" / name
        (base / name).write_bytes(source.read_bytes())
    platform = probe(tmp_path)
    assert platform.jetson == Jetson(
        "NVIDIA Jetson Xavier NX Developer Kit", "tegra194", (7, 2), None, None
    )


def test_orin_cpu_is_read_from_the_arm_cpuinfo_layout() -> None:
    assert probe_cpu(FIXTURES / "jetson" / "agx-orin-jp62") == ORIN_CPU


@pytest.mark.parametrize(
    ("text", "l4t"),
    [
        (
            "# R36 (release), REVISION: 4.3, GCID: 38968081, BOARD: generic, EABI: aarch64, "
            "DATE: Wed Jan  8 01:49:37 UTC 2025\n# KERNEL_VARIANT: oot\n",
            "36.4.3",
        ),
        (
            "# R35 (release), REVISION: 4.1, GCID: 33958178, BOARD: t186ref, EABI: aarch64, "
            "DATE: Tue Aug  1 19:57:35 UTC 2023",
            "35.4.1",
        ),
        (
            "# R32 (release), REVISION: 6.1, GCID: 27863751, BOARD: t186ref, EABI: aarch64, "
            "DATE: Mon Jul 26 19:36:31 UTC 2021",
            "32.6.1",
        ),
        ("garbage", None),
        ("", None),
    ],
)
def test_l4t_release_is_parsed(text: str, l4t: str | None) -> None:
    assert parse_l4t(text) == l4t


@pytest.mark.parametrize(
    ("l4t", "jetpack"),
    [
        ("36.4.3", "6.2"),
        ("36.4.0", "6.1"),
        ("35.4.1", "5.1.2"),
        ("38.2.1", "7.0"),
        ("39.2.0", "7.2"),
        ("36.9.9", None),
    ],
)
def test_jetpack_is_derived_from_l4t(l4t: str, jetpack: str | None) -> None:
    assert jetpack_for(l4t) == jetpack


def test_x86_flags_of_interest_are_kept() -> None:
    root = FIXTURES / "hosts" / "xeon-8480"
    assert probe_cpu(root) == Cpu(
        "Intel(R) Xeon(R) Platinum 8480+", 4, frozenset({"avx2", "avx512f", "amx_tile", "amx_bf16"})
    )
    assert probe(root, nvml=False).kind == "cpu"


def test_an_empty_tree_is_a_cpu_with_fallbacks(tmp_path: Path) -> None:
    platform = probe(tmp_path, nvml=False)
    assert (platform.kind, platform.jetson, platform.gpus) == ("cpu", None, ())
    assert platform.cpu == Cpu("unknown", os.cpu_count() or 1, frozenset())


def test_probe_of_this_machine_is_plausible() -> None:
    platform = probe_for_backends()
    assert platform.kind == ("nvidia-gpu" if platform.gpus else "cpu")
    assert platform.jetson is None
    assert platform.cpu.model not in ("", "unknown")
    assert platform.cpu.cores == os.cpu_count()
    assert {"openvino", "onnxruntime"} <= platform.modules
    assert ("tensorrt" in platform.modules) == (importlib.util.find_spec("tensorrt") is not None)


def test_probe_imports_no_engine() -> None:
    script = (
        "import sys; from edgeserve import backends; backends.probe(); "
        "engines = ('openvino', 'onnxruntime', 'tensorrt', 'pynvml'); "
        "print(sorted(m for m in engines if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == "[]"


def test_describe_gives_doctor_rows() -> None:
    platform = Platform(
        "jetson",
        ORIN_CPU,
        (),
        probe(FIXTURES / "jetson" / "agx-orin-jp62").jetson,
        frozenset({"onnxruntime"}),
    )
    choice = Choice(
        "onnxruntime",
        "first usable",
        (("tensorrt", "tensorrt is not installed"),),
    )
    assert describe(platform, choice) == [
        ("platform", "jetson"),
        ("cpu", "ARM Cortex-A78AE, 12 cores, flags: asimd"),
        ("jetson", "NVIDIA Jetson AGX Orin Developer Kit (tegra234, sm 8.7)"),
        ("L4T / JetPack", "36.4.3 / 6.2"),
        ("python modules", "onnxruntime"),
        ("backend", "onnxruntime"),
        ("why", "first usable"),
        ("not tensorrt", "tensorrt is not installed"),
    ]


def _nvml_works() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
    except Exception:
        return False
    return True


@pytest.mark.gpu
@pytest.mark.skipif(not _nvml_works(), reason="needs pynvml (nvidia-ml-py) and an NVIDIA driver")
def test_probe_lists_nvidia_gpus_through_nvml() -> None:
    gpus = probe_gpus()
    assert gpus, "NVML works but listed no GPU"
    assert probe().kind == "nvidia-gpu"
    for index, gpu in enumerate(gpus):
        assert gpu.index == index
        assert gpu.name.startswith("NVIDIA") or "Tesla" in gpu.name
        assert gpu.compute_capability >= (5, 0)
        assert gpu.memory_bytes > 2**30
        assert gpu.driver.count(".") >= 1
