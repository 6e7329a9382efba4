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
