#!/usr/bin/env bash
# Draft fc decode policy sweep on one H200 (the shapes of H = 7168, K = 3 at tp = 8, 4, 2, 1), logs under $OUT:
# the op in graph replays with each decode kernel (cluster, split) and through normalise + cuBLAS, for M = 1..16;
# the bench binary's plain streaming read of each weight size (the floor of one launch that size).
source "$(dirname "$0")/device_env.sh"
build_fc
step op sweep
timeout 300 python3 benchmarks/bench_draft_fc.py --samples 15 --N ${SWEEP_N:-896,1792,3584,7168} \
  --M ${SWEEP_M:-1,8,12,16} --compare-paths --compare-kernels --out "$OUT/draft_fc-decode-sweep-h200.json" \
  --plot "$OUT/draft_fc-decode-sweep-h200.png" 2>&1 | tee "$OUT/sweep.log" | grep -E "M=|streaming"
wait
step read probe and binary kernels
for n in $(echo ${SWEEP_N:-896,1792,3584,7168} | tr , ' '); do
  ./build/bench/bench_draft_fc --M 1 --N $n --samples 9 --kernel cluster --probe 1 | tail -n 2
  ./build/bench/bench_draft_fc --M 1 --N $n --samples 9 --kernel split | tail -1
done 2>&1 | tee "$OUT/probe.log"
step done
