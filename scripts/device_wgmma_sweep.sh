source scripts/device_env.sh
(cmake -S . -B build/bench -DE3_CUDA_ARCHS=90a && cmake --build build/bench -j 16 --target bench_draft_fc) > $OUT/cmake.log 2>&1 || { tail -20 $OUT/cmake.log; exit 1; }
for n in 896 7168; do
  for v in 0 1 2 3; do for m in 1 16 32 64; do
    echo -n "v$v "; ./build/bench/bench_draft_fc --M $m --N $n --kernel wgmma --variant $v --samples 7 | grep -E "^wgmma|TOO|check" | tr '\n' ' '; echo
  done; done
  ./build/bench/bench_draft_fc --M 8 --N $n --kernel auto --probe 1 --samples 7 | tail -2
done 2>&1 | tee $OUT/sweep.log
