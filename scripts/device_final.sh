#!/usr/bin/env bash
# Validation + results on nvidia-h200-x2, each step time-boxed, in priority order: build; the CUDA tests (one GPU:
# capture, draft fc, the SGLang hooks' op calls; two GPUs: gather); memcheck of the gather; the gather and draft fc
# benchmarks (committed as benchmarks/results/*.json); the bench_draft_fc binary. Sanitizers of the draft fc kernels
# run in scripts/device_sanitize.sh.
source "$(dirname "$0")/device_env.sh"
step build
TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=32 python3 -m pip install -q --no-build-isolation --no-deps -e . \
  > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
(cmake -S . -B build/bench -DE3_CUDA_ARCHS=90a && cmake --build build/bench -j 32) > "$OUT/cmake.log" 2>&1 &
step cuda tests one GPU
CUDA_VISIBLE_DEVICES=0 timeout 200 python3 -m pytest -m "cuda and not multigpu" -q tests/test_capture.py \
  tests/test_draft_fc.py tests/sglang/test_hook_calls_cuda.py 2>&1 | tee "$OUT/pytest_cuda.log" | tail -4
gather_checks
step bench gather
timeout 120 python3 benchmarks/bench_gather.py --samples 20 --sweep-blocks 64,132,528 --out "$OUT/gather-h200x2.json" \
  2>&1 | tee "$OUT/bench_gather.log" | tail -12
step bench draft fc
CUDA_VISIBLE_DEVICES=0 timeout 150 python3 benchmarks/bench_draft_fc.py --samples 15 --M 1,4,8,16,32,64,512,4096 \
  --compare-paths --out "$OUT/draft_fc-h200.json" 2>&1 | tee "$OUT/bench_fc.log" | grep -E "M=|streaming"
step bench_draft_fc binary
wait
for n in 896 7168; do for m in 1 8; do ./build/bench/bench_draft_fc --M $m --N $n | tail -2; done; done 2>&1 | tail -8
step done
