#!/usr/bin/env bash
# Fourth round of the draft fc on one H200, each step time-boxed, logs under $OUT: build; the draft fc CUDA tests
# (two-token-group decode for M = 9..16, the cluster and split kernels); the bench binary (both kernels, M = 1..16,
# and a plain streaming read of the same weight bytes) against the previous kernel built from old_src/ when that
# tree is present (same run); the op benchmark, both paths for decode M; memcheck and racecheck of the draft fc;
# initcheck of the decode kernels without a kernel filter.
source "$(dirname "$0")/device_env.sh"
build_fc
if [ -d old_src ]; then
  (cmake -S old_src -B build/bench_old -DE3_CUDA_ARCHS=90a && cmake --build build/bench_old -j 8 --target bench_draft_fc) \
    > "$OUT/cmake_old.log" 2>&1 &
fi
step draft fc tests
timeout 240 python3 -m pytest -m "cuda and not multigpu" -q tests/test_draft_fc.py tests/sglang/test_hook_calls_cuda.py \
  2>&1 | tee "$OUT/pytest_cuda.log" | grep -E "FAILED|passed|failed|rror" | tail -8
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
[ -n "${FULL:-}" ] && { step bench draft fc op
timeout 200 python3 benchmarks/bench_draft_fc.py --samples 15 --M 1,4,8,16,32,64,512,4096 --compare-paths \
  --out "$OUT/draft_fc-h200.json" --plot "$OUT/draft_fc-h200.png" 2>&1 | tee "$OUT/bench_fc.log" | grep -E "M=|streaming"; }
step memcheck draft fc
E3_HYPOTHESIS_PROFILE=sanitizer timeout 200 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 3 \
  python3 -m pytest -m cuda -q -x tests/test_draft_fc.py \
  --deselect tests/test_draft_fc.py::test_cuda_rejects_misaligned_rows_and_mixed_devices > "$OUT/memcheck_fc.log" 2>&1
echo "memcheck fc rc=$?"; grep -E "ERROR SUMMARY|passed|failed" "$OUT/memcheck_fc.log" | tail -2
step racecheck draft fc decode path
E3_HYPOTHESIS_PROFILE=sanitizer timeout 90 compute-sanitizer --tool racecheck --report-api-errors no \
  --kernel-name kns=draft_fc --error-exitcode 3 python3 -m pytest -m cuda -q tests/test_draft_fc.py \
  -k "(repeated and not 33) or producers or every_decode" > "$OUT/racecheck_fc.log" 2>&1
echo "racecheck rc=$?"; grep -E "RACECHECK SUMMARY|passed|failed" "$OUT/racecheck_fc.log" | tail -2
step initcheck draft fc decode, no kernel filter
timeout 120 compute-sanitizer --tool initcheck --report-api-errors no --error-exitcode 3 \
  python3 -m pytest -m cuda -q -x tests/test_draft_fc.py -k "producers and False" > "$OUT/initcheck_fc.log" 2>&1
echo "initcheck rc=$?"; grep -E "ERROR SUMMARY|passed|failed|Uninitialized" "$OUT/initcheck_fc.log" | sort | uniq -c | head -8
step done
