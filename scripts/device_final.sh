#!/usr/bin/env bash
# Last call of the session on nvidia-h200-x2, in priority order, each step time-boxed: gather tests (2 GPUs),
# the draft fc error path that crashed, the gather benchmark, the draft fc benchmark, memcheck of the gather.
source "$(dirname "$0")/device_env.sh"
step build
TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=32 python3 -m pip install -q --no-build-isolation --no-deps -e . \
  > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
step gather tests
timeout 100 python3 -m pytest -m multigpu -q -x tests/test_gather_cuda.py 2>&1 | tee "$OUT/pytest_gather.log" | tail -12
step draft fc error paths
CUDA_VISIBLE_DEVICES=0 timeout 60 python3 -m pytest -m cuda -q tests/test_draft_fc.py -k "misaligned or capture_without" 2>&1 | tail -3
step bench gather
timeout 150 python3 benchmarks/bench_gather.py --samples 20 --out "$OUT/gather-h200x2.json" 2>&1 | tail -9
step bench draft fc
CUDA_VISIBLE_DEVICES=0 timeout 100 python3 benchmarks/bench_draft_fc.py --samples 15 --out "$OUT/draft_fc-h200.json" 2>&1 | tail -15
step memcheck gather
timeout 80 compute-sanitizer --tool memcheck --report-api-errors no --target-processes all --error-exitcode 3 \
  python3 -m pytest -m multigpu -q -x tests/test_gather_cuda.py -k "matches_reference and p2p" > "$OUT/memcheck_gather.log" 2>&1
echo "memcheck gather rc=$?"; grep -E "ERROR SUMMARY|passed|failed" "$OUT/memcheck_gather.log" | tail -3
step done
