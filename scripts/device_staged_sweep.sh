#!/usr/bin/env bash
# The staged-activation kernel (experiment, bench binary only) against the register kernels and the read probe.
source "$(dirname "$0")/device_env.sh"
(cmake -S . -B build/bench -DE3_CUDA_ARCHS=90a && cmake --build build/bench -j 16 --target bench_draft_fc) > $OUT/cmake.log 2>&1 || { tail -20 $OUT/cmake.log; exit 1; }
for n in 896 7168; do
  for m in 9 16 24 32 48 64; do
    ./build/bench/bench_draft_fc --M $m --N $n --kernel staged --samples 7 | grep -E "^staged|TOO|check" | tr '\n' ' '; echo
  done
  ./build/bench/bench_draft_fc --M 8 --N $n --kernel auto --probe 1 --samples 7 | tail -2
  ./build/bench/bench_draft_fc --M 16 --N $n --kernel split --samples 7 | tail -1
done 2>&1 | sed 's/check: 15 outputs vs float64 host: worst error/chk/; s/of the term scale//' | tee $OUT/sweep.log
