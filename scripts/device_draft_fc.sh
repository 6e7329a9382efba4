#!/usr/bin/env bash
# One device call for the draft fc: build for sm_90a, CUDA tests (capture + draft fc), compute-sanitizer memcheck
# and racecheck on the draft fc tests, the Python benchmark and the CMake bench binary. Logs land in $OUT.
source "$(dirname "$0")/device_env.sh"
step build
TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 python3 -m pip install -q --no-build-isolation --no-deps -e . \
  > "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
(cmake -S . -B build/bench -DE3_CUDA_ARCHS=90a && cmake --build build/bench -j 16) > "$OUT/cmake.log" 2>&1 &
step pytest cuda
python3 -m pytest -m cuda -q tests/test_capture.py tests/test_draft_fc.py 2>&1 | tee "$OUT/pytest_cuda.log" | tail -25
step memcheck
E3_HYPOTHESIS_PROFILE=sanitizer compute-sanitizer --tool memcheck --error-exitcode 3 \
  python3 -m pytest -m cuda -q -x tests/test_draft_fc.py > "$OUT/memcheck.log" 2>&1
echo "memcheck rc=$?"; grep -E "ERROR SUMMARY|passed|failed" "$OUT/memcheck.log" | tail -3
step racecheck
E3_HYPOTHESIS_PROFILE=sanitizer compute-sanitizer --tool racecheck --kernel-name-exclude kns=nvjet --error-exitcode 3 \
  python3 -m pytest -m cuda -q -x tests/test_draft_fc.py -k "repeated or agree or graph" > "$OUT/racecheck.log" 2>&1
echo "racecheck rc=$?"; grep -E "RACECHECK SUMMARY|passed|failed" "$OUT/racecheck.log" | tail -3
grep -E -A4 "hazard|Race reported" "$OUT/racecheck.log" | grep -vE "^\s*$" | cut -c1-220 | head -14
step bench python
python3 benchmarks/bench_draft_fc.py --out "$OUT/draft_fc-h200.json" 2>&1 | tee "$OUT/bench_draft_fc.log" | tail -22
step bench binary
wait
for n in 896 7168; do for m in 1 8 64; do for b in 2 4 6; do
  ./build/bench/bench_draft_fc --M $m --N $n --blocks-per-sm $b | tail -1; done; done; done 2>&1 | tee "$OUT/bench_binary.log"
step done
