#!/usr/bin/env bash
# Issue 18 on ONE H200 (kind nvidia-h200), one call of about 9 minutes; every step time-boxed, most important first.
#   bash scripts/gpu_check.sh            (logs and results under $OUT; $OUT/summary.txt has one line per step)
# 1. build for sm_90a (and the CMake bench binaries in the background)
# 2. the CUDA tests this issue touched, with the device's own tuning: the p2p gather protocol on one GPU (both
#    signals, 2-4 pretend ranks on streams, timeouts, malformed slot; tests/test_gather_protocol_cuda.py), the
#    device tuning equal to the table for the H200's facts, the cluster -> split fallback, the fused add + RMSNorm
#    at H = 7168 with more rows than SMs, a malformed override raising, and the capture / draft fc suites
# 3. compute-sanitizer memcheck and racecheck over the changed kernels (gather: the sequential protocol test and the
#    timeouts, which need no concurrent kernels; draft fc decode incl. the fallback; fused add + RMSNorm)
# 4. the capture and draft fc CUDA tests again with the RTX PRO 6000's reasoned constants forced by the overrides
#    (decode rows 16, cluster switch 6, fused block 448): the code paths sm_120 will take, on this GPU
# 5. benchmarks, to show the H200 figures did not move (no H200 constant moved): bench_draft_fc (binary, auto, and
#    the op at M = 1, 8, 16), bench_capture (binary)
# Success: every line of $OUT/summary.txt starts with PASS; the bench numbers within noise of benchmarks/README.md
# (draft fc decode N=896 M=1 ~14.6-15.5 us, N=7168 ~82-85 us; capture T=8192 ~270 us, fused ~450 us).
source "$(dirname "$0")/device_env.sh"
export CUDA_VISIBLE_DEVICES=0
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"
result() { echo "$*" | tee -a "$SUMMARY"; }
# One deadline for the whole run (BUDGET_S, default 530 s): each step gets min(its cap, what is left); a step with
# under 15 s left is reported SKIP, which is not a pass.
DEADLINE=$(( $(date +%s) + ${BUDGET_S:-530} ))
cap() { local left=$(( DEADLINE - $(date +%s) )); echo $(( left < $1 ? left : $1 )); }
have_time() { [ "$(cap 15)" -ge 15 ] || { result "SKIP $1 (no time left)"; return 1; }; }
# pytest's last line, PASS when it ran and nothing failed
pytest_result() {  # name log rc
  local line; line=$(grep -E "(passed|failed|error)" "$2" | tail -1)
  if [ "$3" = 0 ]; then result "PASS $1: $line"; else result "FAIL $1 (rc=$3): $line"; fi
}
sanitizer_result() {  # name log rc
  local line; line=$(grep -E "(ERROR|RACECHECK) SUMMARY" "$2" | tail -1)
  if [ "$3" = 0 ]; then result "PASS $1: $line"; else result "FAIL $1 (rc=$3): $line $(grep -E 'passed|failed' "$2" | tail -1)"; fi
}

step build sm_90a
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 timeout "$(cap 240)" python3 -m pip install -q --no-build-isolation --no-deps -e . \
  > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; result "FAIL build"; exit 1; }
result "PASS build"
(cmake -S . -B build/bench -DE3_CUDA_ARCHS=90a && cmake --build build/bench -j 16) > "$OUT/cmake.log" 2>&1 &
python3 -c "import json; from eagle3_capture import tuning; print(json.dumps(tuning.for_device(0), indent=1))" \
  > "$OUT/device_tuning.json" 2>&1; cat "$OUT/device_tuning.json"

step CUDA tests with the device tuning
# The sanitizer hypothesis profile (25 examples a fuzz test) keeps the capture and draft fc suites inside the budget.
if have_time "cuda tests"; then
  E3_HYPOTHESIS_PROFILE=sanitizer timeout "$(cap 200)" python3 -m pytest -m "cuda and not multigpu" -q \
    -p no:cacheprovider tests > "$OUT/pytest_cuda.log" 2>&1
  pytest_result "every single-GPU cuda test" "$OUT/pytest_cuda.log" $?
  grep -E "FAILED|Error" "$OUT/pytest_cuda.log" | head -8
fi

step memcheck gather protocol, draft fc decode + fallback, fused add + RMSNorm
SAN_TESTS=(tests/test_gather_protocol_cuda.py tests/test_draft_fc.py tests/test_capture.py)
SAN_K="sequential or times_out or malformed_slot or already_past or refusal or repeated or many_rows_at_h7168"
if have_time memcheck; then
  E3_HYPOTHESIS_PROFILE=sanitizer timeout "$(cap 90)" compute-sanitizer --tool memcheck --report-api-errors no \
    --error-exitcode 3 python3 -m pytest -m cuda -q -p no:cacheprovider "${SAN_TESTS[@]}" -k "$SAN_K" \
    > "$OUT/memcheck.log" 2>&1
  sanitizer_result "memcheck" "$OUT/memcheck.log" $?
fi

step racecheck the same kernels
# No kernel filter: these tests run no cuBLAS (draft fc at M <= 16 on the decode kernels), where racecheck crashes.
if have_time racecheck; then
  E3_HYPOTHESIS_PROFILE=sanitizer timeout "$(cap 60)" compute-sanitizer --tool racecheck --report-api-errors no \
    --error-exitcode 3 python3 -m pytest -m cuda -q -p no:cacheprovider "${SAN_TESTS[@]}" \
    -k "sequential or malformed_slot or refusal or (repeated and not 33) or many_rows_at_h7168" \
    > "$OUT/racecheck.log" 2>&1
  sanitizer_result "racecheck" "$OUT/racecheck.log" $?
fi

step CUDA tests with the RTX PRO 6000 constants forced
if have_time "cuda tests with sm_120 constants"; then
  EAGLE3_CAPTURE_DECODE_MAX_ROWS=16 EAGLE3_CAPTURE_CLUSTER_MIN_SPLITS=6 EAGLE3_CAPTURE_FUSED_NORM_THREADS=448 \
    E3_HYPOTHESIS_PROFILE=sanitizer timeout "$(cap 75)" python3 -m pytest -m "cuda and not multigpu" -q \
    -p no:cacheprovider tests/test_capture.py tests/test_draft_fc.py -k "not malformed_tuning_override" \
    > "$OUT/pytest_cuda_sm120_constants.log" 2>&1
  pytest_result "cuda tests with sm_120 constants" "$OUT/pytest_cuda_sm120_constants.log" $?
fi

step bench draft fc and capture binaries
wait
if have_time "bench binaries"; then
  timeout "$(cap 60)" bash -c '
    for n in 896 7168; do for m in 1 8; do ./build/bench/bench_draft_fc --M $m --N $n | tail -1; done; done
    ./build/bench/bench_draft_fc --M 8 --N 3584 --kernel split | tail -1
    ./build/bench/bench_draft_fc --M 8 --N 3584 --kernel cluster | tail -1
    for t in 64 8192; do ./build/bench/bench_capture --T $t | tail -2; done' > "$OUT/bench_binaries.log" 2>&1
  rc=$?; cat "$OUT/bench_binaries.log"
  [ $rc = 0 ] && result "PASS bench binaries (figures in bench_binaries.log)" || result "FAIL bench binaries (rc=$rc)"
fi

step bench draft fc op
if have_time "bench draft fc op"; then
  timeout "$(cap 110)" python3 benchmarks/bench_draft_fc.py --M 1,8,16 --N 896,7168 --samples 15 \
    --out "$OUT/draft_fc-h200.json" --plot "$OUT/draft_fc-h200.png" > "$OUT/bench_fc.log" 2>&1
  rc=$?; grep -E "M=|streaming" "$OUT/bench_fc.log"
  [ $rc = 0 ] && result "PASS bench draft fc op" || result "FAIL bench draft fc op (rc=$rc)"
fi
step done
cat "$SUMMARY"
