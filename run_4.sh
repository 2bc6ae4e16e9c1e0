#!/usr/bin/env bash
# session 3, call 4: everything since call 3 (fused BN, Find algos, blas autotune), the bars of #5 and #6
set -u
R=$OUT; W=/tmp/w; mkdir -p $W; export OUT=$W
cd "$(dirname "$0")"
t0=$(date +%s); el() { echo "[t=$(( $(date +%s) - t0 ))s] $*"; }
END=$((t0 + 575))
cap() { local want=$1 left=$((END - $(date +%s))); ((left < 5)) && left=5; echo $((want < left ? want : left)); }
pack() { tar czf $R/x.tgz -C $W . ; }
trap pack EXIT
( timeout 200 python3 tests/reference/torchvision_resnet50.py --out /tmp/tv.safetensors > $W/tvref.log 2>&1; echo "rc=$?" >> $W/tvref.log ) &
TV=$!
timeout 170 scripts/device.sh --no-tests > $W/device_sh.txt 2>&1; tail -1 $W/device_sh.txt
el built
wait $TV; tail -1 $W/tvref.log
export GPULAB_TORCHVISION_REF=/tmp/tv.safetensors
timeout $(cap 140) ctest --test-dir build-device -L gpu -R 'ResNet|Reference|Precision|Trainer|Checkpoint|DataParallel|MultiProcess|GpuLoader|GpuAugment|Blas|Communicator|CudaEngine|Optimizer|LossScaler' -j 4 --timeout 100 --output-on-failure > $W/ctest.log 2>&1
grep -E "tests passed|tests failed|\(Failed\)|\(Timeout\)|ratio|relative update error|first wrong|fused|Fused.*:" $W/ctest.log | head -40
el ctest
timeout $(cap 210) bench/train_vs_torch.sh build-device/src/cli/gpulab $W/tvt > $W/train_vs_torch.txt 2>&1; tail -9 $W/train_vs_torch.txt
el train_vs_torch
timeout $(cap 50) build-device/src/cli/gpulab bench llm --config llama2-7b --dummy-weights --batch 1,16 --input 128 --output 128 --prefill 2048 --json $W/llm.json > $W/llm.txt 2>&1; tail -7 $W/llm.txt
el llm
timeout $(cap 150) scripts/pipeline_story.sh --steps 60 --images 400 --repeat 2 > $W/story.txt 2>&1; tail -7 $W/story.txt
el story
SEEDS="0 1 2" timeout $(cap 130) bench/convergence.sh build-device/src/cli/gpulab $W/conv bf16 > $W/convergence.txt 2>&1; tail -8 $W/convergence.txt
el convergence
