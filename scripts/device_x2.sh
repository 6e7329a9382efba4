#!/usr/bin/env bash
# One call on kind nvidia-h200-x2: build for sm_90a; the single-GPU CUDA tests and draft fc benchmark on GPU 0
# (with a native backtrace of any crash); the two-GPU gather tests, memcheck of the gather and its benchmark.
source "$(dirname "$0")/device_env.sh"
step build
nvidia-smi topo -m | head -4
TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=32 python3 -m pip install -q --no-build-isolation --no-deps -e . \
  > "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
(cmake -S . -B build/bench -DE3_CUDA_ARCHS=90a && cmake --build build/bench -j 32) > "$OUT/cmake.log" 2>&1 &
step pytest single-GPU
CUDA_VISIBLE_DEVICES=0 python3 -m pytest -m "cuda and not multigpu" -q tests/test_capture.py tests/test_draft_fc.py \
  --deselect tests/test_draft_fc.py::test_cuda_rejects_misaligned_rows_and_mixed_devices 2>&1 | tail -6
step crash backtrace
CUDA_VISIBLE_DEVICES=0 timeout 150 cuda-gdb -q -batch -ex "set pagination off" -ex run -ex bt --args python3 -m pytest \
  -m cuda -q -p no:faulthandler tests/test_draft_fc.py -k misaligned > "$OUT/gdb.log" 2>&1
grep -E "^#[0-9]+ |SIGSEGV|passed|failed" "$OUT/gdb.log" | cut -c1-200 | head -24
step sanitizers draft fc
CUDA_VISIBLE_DEVICES=0 E3_HYPOTHESIS_PROFILE=sanitizer compute-sanitizer --tool memcheck --error-exitcode 3 python3 -m pytest \
  -m cuda -q -x tests/test_draft_fc.py --deselect tests/test_draft_fc.py::test_cuda_rejects_misaligned_rows_and_mixed_devices \
  > "$OUT/memcheck_fc.log" 2>&1; echo "memcheck rc=$?"; grep -E "ERROR SUMMARY|passed|failed" "$OUT/memcheck_fc.log" | tail -2
CUDA_VISIBLE_DEVICES=0 E3_HYPOTHESIS_PROFILE=sanitizer compute-sanitizer --tool racecheck --kernel-name kns=draft_fc --error-exitcode 3 \
  python3 -m pytest -m cuda -q -x tests/test_draft_fc.py -k "repeated or agree" > "$OUT/racecheck_fc.log" 2>&1
echo "racecheck rc=$?"; grep -E "RACECHECK SUMMARY|passed|failed|Error" "$OUT/racecheck_fc.log" | cut -c1-200 | head -4
step pytest two-GPU gather
python3 -m pytest -m multigpu -q tests/test_gather_cuda.py 2>&1 | tail -25
step memcheck gather
compute-sanitizer --tool memcheck --target-processes all --error-exitcode 3 python3 -m pytest -m multigpu -q -x \
  tests/test_gather_cuda.py -k "p2p" > "$OUT/memcheck_gather.log" 2>&1; echo "memcheck gather rc=$?"
grep -E "ERROR SUMMARY|passed|failed" "$OUT/memcheck_gather.log" | tail -3
step bench gather
python3 benchmarks/bench_gather.py --out "$OUT/gather-h200x2.json" 2>&1 | tail -14
step bench draft fc
wait
CUDA_VISIBLE_DEVICES=0 python3 benchmarks/bench_draft_fc.py --out "$OUT/draft_fc-h200.json" 2>&1 | tail -15
for n in 896 7168; do for m in 1 8 64; do for b in 2 4; do
  CUDA_VISIBLE_DEVICES=0 ./build/bench/bench_draft_fc --M $m --N $n --blocks-per-sm $b | tail -1; done; done; done
step done
