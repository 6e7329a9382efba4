#!/usr/bin/env bash
# Nsight Compute on one H200 (clocks left alone): the wide draft fc decode kernel at N=896 (H=7168, K=3), M = 8 and
# 64, against the cluster kernel at M = 8: duration, DRAM throughput, stall reasons. Reports under $OUT.
source "$(dirname "$0")/device_env.sh"
step build
(cmake -S . -B build/bench -DE3_CUDA_ARCHS=90a && cmake --build build/bench -j 16 --target bench_draft_fc) \
  > "$OUT/cmake.log" 2>&1 || tail "$OUT/cmake.log"
SECTIONS="--section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy --section LaunchStats"
prof() {  # name, kernel regex, bench args
  step ncu $1
  timeout 120 ncu --clock-control none $SECTIONS -k regex:$2 --launch-skip 5 --launch-count 1 \
    ./build/bench/bench_draft_fc --N ${N:-896} --iters 5 --samples 2 ${@:3} > "$OUT/ncu_$1.txt" 2>&1
  grep -E "Duration|DRAM Throughput|Mem Busy|Warp Cycles Per Issued|Achieved Occupancy|Registers Per|Grid Size|stalled|Block Limit" \
    "$OUT/ncu_$1.txt" | cut -c1-400 | head -16
}
prof wide8 draft_fc_wide --M 8 --kernel wide
prof wide64 draft_fc_wide --M 64 --kernel wide
prof cluster8 draft_fc_decode --M 8 --kernel cluster
step done
