# Sourced by every scripts/device_*.sh: the shared environment of a device-machine run.
# NVLink multicast stays off everywhere (it can take a shared host's GPUs out of service).
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/e3out}; mkdir -p "$OUT"
step() { echo; echo "=== $* ($(date +%T))"; }
# The two-GPU gather checks shared by the x2 scripts: the CUDA tests, then memcheck of the p2p case (every rank).
gather_checks() {
  step gather tests two GPUs
  timeout 120 python3 -m pytest -m multigpu -q tests/test_gather_cuda.py 2>&1 | tee "$OUT/pytest_gather.log" | tail -3
  step memcheck gather
  timeout 100 compute-sanitizer --tool memcheck --report-api-errors no --target-processes all --error-exitcode 3 \
    python3 -m pytest -m multigpu -q -x tests/test_gather_cuda.py -k "matches_reference and p2p" \
    > "$OUT/memcheck_gather.log" 2>&1
  echo "memcheck gather rc=$?"; grep -E "ERROR SUMMARY|passed|failed" "$OUT/memcheck_gather.log" | tail -3
}
# The extension for sm_90a (editable install, exits the script on failure), then the bench_draft_fc binary in the
# background (its log in $OUT/cmake.log; `wait` before running it).
build_fc() {
  step build
  TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 python3 -m pip install -q --no-build-isolation --no-deps -e . \
    > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
  (cmake -S . -B build/bench -DE3_CUDA_ARCHS=90a && cmake --build build/bench -j 16 --target bench_draft_fc) \
    > "$OUT/cmake.log" 2>&1 &
}
# The bench_draft_fc binary of the previous tree in old_src/ (when present), in the background like build_fc's:
# `wait` before running build/bench_old/bench_draft_fc.
build_old_bench() {
  [ -d old_src ] || return 0
  (cmake -S old_src -B build/bench_old -DE3_CUDA_ARCHS=90a && cmake --build build/bench_old -j 8 --target bench_draft_fc) \
    > "$OUT/cmake_old.log" 2>&1 &
}
# The draft fc CUDA tests and the SGLang hooks' CUDA tests, the summary lines on stdout.
fc_cuda_tests() {
  step draft fc tests
  timeout 240 python3 -m pytest -m "cuda and not multigpu" -q tests/test_draft_fc.py tests/sglang/test_hook_calls_cuda.py \
    2>&1 | tee "$OUT/pytest_cuda.log" | grep -E "FAILED|passed|failed|rror" | tail -8
}
# The draft fc op's full table (M = 1 .. 4096 at N = 896 and 7168) into $OUT/draft_fc-h200.json.
fc_full_table() {
  step bench draft fc op
  timeout 200 python3 benchmarks/bench_draft_fc.py --samples 15 --M 1,4,8,16,32,64,512,4096 --compare-paths \
    --out "$OUT/draft_fc-h200.json" --plot "$OUT/draft_fc-h200.png" 2>&1 | tee "$OUT/bench_fc.log" | grep -E "M=|streaming"
}
# compute-sanitizer over the draft fc CUDA tests: memcheck, racecheck of the decode paths, initcheck of the decode
# kernels without a kernel filter.
fc_sanitizers() {
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
}
