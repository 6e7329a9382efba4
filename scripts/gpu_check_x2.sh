#!/usr/bin/env bash
# The CUDA checks that need TWO GPUs of one host (kind nvidia-h200-x2), about 8 minutes.
#   usage: bash scripts/gpu_check_x2.sh [--help]   (from the repository root or anywhere)
# Logs under $OUT (default /tmp/e3out); $OUT/summary.txt has one line per step. The gather's benchmark is
# scripts/gpu_bench.sh (its two-GPU part runs when the machine has two GPUs).
# 1. build the extension for the GPUs' arch; each device's peer links into links.txt
# 2. the p2p gather between two processes on two GPUs with each arrival signal (atomic: what NVLink pairs get;
#    flags: the protocol for links without native peer atomics, forced on), NCCL, CUDA-graph replay and a peer that
#    never arrives (the kernel traps, GatherTimeout names the peer), thousands of graph replays of the draft's column
#    gather (batch sizes 1..16 x 4 rows, interleaved with eager gathers, a 1024-block grid keeping SMs busy) each
#    against NCCL's all_gather, a rank sleeping past timeout_s while replays go on (loud on every rank, never wrong
#    rows), the p2p probe failing on one rank (tests/test_gather_cuda.py)
# 3. the gather's argument agreement in front of NCCL and p2p gatherers (tests/test_gather_agreement.py, multigpu)
# 4. compute-sanitizer memcheck of the p2p gather, both signals, every rank's process
# Success: exit status 0, every line of $OUT/summary.txt starts with PASS.
set -euo pipefail
source "$(dirname "$0")/device_env.sh"
no_arguments_but_help "$@"
start_run "${OUT:-/tmp/e3out}"

build_extension
nvidia-smi topo -m | head -4 || true
python3 - <<'EOF' 2>&1 | tee "$LOGS/links.txt" || true
from eagle3_capture import native
for d in (0, 1):
    print(native.load().device_report(d))
EOF

step two-GPU gather tests
if have_time "gather tests"; then
  rc=0
  timeout "$(cap 260)" python3 -m pytest -m multigpu -q -p no:cacheprovider tests/test_gather_cuda.py \
    > "$LOGS/pytest_gather.log" 2>&1 || rc=$?
  pytest_result "gather tests" "$LOGS/pytest_gather.log" $rc
  grep -E "FAILED|Error" "$LOGS/pytest_gather.log" | head -8 || true
fi

step two-GPU gather agreement, NCCL and p2p
if have_time "gather agreement"; then
  rc=0
  timeout "$(cap 120)" python3 -m pytest -m multigpu -q -p no:cacheprovider tests/test_gather_agreement.py \
    > "$LOGS/pytest_gather_agreement.log" 2>&1 || rc=$?
  pytest_result "gather agreement" "$LOGS/pytest_gather_agreement.log" $rc
fi

step memcheck gather and graph replays, both signals
if have_time "memcheck gather"; then
  rc=0
  E3_GATHER_STRESS_STEPS=100 timeout "$(cap 120)" compute-sanitizer --tool memcheck --report-api-errors no --target-processes all \
    --error-exitcode 3 python3 -m pytest -m multigpu -q -x -p no:cacheprovider tests/test_gather_cuda.py \
    -k "(matches_reference and p2p) or thousands" > "$LOGS/memcheck_gather.log" 2>&1 || rc=$?
  sanitizer_result "memcheck gather" "$LOGS/memcheck_gather.log" $rc
fi

step done
summary_status FAIL SKIP
