#!/usr/bin/env bash
# Fifth round of the draft fc on one H200: the L2 prefetch of the weight stream. Build; the draft fc CUDA tests (with
# the default prefetch); the bench binary over prefetch distances (0 = off, the control in the same run) for both
# register kernels, M = 1 and 8, N = 896..7168, and the read probe; the op's decode rows against (b). FULL=1 adds
# the full op table and the sanitizers (memcheck, racecheck of the decode paths, initcheck).
source "$(dirname "$0")/device_env.sh"
build_fc
step draft fc tests
timeout 240 python3 -m pytest -m "cuda and not multigpu" -q tests/test_draft_fc.py tests/sglang/test_hook_calls_cuda.py \
  2>&1 | tee "$OUT/pytest_cuda.log" | grep -E "FAILED|passed|failed|rror" | tail -8
wait
step "bench_draft_fc binary: prefetch distance sweep (${PF:-0 1 2 4 64})"
for n in ${NS:-896 1792 3584 7168}; do
  for m in 1 8; do
    [ "$m" = 1 ] && ./build/bench/bench_draft_fc --M 1 --N $n --samples 9 --kernel split --prefetch 0 --probe 1 | tail -1
    for k in cluster split; do
      for pf in ${PF:-0 1 2 4 64}; do
        ./build/bench/bench_draft_fc --M $m --N $n --samples 9 --kernel $k --prefetch $pf | tail -1
      done
    done
  done
done 2>&1 | tee "$OUT/bench_binary.log"
[ -n "${BPSM:-}" ] && for b in 1 2 3; do for pf in 0 64; do
  ./build/bench/bench_draft_fc --M 1 --N 896 --samples 9 --kernel cluster --blocks-per-sm $b --prefetch $pf | tail -1
done; done 2>&1 | tee "$OUT/bench_bpsm.log"
step op decode rows, default prefetch, against the baselines
timeout 200 python3 benchmarks/bench_draft_fc.py --samples 15 --N 896,7168 --M 1,4,8 --compare-paths \
  --compare-kernels --out "$OUT/draft_fc-decode-sweep-h200.json" 2>&1 | tee "$OUT/sweep.log" | grep -E "M=|streaming"
[ -z "${FULL:-}" ] && { step done; exit 0; }
step bench draft fc op
timeout 200 python3 benchmarks/bench_draft_fc.py --samples 15 --M 1,4,8,16,32,64,512,4096 --compare-paths \
  --out "$OUT/draft_fc-h200.json" --plot "$OUT/draft_fc-h200.png" 2>&1 | tee "$OUT/bench_fc.log" | grep -E "M=|streaming"
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
