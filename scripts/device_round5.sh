#!/usr/bin/env bash
# Fifth round of the draft fc on one H200 (the cluster kernel's push-style tail and occupancy-aware tiling). Build;
# the draft fc CUDA tests; the bench binary (cluster and split kernels, the read probe, K = 1..8 at auto) against the
# previous cluster kernel built from old_src/ when that tree is present (same run); the op's decode sweep with every
# decode path; M = 12, 16 with the decode threshold raised to 16; FULL=1 adds the full op table; then memcheck,
# racecheck of the decode paths and initcheck of the decode kernels.
source "$(dirname "$0")/device_env.sh"
build_fc
build_old_bench
fc_cuda_tests
wait
B=./build/bench/bench_draft_fc
step "bench_draft_fc binary: cluster vs split vs the previous cluster kernel in old_src, read probe, K sweep"
{
  for n in 896 1792 3584 7168; do
    for m in 1 8 16; do
      probe=0; [ "$m" = 1 ] && probe=1
      $B --M $m --N $n --samples 9 --kernel cluster --probe $probe | tail -n +3
      $B --M $m --N $n --samples 9 --kernel split | tail -1
      [ -x build/bench_old/bench_draft_fc ] && { echo -n "old:  "; build/bench_old/bench_draft_fc --M $m --N $n --samples 9 --kernel cluster | tail -1; }
    done
  done
  for k in 1 2 4 5 6 8; do
    for kk in auto cluster split; do $B --M 1 --N 896 --K $k --H 7168 --samples 9 --kernel $kk | tail -1; done
  done
  for kk in auto cluster split; do $B --M 1 --N 896 --K 1 --H 21504 --samples 9 --kernel $kk | tail -1; done
  [ -x build/bench_old/bench_draft_fc ] && { echo -n "old:  "; build/bench_old/bench_draft_fc --M 1 --N 896 --K 1 --H 21504 --samples 9 --kernel auto | tail -1; }
} 2>&1 | tee "$OUT/bench_binary.log"
step op decode sweep, every decode path
timeout 200 python3 benchmarks/bench_draft_fc.py --samples 15 --N 896,1792,3584,7168 --M 1,4,8 --compare-paths \
  --compare-kernels --out "$OUT/draft_fc-decode-sweep-h200.json" --plot "$OUT/draft_fc-decode-sweep-h200.png" 2>&1 \
  | tee "$OUT/sweep.log" | grep -E "M=|streaming"
step op M=12,16 with the decode threshold at 16
timeout 150 python3 benchmarks/bench_draft_fc.py --samples 15 --N 896,7168 --M 12,16 --decode-max-rows 16 \
  --compare-paths --compare-kernels --out "$OUT/draft_fc-two-groups-h200.json" --plot "$OUT/two.png" 2>&1 \
  | tee "$OUT/two_groups.log" | grep -E "M=|streaming"
[ -n "${FULL:-}" ] && fc_full_table
fc_sanitizers
step done
