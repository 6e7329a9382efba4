#!/usr/bin/env bash
# Sanitizers of the draft fc kernels on one GPU (nvidia-h200 or GPU 0 of x2), time-boxed: memcheck over the CUDA
# tests (a smaller hypothesis profile; both decode kernels), racecheck on our kernels only (the sanitizer crashes inside cuBLAS's nvjet
# kernels, so only decode-path tests), initcheck on the decode path. SKIP_MEMCHECK=1 skips the memcheck step.
source "$(dirname "$0")/device_env.sh"
export CUDA_VISIBLE_DEVICES=0
step build
TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=32 python3 -m pip install -q --no-build-isolation --no-deps -e . \
  > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
if [ "${SKIP_MEMCHECK:-0}" != 1 ]; then
step memcheck draft fc
E3_HYPOTHESIS_PROFILE=sanitizer timeout 200 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 3 \
  python3 -m pytest -m cuda -q -x tests/test_draft_fc.py \
  --deselect tests/test_draft_fc.py::test_cuda_rejects_misaligned_rows_and_mixed_devices > "$OUT/memcheck_fc.log" 2>&1
echo "memcheck rc=$?"; grep -E "ERROR SUMMARY|passed|failed" "$OUT/memcheck_fc.log" | tail -2
fi
step racecheck draft fc kernels
# Decode-path tests only: under racecheck the sanitizer itself fails inside cuBLAS (M > 8 takes cuBLAS).
E3_HYPOTHESIS_PROFILE=sanitizer timeout 100 compute-sanitizer --tool racecheck --report-api-errors no \
  --kernel-name kns=draft_fc --error-exitcode 3 python3 -m pytest -m cuda -q tests/test_draft_fc.py \
  -k "(repeated and not 33) or producers or every_decode" > "$OUT/racecheck_fc.log" 2>&1
echo "racecheck rc=$?"; grep -E "RACECHECK SUMMARY|passed|failed" "$OUT/racecheck_fc.log" | tail -2
step initcheck draft fc decode
timeout 80 compute-sanitizer --tool initcheck --report-api-errors no --kernel-name kns=draft_fc_decode \
  --error-exitcode 3 python3 -m pytest -m cuda -q -x tests/test_draft_fc.py -k "producers and not True" \
  > "$OUT/initcheck_fc.log" 2>&1
echo "initcheck rc=$?"; grep -E "ERROR SUMMARY|passed|failed" "$OUT/initcheck_fc.log" | tail -2
step done
