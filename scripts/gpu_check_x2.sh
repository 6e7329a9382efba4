#!/usr/bin/env bash
# Issue 18's two-GPU checks (kind nvidia-h200-x2; not run yet: no two-GPU machine was lent when it was written).
#   bash scripts/gpu_check_x2.sh         (logs under $OUT; $OUT/summary.txt has one line per step)
# The p2p gather between two processes on two GPUs with each arrival signal (atomic: what NVLink pairs get; flags:
# the protocol for links without native peer atomics, forced on here), NCCL, CUDA-graph replay and a peer that never
# arrives (tests/test_gather_cuda.py); memcheck of both signals; bench_gather with each signal, so the flags
# protocol's cost over NVLink is measured against the atomic one in the same run.
# Success: every summary line PASS; gather-h200x2-atomic.json within noise of benchmarks/results/gather-h200x2.json
# (T=64 ~9.5-10.5 us), matches_nccl true in both result files.
source "$(dirname "$0")/device_env.sh"
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"
result() { echo "$*" | tee -a "$SUMMARY"; }
step build sm_90a
nvidia-smi topo -m | head -4
TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=32 timeout 240 python3 -m pip install -q --no-build-isolation --no-deps -e . \
  > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; result "FAIL build"; exit 1; }
python3 - <<'EOF' 2>&1 | tee "$OUT/links.txt"
import json
from eagle3_capture import native
for d in (0, 1):
    print(native.load().device_report(d))
EOF
step two-GPU gather tests
timeout 180 python3 -m pytest -m multigpu -q -p no:cacheprovider tests/test_gather_cuda.py > "$OUT/pytest_gather.log" 2>&1
rc=$?; line=$(tail -1 "$OUT/pytest_gather.log")
[ $rc = 0 ] && result "PASS gather tests: $line" || result "FAIL gather tests (rc=$rc): $line"
step memcheck gather, both signals
timeout 150 compute-sanitizer --tool memcheck --report-api-errors no --target-processes all --error-exitcode 3 \
  python3 -m pytest -m multigpu -q -x -p no:cacheprovider tests/test_gather_cuda.py -k "matches_reference and p2p" \
  > "$OUT/memcheck_gather.log" 2>&1
rc=$?; line=$(grep -E "ERROR SUMMARY" "$OUT/memcheck_gather.log" | sort | uniq -c | tr '\n' ' ')
[ $rc = 0 ] && result "PASS memcheck gather: $line" || result "FAIL memcheck gather (rc=$rc): $line"
for signal in atomic flags; do
  step bench gather, $signal signal
  timeout 150 python3 benchmarks/bench_gather.py --signal $signal --out "$OUT/gather-h200x2-$signal.json" \
    > "$OUT/bench_gather_$signal.log" 2>&1
  rc=$?; tail -8 "$OUT/bench_gather_$signal.log"
  [ $rc = 0 ] && result "PASS bench gather $signal" || result "FAIL bench gather $signal (rc=$rc)"
done
step done
cat "$SUMMARY"
