"""`edgeserve build functions/ocr --target aws-lambda` against the real package index (PyPI), as
on a fresh machine: the wheels must be ones the Lambda runtime's OS (Amazon Linux 2023) loads.

Slow (about 65 MB of wheels, cached by pip after the first run) and needs the package index.
What stays unverified here: running those cp312 wheels (this machine's Python is 3.11).
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from edgeserve.cli import main

OCR = Path(__file__).parent.parent / "functions" / "ocr"
pytestmark = pytest.mark.slow


def build_for_lambda(source: Path, out: Path) -> Path:
    assert main(["build", str(source), "--out", str(out / "ocr"), "--target", "aws-lambda"]) == 0
    return out / "dist" / "ocr-aws-lambda" / "ocr-aws-lambda.zip"


def test_the_default_profile_gets_python_3_12_wheels_for_amazon_linux_2023(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EDGESERVE_CACHE_DIR", str(tmp_path / "cache"))
    archive = build_for_lambda(OCR, tmp_path / "build")

    names = zipfile.ZipFile(archive).namelist()
    native = [name for name in names if name.endswith(".so") and "cpython" in name]
    assert native and all("cpython-312-x86_64-linux-gnu" in name for name in native)
    assert any(name.startswith("numpy-2.") and "dist-info" in name for name in names)
    assert {"app.py", "bundle/edgeserve.json", "onnxruntime/__init__.py"} <= set(names)
