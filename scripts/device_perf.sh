#!/usr/bin/env bash
# Performance iteration on nvidia-h200-x2, each step time-boxed, logs under $OUT: build; gather tests and benchmark
# with a grid-size sweep (2 GPUs); draft fc CUDA tests; bench_draft_fc binary sweep over kernel variants (
# blocks per SM, programmatic dependent launch); the Python draft fc benchmark with both op paths.
source "$(dirname "$0")/device_env.sh"
step build
TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=32 python3 -m pip install -q --no-build-isolation --no-deps -e . \
  > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
(cmake -S . -B build/bench -DE3_CUDA_ARCHS=90a && cmake --build build/bench -j 32) > "$OUT/cmake.log" 2>&1 &
step gather tests
timeout 120 python3 -m pytest -m multigpu -q -x tests/test_gather_cuda.py 2>&1 | tee "$OUT/pytest_gather.log" | tail -6
step bench gather
timeout 150 python3 benchmarks/bench_gather.py --samples 15 --sweep-blocks 64,132,528 --out "$OUT/gather-h200x2.json" \
  2>&1 | tee "$OUT/bench_gather.log" | tail -12
step draft fc tests
CUDA_VISIBLE_DEVICES=0 timeout 150 python3 -m pytest -m cuda -q -x tests/test_draft_fc.py 2>&1 | tee "$OUT/pytest_fc.log" | tail -4
step bench_draft_fc binary sweep
wait
{
for n in 896 7168; do for m in 1 4 8; do
  for b in 3 4; do for pdl in 0 1; do
    ./build/bench/bench_draft_fc --M $m --N $n --blocks-per-sm $b --pdl $pdl --samples 9 | tail -1
  done; done
done; done
} 2>&1 | tee "$OUT/bench_fc_bin.log" | grep -v "^check" | head -40
step bench draft fc python
CUDA_VISIBLE_DEVICES=0 timeout 150 python3 benchmarks/bench_draft_fc.py --samples 11 --M 1,4,8,16,32,64,4096 \
  --compare-paths --out "$OUT/draft_fc-h200.json" 2>&1 | tee "$OUT/bench_fc.log" | grep -E "M=|streaming"
step done
