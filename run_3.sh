#!/usr/bin/env bash
set -u
R=$OUT; W=/tmp/w; mkdir -p $W; export OUT=$W
cd "$(dirname "$0")"
t0=$(date +%s); el() { echo "[t=$(( $(date +%s) - t0 ))s] $*"; }
( timeout 200 python3 tests/reference/torchvision_resnet50.py --out /tmp/tv.safetensors > $W/tvref.log 2>&1; echo "rc=$?" >> $W/tvref.log;
  timeout 150 python3 tests/reference/torchvision_resnet50.py --batch 32 --out /tmp/tv32.safetensors > $W/tvref32.log 2>&1; echo "rc=$?" >> $W/tvref32.log ) &
TV=$!
timeout 170 scripts/device.sh --no-tests > $W/device_sh.txt 2>&1; tail -2 $W/device_sh.txt
el built
G=build-device/src/cli/gpulab
for p in fp32 tf32 bf16 fp16; do timeout 60 $G train --synthetic --precision $p --batch 256 --steps 20 --json $W/train_$p.json 2>&1 | grep throughput | sed "s/^/$p: /"; done
el trains
timeout 60 $G diagnose --out $W/diag_fp32 --json $W/diag_fp32.json -- $G train --synthetic --precision fp32 --batch 256 --steps 6 > $W/diag_fp32.txt 2>&1
grep -A12 "top kernels" $W/diag_fp32.txt
el diag
wait $TV; cat $W/tvref.log $W/tvref32.log
export GPULAB_TORCHVISION_REF=/tmp/tv.safetensors
timeout 200 ctest --test-dir build-device -L gpu -R 'ResNet|Reference|Train|DataParallel|Checkpoint|GpuLoader|GpuAugment|Blas|Communicator|Optimizer|LossScaler|Precision|MultiProcess' -j 3 --timeout 90 --output-on-failure > $W/ctest.log 2>&1
grep -E "tests passed|tests failed|\(Failed\)|\(Timeout\)|worst|ratio|logits: rel|torch autocast|loss:|relative update" $W/ctest.log | head -60
el ctest
GPULAB_TORCHVISION_REF=/tmp/tv32.safetensors timeout 60 build-device/tests/train/test_train_gpu --gtest_filter='ReferenceGpu.Fp32Forward*' 2>&1 | grep -E "worst|ratio|OK|FAILED  \]" | head
el ref32
timeout 120 bench/convergence.sh build-device/src/cli/gpulab $W/conv bf16 > $W/convergence.txt 2>&1; tail -8 $W/convergence.txt
el convergence
tar czf $R/x.tgz -C $W .
