#!/usr/bin/env bash
# Draft fc performance iteration on one GPU, each step time-boxed, logs under $OUT: build; the draft fc CUDA tests
# (both decode kernels); memcheck of the TMA kernel in the bench binary on odd shapes; bench_draft_fc binary
# sweep (TMA stages vs the register-streaming kernel); the Python draft fc benchmark with both op paths.
source "$(dirname "$0")/device_env.sh"
export CUDA_VISIBLE_DEVICES=0
step build
TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=32 python3 -m pip install -q --no-build-isolation --no-deps -e . \
  > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
(cmake -S . -B build/bench -DE3_CUDA_ARCHS=90a && cmake --build build/bench -j 32) > "$OUT/cmake.log" 2>&1 &
step draft fc tests
timeout 150 python3 -m pytest -m cuda -q -x tests/test_draft_fc.py 2>&1 | tee "$OUT/pytest_fc.log" | tail -4
wait
step memcheck bulk kernel, odd shapes
for args in "--bulk 1 --M 3 --N 130 --H 1000 --K 2" "--bulk 1 --M 8 --N 64 --H 8 --K 1" \
    "--bulk 1 --M 1 --N 1 --H 136 --K 3 --norm 0" "--bulk 1 --M 5 --N 1000 --H 7168 --K 3" "--M 5 --N 1000 --H 7168 --K 3"; do
  timeout 60 compute-sanitizer --tool memcheck --error-exitcode 3 ./build/bench/bench_draft_fc $args --iters 2 \
    --samples 1 > "$OUT/memcheck_bulk.log" 2>&1; echo "memcheck [$args] rc=$?"; grep -E "ERROR SUMMARY|check" "$OUT/memcheck_bulk.log"
done
step bench_draft_fc binary sweep
{
for n in 896 7168; do for m in 1 4 8; do
  for b in 4 3; do ./build/bench/bench_draft_fc --M $m --N $n --blocks-per-sm $b --samples 9 | tail -1; done
  for st in 2 3; do ./build/bench/bench_draft_fc --M $m --N $n --bulk 1 --stages $st --samples 9 | tail -1; done
done; done
} 2>&1 | tee "$OUT/bench_fc_bin.log" | grep -v "^check" | head -40
step bench draft fc python
timeout 150 python3 benchmarks/bench_draft_fc.py --samples 11 --M 1,4,8,16 --compare-paths --out "$OUT/draft_fc-h200.json" \
  2>&1 | tee "$OUT/bench_fc.log" | grep -E "M=|streaming"
step done
