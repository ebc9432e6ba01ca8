#!/usr/bin/env bash
# Carries what the GPU runs of benchmarks/ need to a bare GPU machine, which reaches no index.
#
#   bash benchmarks/gpu-setup.sh pack     # here: this tree's missing dependencies as cp312
#       # manylinux wheels, onnxruntime-gpu's files as one xz archive (204 MB against its 256 MB
#       # wheel) and libb64 (perf_analyzer), in one tar split into .gpu-carry/part.a, .b, ...
#       # of 60 MB: the device tool carries 64 MiB a call, the working tree included
#   # one device call a part, in quick succession (a machine goes back 30 s after a call):
#   #   carry [".gpu-carry/part.X"]; mkdir -p /tmp/parts && mv .gpu-carry/part.X /tmp/parts/
#   bash benchmarks/gpu-setup.sh unpack   # there, with the last part: installs into /tmp/site
#       # and writes /tmp/gpu-env.sh (this tree and the wheels on PYTHONPATH, libb64 and
#       # libcudart.so.12 on LD_LIBRARY_PATH); `. /tmp/gpu-env.sh` before each run
set -euo pipefail
cd "$(dirname "$0")/.."
WHEELS=(openvino==2026.4.1 openvino-telemetry==2025.2.0 starlette==1.10.0 uvicorn==0.54.0
  httptools==0.9.0 orjson==3.13.0 pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0
  typing-inspection==0.4.5 typing_extensions==4.16.0 tomlkit==0.15.2 anyio==4.16.0 h11==0.16.0
  tritonclient==2.41.0 python-rapidjson==1.25 geventhttpclient==2.0.12 gevent==26.9.0
  greenlet==3.5.6 zope.event==6.2 zope.interface==8.7 brotli==1.2.1
  nvidia-cuda-runtime-cu12==12.9.79 py-spy==0.4.3 grpcio==1.85.3
  cuda-python==12.9.10 cuda-bindings==12.9.10)  # tritonclient's CUDA shared-memory utilities
  # import cuda.cudart, which cuda-python 13 (the GPU machine's) no longer has
ORT=onnxruntime-gpu==1.31.1

pack() {
    local stage
    stage=$(mktemp -d)
    local platforms=(--platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64
        --platform manylinux1_x86_64)
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp "${platforms[@]}" -d "$stage/wheels" "${WHEELS[@]}" "$ORT"
    mkdir "$stage/ort" "$stage/blob"
    (cd "$stage/ort" && python3 -m zipfile -e "$stage"/wheels/onnxruntime_gpu-*.whl .)
    rm "$stage"/wheels/onnxruntime_gpu-*.whl
    tar -C "$stage/ort" -c . | xz -T0 -6 > "$stage/blob/ort.tar.xz"
    mv "$stage"/wheels/*.whl "$stage/blob/"
    (cd "$stage/blob" && apt-get download libb64-0d >/dev/null)
    rm -rf .gpu-carry && mkdir .gpu-carry
    tar -C "$stage/blob" -c . | split -b 60000000 -a 1 - .gpu-carry/part.
    rm -rf "$stage"
    ls -l .gpu-carry
}

unpack() {
    local blob=/tmp/blob site=/tmp/site
    mkdir -p "$blob" "$site" /tmp/b64
    cat /tmp/parts/part.* | tar -x -C "$blob" && rm -rf /tmp/parts
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$site" "$blob"/*.whl
    python3 -c 'import lzma, sys, tarfile
with lzma.open(sys.argv[1]) as f, tarfile.open(fileobj=f, mode="r|") as t:
    t.extractall(sys.argv[2], filter="fully_trusted")' "$blob/ort.tar.xz" "$site"
    dpkg -x "$blob"/libb64-0d*.deb /tmp/b64
    rm -rf "$blob"
    cat > /tmp/gpu-env.sh <<ENV
export PYTHONPATH=$PWD:$site
export PATH=$site/bin:\$PATH
export LD_LIBRARY_PATH=/tmp/b64/usr/lib/x86_64-linux-gnu:$site/nvidia/cuda_runtime/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}
export PYTHONUNBUFFERED=1
ENV
    . /tmp/gpu-env.sh
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    nproc
    python3 -c 'import onnxruntime as o; o.preload_dlls(); print("onnxruntime", o.__version__, o.get_available_providers())'
    python3 -c 'import openvino; print("openvino", openvino.__version__)'
    perf_analyzer --version 2>&1 | head -1
}

case ${1:-} in
pack | unpack) "$1" ;;
*) echo "usage: bash benchmarks/gpu-setup.sh pack|unpack" >&2; exit 2 ;;
esac
