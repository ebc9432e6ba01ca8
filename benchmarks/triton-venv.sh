#!/usr/bin/env bash
# The PyTriton venv the benchmark's Triton server runs in: separate, so that Triton's
# dependencies never touch the project's .venv. Run once per machine (PyPI access needed).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
python3.11 -m venv "$here/.venv-triton"
"$here/.venv-triton/bin/pip" install -q nvidia-pytriton onnxruntime numpy
