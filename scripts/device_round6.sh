#!/usr/bin/env bash
# Sixth round of the draft fc on one H200: the norm weights folded into the fc weight (prepare_fc_weight,
# folded_norm_taps). Build; the draft fc CUDA tests (their fuzz draws folded cases for every decode kernel and the
# prefill path); the bench binary with the norm applied to x (--norm 1) and folded (--norm 2), same run; the full op
# table with the folded form timed beside; memcheck and racecheck of the draft fc tests.
source "$(dirname "$0")/device_env.sh"
build_fc
step draft fc tests
timeout 240 python3 -m pytest -m "cuda and not multigpu" -q tests/test_draft_fc.py tests/sglang/test_hook_calls_cuda.py \
  2>&1 | tee "$OUT/pytest_cuda.log" | grep -E "FAILED|passed|failed|rror" | tail -8
wait
step "bench_draft_fc binary: norm on x (1) vs folded (2), auto kernel"
for n in 896 1792 3584 7168; do
  for m in 1 8; do
    for nm in 1 2; do ./build/bench/bench_draft_fc --M $m --N $n --samples 9 --norm $nm | tail -1; done
  done
done 2>&1 | tee "$OUT/bench_binary.log"
step bench draft fc op, folded beside
timeout 300 python3 benchmarks/bench_draft_fc.py --samples 15 --M 1,4,8,16,32,64,512,4096 --compare-paths \
  --compare-folded --out "$OUT/draft_fc-h200.json" --plot "$OUT/draft_fc-h200.png" 2>&1 | tee "$OUT/bench_fc.log" \
  | grep -E "M=|streaming"
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
step done
