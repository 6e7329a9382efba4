#!/usr/bin/env bash
# Nsight Compute on one GPU (clocks left alone): the draft fc decode kernels of the bench_draft_fc binary (TMA and
# register-streaming) at M=1, N=896, with stall sampling and memory sections. Reports under $OUT.
source "$(dirname "$0")/device_env.sh"
export CUDA_VISIBLE_DEVICES=0
step build
(cmake -S . -B build/bench -DE3_CUDA_ARCHS=90a && cmake --build build/bench -j 32) > "$OUT/cmake.log" 2>&1 || tail "$OUT/cmake.log"
SECTIONS="--section SpeedOfLight --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables --section WarpStateStats --section SourceCounters --section SchedulerStats"
for bulk in 1 0; do
  step ncu bulk=$bulk
  timeout 150 ncu --clock-control none $SECTIONS -k regex:draft_fc --launch-skip 20 --launch-count 1 \
    ./build/bench/bench_draft_fc --M 1 --N 896 --bulk $bulk --iters 20 --samples 2 > "$OUT/ncu_bulk$bulk.txt" 2>&1
  grep -E "Duration|DRAM Throughput|L2 Cache Throughput|Stall|stall|Warp Cycles Per Issued|Eligible|L2 Hit|Mem Busy|Max Bandwidth|Sectors|Requests" "$OUT/ncu_bulk$bulk.txt" | head -40
done
step done
