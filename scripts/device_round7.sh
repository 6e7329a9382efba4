#!/usr/bin/env bash
# Seventh round of the draft fc on one H200: the sums of x^2 on the tensor cores and x * g as one bf16x2/f16x2
# multiply in the register kernels' stream. Build; the draft fc CUDA tests; the bench binary against the previous
# kernels built from old_src/ (same run); the op's decode sweep with every decode path; the full op table;
# memcheck and racecheck of the draft fc tests.
source "$(dirname "$0")/device_env.sh"
build_fc
[ -d old_src ] && { (cmake -S old_src -B build/bench_old -DE3_CUDA_ARCHS=90a && \
  cmake --build build/bench_old -j 8 --target bench_draft_fc) > "$OUT/cmake_old.log" 2>&1 & }
step draft fc tests
timeout 240 python3 -m pytest -m "cuda and not multigpu" -q tests/test_draft_fc.py tests/sglang/test_hook_calls_cuda.py \
  2>&1 | tee "$OUT/pytest_cuda.log" | grep -E "FAILED|passed|failed|rror" | tail -8
wait
step "bench_draft_fc binary: new vs old (cluster, split), read probe"
for n in 896 1792 3584 7168; do
  for m in 1 8; do
    for k in cluster split; do
      ./build/bench/bench_draft_fc --M $m --N $n --samples 9 --kernel $k | tail -1
      [ -x build/bench_old/bench_draft_fc ] && { echo -n "old:  "; build/bench_old/bench_draft_fc --M $m --N $n --samples 9 --kernel $k | tail -1; }
    done
  done
done 2>&1 | tee "$OUT/bench_binary.log"
step op decode sweep, every decode path
timeout 150 python3 benchmarks/bench_draft_fc.py --samples 15 --N 896,1792,3584,7168 --M 1,4,8 --compare-paths \
  --compare-kernels --out "$OUT/draft_fc-decode-sweep-h200.json" --plot "$OUT/draft_fc-decode-sweep-h200.png" 2>&1 \
  | tee "$OUT/sweep.log" | grep -E "M=|streaming"
step bench draft fc op
timeout 150 python3 benchmarks/bench_draft_fc.py --samples 15 --M 1,4,8,16,32,64,512,4096 --compare-paths \
  --out "$OUT/draft_fc-h200.json" --plot "$OUT/draft_fc-h200.png" 2>&1 | tee "$OUT/bench_fc.log" | grep -E "M=|streaming"
step memcheck draft fc
E3_HYPOTHESIS_PROFILE=sanitizer timeout 120 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 3 \
  python3 -m pytest -m cuda -q -x tests/test_draft_fc.py \
  --deselect tests/test_draft_fc.py::test_cuda_rejects_misaligned_rows_and_mixed_devices > "$OUT/memcheck_fc.log" 2>&1
echo "memcheck fc rc=$?"; grep -E "ERROR SUMMARY|passed|failed" "$OUT/memcheck_fc.log" | tail -2
step racecheck draft fc decode path
E3_HYPOTHESIS_PROFILE=sanitizer timeout 60 compute-sanitizer --tool racecheck --report-api-errors no \
  --kernel-name kns=draft_fc --error-exitcode 3 python3 -m pytest -m cuda -q tests/test_draft_fc.py \
  -k "(repeated and not 33) or producers or every_decode" > "$OUT/racecheck_fc.log" 2>&1
echo "racecheck rc=$?"; grep -E "RACECHECK SUMMARY|passed|failed" "$OUT/racecheck_fc.log" | tail -2
step done
