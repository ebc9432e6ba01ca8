#!/usr/bin/env bash
# The GPU run of benchmarks/RESULTS-gpu.md, step by step on one machine after gpu-setup.sh:
#
#   bash benchmarks/gpu-session.sh resnet|crnn|ocr|tests|triton
#
# resnet, crnn: perf_analyzer over HTTP, system and CUDA shared memory, against `workers =
#   auto`, with CPU per process, py-spy and `edgeserve bench -p 4` at c=128 (gpu_sweep.py);
# ocr: functions/ocr's samples on CUDA and on the CPU provider (auto, and one process);
# tests: the GPU tests; triton: PyTriton binding ONNX Runtime CUDA, the same models, the same
#   max batch and delay, under the same perf_analyzer (PyTriton's wheels unpacked in /tmp/pyt).
set -uo pipefail
. /tmp/gpu-env.sh
cd /tmp/tree
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
tests)
    python3 -m pytest -q -p no:cacheprovider tests/test_cuda_sharedmemory.py \
        tests/test_buckets.py tests/test_stage_ahead.py tests/test_perf_analyzer.py \
        tests/test_sharedmemory.py ;;
triton)
    export PYTHONPATH=/tmp/pyt:$PYTHONPATH  # PyTriton wants numpy < 2, tritonclient 2.5x
    for model in resnet crnn; do
        shape=$([ $model = resnet ] && echo 3,224,224 || echo 1,32,128)
        python3 benchmarks/triton_server.py /tmp/w/$model/model.onnx $model 8100 --cuda \
            --max-batch 32 --delay-us 2000 >/tmp/triton-$model.log 2>&1 &
        server=$!
        python3 -c 'import time, urllib.request as u
for _ in range(180):
    try:
        u.urlopen("http://127.0.0.1:8100/v2/health/ready"); break
    except OSError: time.sleep(1)'
        for c in ${levels//,/ }; do
            perf_analyzer -m $model -u 127.0.0.1:8100 -i http --concurrency-range $c -b 1 \
                --shape image:$shape --input-data random --measurement-interval 2000 \
                --stability-percentage 50 --max-trials 6 -f /tmp/triton-$model-$c.csv >/dev/null
            echo "triton $model c=$c (c, items/s, p50 us, p99 us): $(tail -1 /tmp/triton-$model-$c.csv | cut -d, -f1,2,10,13)"
        done
        kill $server; wait $server
        tail -3 /tmp/triton-$model.log
    done ;;
esac
