#!/usr/bin/env bash
# Prepares a bare GPU machine for benchmarks/gpu.py, gpu_sweep.py and the GPU tests (no
# internet there): unpacks the tree and the carried wheels into /tmp, writes /tmp/gpu-env.sh.
#
#   bash gpu-setup.sh CARRIED     # CARRIED: tree.tar (git archive of the tree to run),
#                                 # whl/*.whl (this tree's dependencies, tomlkit and pyyaml
#                                 # included), libb64-0d*.deb; the onnxruntime-gpu wheel either
#                                 # as /tmp/parts/ort.part* (`split -b 56M` of the .whl, one
#                                 # piece carried per call) or /tmp/chunks/ort.tar.zst.* (its
#                                 # files, tar | zstd, split)
#   . /tmp/gpu-env.sh             # then: cd /tmp/tree && python benchmarks/gpu.py ...
set -euo pipefail
carried=$(cd "$1" && pwd)
site=/tmp/site
mkdir -p "$site" /tmp/tree /tmp/b64
tar -xf "$carried/tree.tar" -C /tmp/tree
wheels=("$carried"/whl/*.whl)
if [ -e /tmp/parts/ort.part0 ]; then
    ort=/tmp/onnxruntime_gpu-1.31.1-cp312-cp312-manylinux_2_28_x86_64.whl
    cat /tmp/parts/ort.part* > "$ort" && rm -rf /tmp/parts
    wheels+=("$ort")
fi
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$site" "${wheels[@]}"
if [ -e /tmp/chunks/ort.tar.zst.aa ]; then
    cat /tmp/chunks/ort.tar.zst.* | PYTHONPATH="$site" python3 -c '
import sys, zstandard
zstandard.ZstdDecompressor(max_window_size=2**28).copy_stream(sys.stdin.buffer, sys.stdout.buffer)
' | tar -x -C "$site"
    rm -rf /tmp/chunks
fi
dpkg -x "$carried"/libb64-0d*.deb /tmp/b64
cat > /tmp/gpu-env.sh <<ENV
export PYTHONPATH=/tmp/tree:$site
export PATH=$site/bin:\$PATH
export LD_LIBRARY_PATH=/tmp/b64/usr/lib/x86_64-linux-gnu:$site/nvidia/cuda_runtime/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}
export PYTHONUNBUFFERED=1
ENV
. /tmp/gpu-env.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
nproc
python3 -c 'import onnxruntime as o; o.preload_dlls(); print("onnxruntime", o.__version__, o.get_available_providers())'
perf_analyzer --version 2>&1 | head -1 || true
