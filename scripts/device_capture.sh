#!/usr/bin/env bash
# One device call for the capture ops: build for sm_90a, CUDA tests, compute-sanitizer (memcheck + racecheck),
# the Python benchmark and the CMake bench binary. Logs and results land in $OUT.
#   (device tool) bash scripts/device_capture.sh
source "$(dirname "$0")/device_env.sh"
step build
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 python3 -m pip install -q --no-build-isolation --no-deps -e . \
  > "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
python3 -m eagle3_capture selfcheck 2>&1 | tee "$OUT/selfcheck.log"
step pytest cuda
python3 -m pytest -m cuda -q tests/test_capture.py 2>&1 | tee "$OUT/pytest_cuda.log" | tail -15
step memcheck
E3_HYPOTHESIS_PROFILE=sanitizer compute-sanitizer --tool memcheck --error-exitcode 3 \
  python3 -m pytest -m cuda -q -x tests/test_capture.py > "$OUT/memcheck.log" 2>&1
echo "memcheck rc=$?"; grep -E "ERROR SUMMARY|passed|failed" "$OUT/memcheck.log" | tail -3
step racecheck
E3_HYPOTHESIS_PROFILE=sanitizer compute-sanitizer --tool racecheck --error-exitcode 3 \
  python3 -m pytest -m cuda -q -x tests/test_capture.py -k "fused or graph or many_rows" > "$OUT/racecheck.log" 2>&1
echo "racecheck rc=$?"; grep -E "RACECHECK SUMMARY|ERROR SUMMARY|passed|failed" "$OUT/racecheck.log" | tail -3
step bench python
python3 benchmarks/bench_capture.py --out "$OUT/capture-h200.json" 2>&1 | tee "$OUT/bench_capture.log" | tail -30
step bench binary
cmake -S . -B build/bench -DE3_CUDA_ARCHS=90a > "$OUT/cmake.log" 2>&1 && cmake --build build/bench -j 16 >> "$OUT/cmake.log" 2>&1 \
  || tail -20 "$OUT/cmake.log"
for t in 64 8192; do ./build/bench/bench_capture --T $t --H 7168 --K 3; done 2>&1 | tee "$OUT/bench_binary.log"
step done
