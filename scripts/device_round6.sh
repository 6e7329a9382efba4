#!/usr/bin/env bash
# Sixth round of the draft fc on one H200: the wide decode kernel (M = 9..64, activations staged in shared memory,
# draft_fc_wide_cuda.cu). Build; the wide-kernel CUDA tests first; the bench binary at M = 8..64 (wide against the
# register kernels at M <= 16); the op at M = 16..64 with the decode threshold at 64 against normalise + cuBLAS and
# (b) in the same run; all draft fc CUDA tests; SAN=1 adds the sanitizers.
source "$(dirname "$0")/device_env.sh"
build_fc
step wide-kernel draft fc tests
timeout 150 python3 -m pytest -m "cuda and not multigpu" -q -x tests/test_draft_fc.py -k "wide" \
  2>&1 | tee "$OUT/pytest_wide.log" | grep -E "FAILED|passed|failed|rror|assert" | tail -8
wait
B=./build/bench/bench_draft_fc
step "bench_draft_fc binary: wide kernel M = 8..64, register kernels M <= 16"
{
  for n in 896 7168; do
    $B --M 8 --N $n --samples 7 --kernel auto --probe 1 | tail -n +3
    for m in 8 16 24 32 48 64; do
      $B --M $m --N $n --samples 7 --kernel wide | tail -1
    done
    $B --M 16 --N $n --samples 7 --kernel auto | tail -1
  done
} 2>&1 | tee "$OUT/bench_binary.log" | grep -v "^check: .*(ok)"
step op M=16..64 with the decode threshold at 64
timeout 200 python3 benchmarks/bench_draft_fc.py --samples 11 --N 896,7168 --M 12,16,24,32,48,64 --decode-max-rows 64 \
  --compare-paths --out "$OUT/draft_fc-wide-h200.json" 2>&1 | tee "$OUT/wide.log" | grep -E "M=|streaming"
[ -n "${TESTS:-}" ] && fc_cuda_tests
[ -n "${SAN:-}" ] && fc_sanitizers
step done
