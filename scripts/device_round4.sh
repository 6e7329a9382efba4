#!/usr/bin/env bash
# Fourth round of the draft fc on one H200, each step time-boxed, logs under $OUT: build; the draft fc CUDA tests
# (two-token-group decode for M = 9..16, the cluster and split kernels); the bench binary (both kernels, M = 1..16,
# and a plain streaming read of the same weight bytes) against the previous kernel built from old_src/ when that
# tree is present (same run); the op benchmark, both paths for decode M; memcheck and racecheck of the draft fc;
# initcheck of the decode kernels without a kernel filter.
source "$(dirname "$0")/device_env.sh"
build_fc
build_old_bench
fc_cuda_tests
wait
step "bench_draft_fc binary: cluster vs split kernel vs the previous kernel in old_src, read probe"
for n in 896 1792 3584 7168; do
  for m in 1 8; do
    probe=0; [ "$m" = 1 ] && probe=1
    ./build/bench/bench_draft_fc --M $m --N $n --samples 9 --kernel cluster --probe $probe | tail -n +3
    ./build/bench/bench_draft_fc --M $m --N $n --samples 9 --kernel split | tail -1
    if [ -x build/bench_old/bench_draft_fc ]; then
      echo -n "old:  "; ./build/bench_old/bench_draft_fc --M $m --N $n --samples 9 --kernel cluster | tail -1
    fi
  done
done 2>&1 | tee "$OUT/bench_binary.log"
step op decode sweep, every decode path
timeout 200 python3 benchmarks/bench_draft_fc.py --samples 15 --N 896,1792,3584,7168 --M 1,4,8 --compare-paths \
  --compare-kernels --out "$OUT/draft_fc-decode-sweep-h200.json" --plot "$OUT/draft_fc-decode-sweep-h200.png" 2>&1 \
  | tee "$OUT/sweep.log" | grep -E "M=|streaming"
[ -n "${FULL:-}" ] && fc_full_table
fc_sanitizers
step done
