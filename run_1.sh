#!/usr/bin/env bash
# session 3, call 1: build, all gpu tests (torchvision reference on), train fp16 speed + profile, llm bench with flash prefill
set -u
R=$OUT; W=/tmp/w; mkdir -p $W; export OUT=$W
cd "$(dirname "$0")"
t0=$(date +%s); el() { echo "[t=$(( $(date +%s) - t0 ))s] $*"; }
( timeout 150 python3 tests/reference/torchvision_resnet50.py --out /tmp/tv.safetensors > $W/tvref.log 2>&1; echo "rc=$?" >> $W/tvref.log ) &
TV=$!
timeout 170 scripts/device.sh --no-tests 2>&1 | tail -5
el built
wait $TV; tail -3 $W/tvref.log
export GPULAB_TORCHVISION_REF=/tmp/tv.safetensors
G=build-device/src/cli/gpulab
timeout 60 $G train --synthetic --precision fp16 --batch 256 --steps 40 --json $W/train_fp16.json 2>&1 | tail -4
el train fp16
timeout 260 ctest --test-dir build-device -L gpu -j 4 --timeout 100 --output-on-failure > $W/ctest.log 2>&1
grep -E "tests passed|tests failed|\(Failed\)|\(Timeout\)|Not Run|Skipped" $W/ctest.log | head -40
el ctest
timeout 70 $G diagnose --out $W/diag_train --json $W/diag_train.json -- $G train --synthetic --precision fp16 --batch 256 --steps 20 > $W/diag_train.txt 2>&1
grep -A25 -i "top kernels" $W/diag_train.txt | head -30
el diag
timeout 90 $G bench llm --config llama2-7b --dummy-weights --batch 1,16 --input 128 --output 128 --prefill 2048 --json $W/llm.json 2>&1 | tail -20
el llm
tar czf $R/x.tgz -C $W .
