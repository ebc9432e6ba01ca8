#!/usr/bin/env bash
# The GPU run of benchmarks/RESULTS-gpu.md, step by step on one machine after `gpu-setup.sh unpack`:
#
#   bash benchmarks/gpu-session.sh resnet|crnn|ocr|tests|triton|devices|per-device [DIR]
#
# resnet, crnn: perf_analyzer over HTTP, system and CUDA shared memory, against `workers =
#   auto`, with CPU per process, py-spy and `edgeserve bench -p 4` at c=128 (gpu_sweep.py);
# ocr: functions/ocr's samples on CUDA and on the CPU provider (auto, and one process);
# devices: the 2-GPU test and benchmark;
# per-device: 1, 2, 3 inference processes on the GPU (CRNN), and functions/ocr on the CPU
#   provider with 1, 2, 4 processes sharing the cores against one process (sweeps under DIR);
# tests: the GPU tests; triton: edgeserve and then PyTriton binding ONNX Runtime CUDA, the same
#   models, max batch and delay, under the same perf_analyzer (PyTriton in a virtualenv of its
#   own, from the wheels in /tmp/pyw).
set -uo pipefail
. /tmp/gpu-env.sh
cd "$(dirname "$0")/.."
levels=1,16,64,128
case $1 in
resnet | crnn)
    shm=system,cuda
    python3 benchmarks/gpu_sweep.py /tmp/w --out "/tmp/o-$1" --models "$1" --workers auto \
        --shm-workers auto --concurrency $levels --shm $shm --profile --bench --limits ;;
ocr)
    python3 benchmarks/gpu_sweep.py /tmp/w --out /tmp/o-ocr --models "" \
        --function functions/ocr --workers auto --concurrency 1,32 --profile
    EDGESERVE_DEVICE=cpu python3 benchmarks/gpu_sweep.py /tmp/w --out /tmp/o-ocr-cpu \
        --models "" --function functions/ocr --workers auto,1 --concurrency 1,32 ;;
devices)  # on a machine of 2 GPUs: one inference process per GPU (tests and benchmark)
    python3 -m pytest -q -p no:cacheprovider tests/test_workers_gpu.py
    python3 benchmarks/devices.py /tmp/w --processes 4 ;;
per-device)  # [resources] processes_per_device, Triton's instance_group count
    out=${2:-/tmp/o-per-device}
    python3 benchmarks/gpu_sweep.py /tmp/w --out "$out/crnn" --models crnn --workers auto \
        --per-device 1,2,3 --concurrency 16,64,128 --shm "" --limits
    export EDGESERVE_DEVICE=cpu
    python3 benchmarks/gpu_sweep.py /tmp/w --out "$out/ocr-cpu" --models "" \
        --function functions/ocr --workers 1 --concurrency 32
    python3 benchmarks/gpu_sweep.py /tmp/w --out "$out/ocr-cpu-auto" --models "" \
        --function functions/ocr --workers auto --per-device 1,2,4,auto --concurrency 32
    unset EDGESERVE_DEVICE
    python3 benchmarks/gpu_sweep.py /tmp/w --out "$out/ocr-cuda" --models "" \
        --function functions/ocr --workers auto --per-device 1,2 --concurrency 32 ;;
tests)
    python3 -m pytest -q -p no:cacheprovider tests/test_cuda_sharedmemory.py \
        tests/test_buckets.py tests/test_stage_ahead.py tests/test_perf_analyzer.py \
        tests/test_sharedmemory.py ;;
triton)  # edgeserve, then Triton, per model, one after the other under the same perf_analyzer
    # PyTriton runs in a virtualenv of its own (/tmp/tv): its Python backend stub finds its
    # modules (pyzmq, numpy < 2, PyTriton's proxy) in the interpreter's prefix, never PYTHONPATH;
    # /tmp/pyw holds nvidia-pytriton 0.7.0 and its dependencies' wheels (cp312)
    python3 -m venv --without-pip --system-site-packages /tmp/tv
    tv=/tmp/tv/lib/python3.12/site-packages
    python3 -m pip install -q --no-index --no-deps --no-compile --target $tv /tmp/pyw/*.whl
    for model in resnet crnn; do
        shape=$([ $model = resnet ] && echo 3,224,224 || echo 1,32,128)
        python3 benchmarks/gpu_sweep.py /tmp/w --out /tmp/o-es-$model --models $model \
            --workers auto --shm-workers none --concurrency $levels --shm "" --limits
        # tritonserver runs from a copy in PyTriton's workspace: its grafted libraries by path
        PYTHONPATH=$tv:$PYTHONPATH LD_LIBRARY_PATH=$tv/nvidia_pytriton.libs:$LD_LIBRARY_PATH \
            /tmp/tv/bin/python benchmarks/triton_server.py /tmp/w/$model/model.onnx $model 8100 \
            --cuda --max-batch 32 --delay-us 2000 >/tmp/triton-$model.log 2>&1 &
        server=$!
        python3 -c 'import os, sys, time, urllib.request as u
for _ in range(120):
    try:
        u.urlopen("http://127.0.0.1:8100/v2/models/'$model'/ready"); break
    except OSError:
        os.kill('$server', 0); time.sleep(1)' || { tail -5 /tmp/triton-$model.log; continue; }
        for c in ${levels//,/ }; do
            perf_analyzer -m $model -u 127.0.0.1:8100 -i http --concurrency-range $c -b 1 \
                --shape image:$shape --input-data random --measurement-interval 2000 \
                --stability-percentage 50 --max-trials 6 -f /tmp/triton-$model-$c.csv >/dev/null
            echo "triton $model c=$c (c, items/s, p50 us, p99 us): $(tail -1 /tmp/triton-$model-$c.csv | cut -d, -f1,2,10,13)"
        done
        kill $server; wait $server
    done ;;
esac
