#!/usr/bin/env bash
# The final single-GPU check of this session on one H200 (kernels unchanged since 78a3583; the wide-kernel
# experiments of benchmarks/NOTES.md's sixth round are reverted): build; every single-GPU CUDA test, including the
# cluster kernel's first launch inside a CUDA-graph capture; that test under compute-sanitizer memcheck; the prefill
# forms probe (benchmarks/probe_prefill_forms.py).
source "$(dirname "$0")/device_env.sh"
build_fc
step prefill forms probe
timeout 150 python3 benchmarks/probe_prefill_forms.py --out "$OUT/draft_fc-prefill-forms-h200.json" 2>&1 | tail -6
step single-GPU CUDA tests
timeout 300 python3 -m pytest -m "cuda and not multigpu" -q tests 2>&1 | tee "$OUT/pytest_cuda_all.log" \
  | grep -E "FAILED|passed|failed|rror" | tail -8
step memcheck: the cluster kernel first launched inside a capture
timeout 120 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 3 \
  python3 -m pytest -q tests/test_draft_fc.py -k "first_launch_inside_capture" > "$OUT/memcheck_capture.log" 2>&1
echo "memcheck rc=$?"; grep -E "ERROR SUMMARY|passed|failed" "$OUT/memcheck_capture.log" | tail -2
step done
