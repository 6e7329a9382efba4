#!/usr/bin/env bash
# Sanitizers of the draft fc kernels on one GPU (nvidia-h200 or GPU 0 of x2), time-boxed: memcheck over the CUDA
# tests (a smaller hypothesis profile; both decode kernels), racecheck on our kernels only (the sanitizer crashes inside cuBLAS's nvjet
# kernels), initcheck on the decode path.
source "$(dirname "$0")/device_env.sh"
export CUDA_VISIBLE_DEVICES=0
step build
TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=32 python3 -m pip install -q --no-build-isolation --no-deps -e . \
  > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
step memcheck draft fc
E3_HYPOTHESIS_PROFILE=sanitizer timeout 200 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 3 \
  python3 -m pytest -m cuda -q -x tests/test_draft_fc.py \
  --deselect tests/test_draft_fc.py::test_cuda_rejects_misaligned_rows_and_mixed_devices > "$OUT/memcheck_fc.log" 2>&1
echo "memcheck rc=$?"; grep -E "ERROR SUMMARY|passed|failed" "$OUT/memcheck_fc.log" | tail -2
step racecheck draft fc kernels
E3_HYPOTHESIS_PROFILE=sanitizer timeout 100 compute-sanitizer --tool racecheck --report-api-errors no \
  --kernel-name kns=draft_fc --error-exitcode 3 python3 -m pytest -m cuda -q -x tests/test_draft_fc.py \
  -k "repeated or agree or producers or knob" > "$OUT/racecheck_fc.log" 2>&1
echo "racecheck rc=$?"; grep -E "RACECHECK SUMMARY|passed|failed" "$OUT/racecheck_fc.log" | tail -2
step initcheck draft fc decode
timeout 70 compute-sanitizer --tool initcheck --report-api-errors no --kernel-name kns=draft_fc_decode \
  --error-exitcode 3 python3 -m pytest -m cuda -q -x tests/test_draft_fc.py -k "repeated or producers" \
  > "$OUT/initcheck_fc.log" 2>&1
echo "initcheck rc=$?"; grep -E "ERROR SUMMARY|passed|failed" "$OUT/initcheck_fc.log" | tail -2
step done
