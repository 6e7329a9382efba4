#!/usr/bin/env bash
# Sixth round of the draft fc on one H200: the cluster kernel's four and eight token groups (M = 17..64,
# decode_stream_wide). Build; the wide-M CUDA tests first, then all draft fc CUDA tests; the bench binary at M = 16,
# 32, 64 for each row grouping; the op at M = 16, 32, 64 with the decode threshold at 64 against normalise + cuBLAS
# and (b) in the same run. SAN=1 adds the sanitizers.
source "$(dirname "$0")/device_env.sh"
build_fc
step wide-M draft fc tests
timeout 150 python3 -m pytest -m "cuda and not multigpu" -q -x tests/test_draft_fc.py -k "wide or repeated or threshold" \
  2>&1 | tee "$OUT/pytest_wide.log" | grep -E "FAILED|passed|failed|rror" | tail -6
wait
B=./build/bench/bench_draft_fc
step "bench_draft_fc binary: cluster kernel, M = 8..64, row groups"
{
  for n in 896 7168; do
    $B --M 8 --N $n --samples 7 --kernel cluster --probe 1 | tail -n +3
    for m in 16 24 32 48 64; do
      for r in 0 1 2 4; do echo -n "R=$r "; $B --M $m --N $n --samples 7 --kernel cluster --row-groups $r | tail -1; done
    done
  done
} 2>&1 | tee "$OUT/bench_binary.log" | grep -v "^check: .*(ok)"
step op M=16..64 with the decode threshold at 64
timeout 200 python3 benchmarks/bench_draft_fc.py --samples 11 --N 896,7168 --M 16,24,32,48,64 --decode-max-rows 64 \
  --compare-paths --out "$OUT/draft_fc-wide-h200.json" 2>&1 | tee "$OUT/wide.log" | grep -E "M=|streaming"
fc_cuda_tests
[ -n "${SAN:-}" ] && fc_sanitizers
step done
