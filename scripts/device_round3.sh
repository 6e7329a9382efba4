#!/usr/bin/env bash
# Third round on nvidia-h200-x2, each step time-boxed in priority order, logs under $OUT: build; the CUDA tests on
# one GPU (capture, draft fc, the SGLang hooks' op calls), memcheck and racecheck of the draft fc, the draft fc
# benchmark (both op paths) and a bench_draft_fc confirmation; the gather tests, memcheck of the p2p gather and the
# gather benchmark; initcheck of the decode kernel without a kernel filter (the filtered run had reported reads of
# memory that uninstrumented torch kernels wrote). One GPU: the gather steps are skipped. (Run 4 of the round also swept
# the wide register kernel of commit f349617, since dropped.)
source "$(dirname "$0")/device_env.sh"
step build
TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=32 python3 -m pip install -q --no-build-isolation --no-deps -e . \
  > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
(cmake -S . -B build/bench -DE3_CUDA_ARCHS=90a && cmake --build build/bench -j 32) > "$OUT/cmake.log" 2>&1 &
export CUDA_VISIBLE_DEVICES=0
step draft fc tests one GPU
timeout 200 python3 -m pytest -m "cuda and not multigpu" -q tests/test_capture.py tests/test_draft_fc.py \
  tests/sglang/test_hook_calls_cuda.py 2>&1 | tee "$OUT/pytest_cuda.log" | tail -3
step memcheck draft fc
E3_HYPOTHESIS_PROFILE=sanitizer timeout 200 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 3 \
  python3 -m pytest -m cuda -q -x tests/test_draft_fc.py \
  --deselect tests/test_draft_fc.py::test_cuda_rejects_misaligned_rows_and_mixed_devices > "$OUT/memcheck_fc.log" 2>&1
echo "memcheck fc rc=$?"; grep -E "ERROR SUMMARY|passed|failed" "$OUT/memcheck_fc.log" | tail -2
step bench draft fc
timeout 150 python3 benchmarks/bench_draft_fc.py --samples 15 --M 1,4,8,16,32,64,512,4096 --compare-paths \
  --out "$OUT/draft_fc-h200.json" --plot "$OUT/draft_fc-h200.png" 2>&1 | tee "$OUT/bench_fc.log" | grep -E "M=|streaming|\|"
wait
step bench_draft_fc binary
for n in 896 7168; do for m in 1 8; do ./build/bench/bench_draft_fc --M $m --N $n --samples 9 | tail -1; done; done
step racecheck draft fc decode path
E3_HYPOTHESIS_PROFILE=sanitizer timeout 90 compute-sanitizer --tool racecheck --report-api-errors no \
  --kernel-name kns=draft_fc --error-exitcode 3 python3 -m pytest -m cuda -q tests/test_draft_fc.py \
  -k "(repeated and not 33) or producers or every_decode" > "$OUT/racecheck_fc.log" 2>&1
echo "racecheck rc=$?"; grep -E "RACECHECK SUMMARY|passed|failed" "$OUT/racecheck_fc.log" | tail -2
unset CUDA_VISIBLE_DEVICES
if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
gather_checks
step bench gather
timeout 150 python3 benchmarks/bench_gather.py --samples 30 --sweep-blocks 64,132 --out "$OUT/gather-h200x2.json" \
  2>&1 | tee "$OUT/bench_gather.log" | tail -6
fi
step initcheck draft fc decode, no kernel filter
timeout 120 compute-sanitizer --tool initcheck --report-api-errors no --error-exitcode 3 \
  python3 -m pytest -m cuda -q -x tests/test_draft_fc.py -k "producers and not True" > "$OUT/initcheck_fc.log" 2>&1
echo "initcheck rc=$?"; grep -E "ERROR SUMMARY|passed|failed|Uninitialized" "$OUT/initcheck_fc.log" | sort | uniq -c | head -8
step done
