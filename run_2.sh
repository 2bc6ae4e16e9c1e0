#!/usr/bin/env bash
set -u
R=$OUT; W=/tmp/w; mkdir -p $W; export OUT=$W
cd "$(dirname "$0")"
t0=$(date +%s); el() { echo "[t=$(( $(date +%s) - t0 ))s] $*"; }
( timeout 200 python3 tests/reference/torchvision_resnet50.py --out /tmp/tv.safetensors > $W/tvref.log 2>&1; echo "rc=$?" >> $W/tvref.log ) &
TV=$!
timeout 170 scripts/device.sh --no-tests > $W/device_sh.txt 2>&1; tail -2 $W/device_sh.txt
el built
wait $TV; cat $W/tvref.log
export GPULAB_TORCHVISION_REF=/tmp/tv.safetensors
timeout 100 ctest --test-dir build-device -R 'ReferenceGpu|BlasMatmul|Communicator.World|SyncBatchNormOfOne' -j 2 --timeout 60 --output-on-failure > $W/ctest.log 2>&1
grep -E "tests passed|tests failed|\(Failed\)|\(Timeout\)|worst|logits: rel|torch autocast|loss:" $W/ctest.log | head -40
el ctest
timeout 250 bench/train_vs_torch.sh build-device/src/cli/gpulab $W/tvt > $W/train_vs_torch.txt 2>&1; tail -12 $W/train_vs_torch.txt
el train_vs_torch
timeout 150 scripts/pipeline_story.sh --steps 30 --images 200 --repeat 1 > $W/story.txt 2>&1; grep -vE "^\s+(gaps|longest|mean|share|chunks|flagged|lowest)" $W/story.txt | tail -40
el story
tar czf $R/x.tgz -C $W .
