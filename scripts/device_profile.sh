#!/usr/bin/env bash
# Nsight Compute on one GPU (clocks left alone): the draft fc decode kernel (bench_draft_fc binary) and cuBLAS's
# kernel for plain F.linear at the same shape, so the two can be compared section by section. Reports under $OUT.
source "$(dirname "$0")/device_env.sh"
export CUDA_VISIBLE_DEVICES=0
step build
TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=32 python3 -m pip install -q --no-build-isolation --no-deps -e . \
  > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
(cmake -S . -B build/bench -DE3_CUDA_ARCHS=90a && cmake --build build/bench -j 32) > "$OUT/cmake.log" 2>&1 || tail "$OUT/cmake.log"
SECTIONS="--section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section LaunchStats --section Occupancy --section SchedulerStats"
for n in 896 7168; do
  step ncu decode kernel N=$n
  timeout 120 ncu --clock-control none $SECTIONS -k regex:draft_fc_decode --launch-skip 20 --launch-count 2 \
    ./build/bench/bench_draft_fc --M 1 --N $n --iters 20 --samples 2 > "$OUT/ncu_decode_$n.txt" 2>&1
  grep -E "Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Stall|Warp Cycles Per Issued|No Eligible|Active Warps|L2 Hit|Mem Busy|Max Bandwidth" "$OUT/ncu_decode_$n.txt" | head -24
  step ncu F.linear N=$n
  timeout 120 ncu --clock-control none $SECTIONS --launch-skip 40 --launch-count 2 python3 - $n > "$OUT/ncu_linear_$n.txt" 2>&1 <<'PY'
import sys, torch
n = int(sys.argv[1]); kh = 3 * 7168
ws = [torch.randn(n, kh, device="cuda", dtype=torch.bfloat16) for _ in range(max(2, 300_000_000 // (n * kh * 2) + 1))]
x = torch.randn(1, kh, device="cuda", dtype=torch.bfloat16)
for i in range(60):
    torch.nn.functional.linear(x, ws[i % len(ws)])
torch.cuda.synchronize()
PY
  grep -E "^  [a-zA-Z_].*\(|Duration|DRAM Throughput|Achieved Occupancy|Registers Per|Warp Cycles Per Issued|No Eligible|L2 Hit|Grid Size|Block Size" "$OUT/ncu_linear_$n.txt" | head -24
done
step done
