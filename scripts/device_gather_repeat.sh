#!/usr/bin/env bash
# The gather's T=64 target has little margin: the benchmark at T = 1 and 64, repeated in separate processes on
# nvidia-h200-x2 (each its own NCCL baseline), to see the spread within one machine session.
source "$(dirname "$0")/device_env.sh"
step build
TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=32 python3 -m pip install -q --no-build-isolation --no-deps -e . \
  > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
for i in 1 2 3 4; do
  step "bench gather T=1,64, repeat $i"
  timeout 60 python3 benchmarks/bench_gather.py --T 1,64 --samples 30 --out "$OUT/gather-t64-$i.json" 2>&1 | tail -2
done
step done
