#!/usr/bin/env bash
# Third round on nvidia-h200-x2, each step time-boxed, logs under $OUT: build; the gather tests (new arrival
# protocol) and the gather benchmark; the draft fc CUDA tests; a bench_draft_fc sweep of the register kernel's
# weight-load flavours, K-splits and step-aligned k blocks; memcheck of the gather.
source "$(dirname "$0")/device_env.sh"
step build
TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=32 python3 -m pip install -q --no-build-isolation --no-deps -e . \
  > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
(cmake -S . -B build/bench -DE3_CUDA_ARCHS=90a && cmake --build build/bench -j 32) > "$OUT/cmake.log" 2>&1 &
step gather tests two GPUs
timeout 120 python3 -m pytest -m multigpu -q tests/test_gather_cuda.py 2>&1 | tee "$OUT/pytest_gather.log" | tail -4
step bench gather
timeout 150 python3 benchmarks/bench_gather.py --samples 20 --sweep-blocks 64,132 --out "$OUT/gather-h200x2.json" \
  2>&1 | tee "$OUT/bench_gather.log" | tail -8
step draft fc tests one GPU
CUDA_VISIBLE_DEVICES=0 timeout 200 python3 -m pytest -m "cuda and not multigpu" -q tests/test_draft_fc.py 2>&1 \
  | tee "$OUT/pytest_fc.log" | tail -3
wait
step bench_draft_fc sweep
export CUDA_VISIBLE_DEVICES=0
{
for n in 896 7168; do for m in 1 8; do for a in 0 1; do for l in 0 1 2; do
  ./build/bench/bench_draft_fc --M $m --N $n --load $l --align $a --samples 9 | tail -1
done; done; done; done
for s in 2 4 11; do for l in 0 1; do ./build/bench/bench_draft_fc --M 1 --N 7168 --splits $s --load $l --samples 9 | tail -1; done; done
for s in 6 9 16; do for l in 0 1; do ./build/bench/bench_draft_fc --M 1 --N 896 --splits $s --load $l --samples 9 | tail -1; done; done
} 2>&1 | tee "$OUT/bench_fc_sweep.log" | grep -v "^check"
unset CUDA_VISIBLE_DEVICES
step memcheck gather
timeout 100 compute-sanitizer --tool memcheck --report-api-errors no --target-processes all --error-exitcode 3 \
  python3 -m pytest -m multigpu -q -x tests/test_gather_cuda.py -k "matches_reference and p2p" > "$OUT/memcheck_gather.log" 2>&1
echo "memcheck gather rc=$?"; grep -E "ERROR SUMMARY|passed|failed" "$OUT/memcheck_gather.log" | tail -3
step done
