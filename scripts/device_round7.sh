#!/usr/bin/env bash
# The wgmma kernel (M = 9..64, compute capability 9.0) on one H200: build; the bench binary's spot check and timing
# against the register kernels and the read probe; the draft fc CUDA tests; memcheck of the wgmma tests; the op
# against normalise + cuBLAS and (b) at M = 16..64.
source "$(dirname "$0")/device_env.sh"
build_fc
wait
step bench binary: wgmma against the register kernels
for n in 896 7168; do
  for m in 8 16 32 64; do
    ./build/bench/bench_draft_fc --M $m --N $n --kernel wgmma --samples 9 | tail -1
  done
  ./build/bench/bench_draft_fc --M 1 --N $n --kernel wgmma --samples 9 | tail -1
  ./build/bench/bench_draft_fc --M 8 --N $n --kernel auto --probe 1 --samples 9 | tail -2
done 2>&1 | tee "$OUT/bench_bin.log"
grep -E "check" "$OUT/bench_bin.log" | sort | uniq -c
fc_cuda_tests
step memcheck wgmma tests
E3_HYPOTHESIS_PROFILE=sanitizer timeout 200 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 3 \
  python3 -m pytest -m cuda -q -x tests/test_draft_fc.py -k "wgmma and not runs_on_sm90" > "$OUT/memcheck_wgmma.log" 2>&1
echo "memcheck wgmma rc=$?"; grep -E "ERROR SUMMARY|passed|failed" "$OUT/memcheck_wgmma.log" | tail -2
step racecheck wgmma kernel
E3_HYPOTHESIS_PROFILE=sanitizer timeout 120 compute-sanitizer --tool racecheck --report-api-errors no \
  --kernel-name kns=draft_fc_wgmma --error-exitcode 3 python3 -m pytest -m cuda -q tests/test_draft_fc.py \
  -k "wgmma_graph or (wgmma_path_repeated and (17 or 64))" > "$OUT/racecheck_wgmma.log" 2>&1
echo "racecheck rc=$?"; grep -E "RACECHECK SUMMARY|passed|failed" "$OUT/racecheck_wgmma.log" | tail -2
step op: M = 16..64 against normalise + cuBLAS and the GEMM alone
timeout 150 python3 benchmarks/bench_draft_fc.py --samples 11 --M 16,32,64 --compare-paths \
  --out "$OUT/draft_fc-wgmma-h200.json" 2>&1 | tee "$OUT/bench_op.log" | grep -E "M=|streaming"
step done
