#!/usr/bin/env bash
# Nsight Compute on one H200 (clocks left alone), N=896 M=1 (H=7168, K=3): the cluster and split decode kernels and
# the plain streaming read of the same weight bytes (bench_draft_fc --probe): duration, DRAM bytes and throughput,
# L2 traffic, warp stall reasons. Reports under $OUT.
source "$(dirname "$0")/device_env.sh"
step build
(cmake -S . -B build/bench -DE3_CUDA_ARCHS=90a && cmake --build build/bench -j 16 --target bench_draft_fc) \
  > "$OUT/cmake.log" 2>&1 || tail "$OUT/cmake.log"
SECTIONS="--section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy"
METRICS="--metrics dram__bytes_read.sum,lts__t_requests_srcunit_tex_op_read.sum,lts__t_sectors_srcunit_tex_op_read.sum"
prof() {  # name, kernel regex, bench args
  step ncu $1
  timeout 120 ncu --clock-control none $SECTIONS $METRICS -k regex:$2 --launch-skip 5 --launch-count 1 \
    ./build/bench/bench_draft_fc --M 1 --N ${N:-896} --iters 5 --samples 2 ${@:3} > "$OUT/ncu_$1.txt" 2>&1
  grep -E "Duration|DRAM Throughput|dram__bytes|lts__t_|L2 Hit|Mem Busy|Max Bandwidth|Warp Cycles Per Issued|Stall|Achieved Occupancy|Registers" \
    "$OUT/ncu_$1.txt" | head -24
}
prof cluster draft_fc_decode --kernel cluster
prof split draft_fc_decode --kernel split
prof probe read_probe --kernel split --probe 1
step done
