#!/usr/bin/env bash
# The CUDA checks on ONE GPU (an H200: kind nvidia-h200), about 8 minutes; every step time-boxed, most important first.
#   usage: bash scripts/gpu_check.sh [--help]      (from the repository root or anywhere)
# Logs under $OUT (default /tmp/e3out); $OUT/summary.txt has one line per step. The benchmarks are
# scripts/gpu_bench.sh; the two-GPU checks scripts/gpu_check_x2.sh.
# 1. build the extension for the GPU's arch (sm_90a on an H200); the device tuning in force into device_tuning.json
# 2. every single-GPU CUDA test with the device's own tuning (the p2p gather protocol on one GPU with pretend ranks
#    on streams, under CUDA graphs, after a timeout (report mode, and the trap in a subprocess) and with another
#    stream's kernels holding SMs; the device tuning against the table, the cluster -> split fallback, the fused
#    add + RMSNorm with more rows than SMs, a malformed override raising, the capture and draft fc suites, the draft
#    fc in its three hook forms inside graphs captured as SGLang does, an in-place fc_norm update between replays,
#    the decode workspace first needed in a capture, the plugin's CUDA hook calls). Not the `sglang` ones: no SGLang
#    here (tests/plugin/test_graphs_sglang_cuda.py runs where it imports).
# 3. compute-sanitizer memcheck and 4. racecheck over the gather protocol (sequential tests, timeouts, late blocks
#    behind a busy kernel: no kernel waits on a concurrent one, which the sanitizer would serialise), the draft fc
#    decode kernels incl. the fallback, the draft fc in graphs (decode sizes) and the fused add + RMSNorm
# 5. the capture and draft fc CUDA tests (graphs included) again with the RTX PRO 6000's reasoned constants forced by
#    the overrides (decode rows 16, cluster switch 6, fused block 448): the code paths sm_120 takes, on this GPU
# Success: exit status 0, every line of $OUT/summary.txt starts with PASS (a SKIP, out of time, is not a pass).
set -euo pipefail
source "$(dirname "$0")/device_env.sh"
no_arguments_but_help "$@"
start_run "${OUT:-/tmp/e3out}"
export CUDA_VISIBLE_DEVICES=0

build_extension
python3 -c "import json; from eagle3_capture import tuning; print(json.dumps(tuning.for_device(0), indent=1))" \
  > "$LOGS/device_tuning.json" 2>&1 || true
cat "$LOGS/device_tuning.json"

step CUDA tests with the device tuning
# The sanitizer hypothesis profile (25 examples a fuzz test) keeps the capture and draft fc suites inside the budget.
if have_time "cuda tests"; then
  rc=0
  E3_HYPOTHESIS_PROFILE=sanitizer E3_GATHER_GRAPH_STEPS=200 timeout "$(cap 230)" python3 -m pytest \
    -m "cuda and not multigpu and not sglang" -q \
    -p no:cacheprovider tests > "$LOGS/pytest_cuda.log" 2>&1 || rc=$?
  pytest_result "every single-GPU cuda test" "$LOGS/pytest_cuda.log" $rc
  grep -E "FAILED|Error" "$LOGS/pytest_cuda.log" | head -8 || true
fi

# compute-sanitizer TOOL over the gather protocol, draft fc and capture tests that -k selects, time-boxed to CAP s.
SAN_TESTS=(tests/test_gather_protocol_cuda.py tests/test_gather_graphs_cuda.py tests/test_draft_fc.py
           tests/test_graphs_draft_fc_cuda.py tests/test_capture.py)
sanitize() {  # tool cap k
  local tool=$1 limit=$2 k=$3 rc=0
  have_time "$tool" || return 0
  E3_HYPOTHESIS_PROFILE=sanitizer timeout "$(cap "$limit")" compute-sanitizer --tool "$tool" --report-api-errors no \
    --error-exitcode 3 python3 -m pytest -m cuda -q -p no:cacheprovider "${SAN_TESTS[@]}" -k "$k" \
    > "$LOGS/$tool.log" 2>&1 || rc=$?
  sanitizer_result "$tool" "$LOGS/$tool.log" $rc
}

step memcheck gather protocol, draft fc decode + fallback + graphs, fused add + RMSNorm
sanitize memcheck 100 \
  "sequential or times_out or malformed_slot or already_past or refusal or repeated or many_rows_at_h7168 \
   or blocks_starting or in_place_fc_norm or (graphs_like_sglang and tp8shard and decode)"

step racecheck the same kernels
# No kernel filter: these tests run no cuBLAS (draft fc at M <= 16 on the decode kernels), where racecheck crashes.
sanitize racecheck 120 "sequential or malformed_slot or refusal or (repeated and not 33) or many_rows_at_h7168 \
  or blocks_starting or (graphs_like_sglang and tp8shard and decode and split and plain)"

step CUDA tests with the RTX PRO 6000 constants forced
if have_time "cuda tests with sm_120 constants"; then
  rc=0
  EAGLE3_CAPTURE_DECODE_MAX_ROWS=16 EAGLE3_CAPTURE_CLUSTER_MIN_SPLITS=6 EAGLE3_CAPTURE_FUSED_NORM_THREADS=448 \
    E3_HYPOTHESIS_PROFILE=sanitizer timeout "$(cap 90)" python3 -m pytest -m "cuda and not multigpu" -q \
    -p no:cacheprovider tests/test_capture.py tests/test_draft_fc.py tests/test_graphs_draft_fc_cuda.py \
    -k "not malformed_tuning_override" \
    > "$LOGS/pytest_cuda_sm120_constants.log" 2>&1 || rc=$?
  pytest_result "cuda tests with sm_120 constants" "$LOGS/pytest_cuda_sm120_constants.log" $rc
fi

step done
summary_status FAIL SKIP
