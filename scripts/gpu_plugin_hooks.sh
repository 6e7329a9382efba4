#!/usr/bin/env bash
# What the SGLang plugin's hooks cost per forward on the serving thread, on ONE GPU (kind nvidia-h200, about 5
# minutes): benchmarks/bench_plugin_hooks.py --device cuda -- SGLang 0.5.23's real tiny DeepseekV3 target and EAGLE-3
# drafts on CUDA, float32, the plugin's hooks against stock SGLang interleaved forward by forward, each hook's own
# time inside the forwards, and single hooks; every timing synchronizes the GPU around the call.
#   usage: bash scripts/gpu_plugin_hooks.sh [--help]      (from the repository root or anywhere)
# Needs SGLang and its light deps as wheels in $WHEELS (default .whl in the repository root): run
# `bash scripts/fetch_device_wheels.sh` where pip works and name .whl in the device call's carry (about 58 MB).
# sglang-kernel is stood in by scripts/gpu_sglang/standins, as in scripts/gpu_sglang.sh.
# 1. install the wheels into /tmp/e3site (cleared first); build the extension for the GPU's arch and, beside it,
#    SGLang's JIT kernels on the path (scripts/gpu_sglang/jit_warmup.py)
# 2. the benchmark -> $OUT/plugin_hooks-cuda.json (machine, torch, command, every row), its printout in
#    $OUT/plugin_hooks-cuda.txt; a section that cannot run on this machine is reported in the JSON ("errors") and
#    the others still run
# Environment: OUT (default /tmp/e3out), WHEELS, BUDGET_S (default 500), BASELINE (a directory holding another
# copy of the package, e.g. `git archive main python | tar -x -C base` then BASELINE=base/python, carried with the
# call: its hooks are timed beside the current ones, bench_plugin_hooks.py --baseline), BENCH_ARGS (more arguments).
# Success: exit status 0 and no summary line starting with FAIL.
set -euo pipefail
source "$(dirname "$0")/device_env.sh"
no_arguments_but_help "$@"
BUDGET_S=${BUDGET_S:-500}
start_run "${OUT:-/tmp/e3out}"
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
WHEELS=${WHEELS:-.whl}
WORK=/tmp/e3hooks
rm -rf "$WORK"
mkdir -p "$WORK"

install_wheels "$WHEELS" "$WORK/wheels.log"
# SGLang and the stand-ins for its compiled packages; the kernel version check off (stand-ins)
export PYTHONPATH=/tmp/e3site:$PWD/scripts/gpu_sglang/standins${PYTHONPATH:+:$PYTHONPATH}
export SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK=1
# flashinfer and deep_gemm are import-only stand-ins there: SGLang must not take them for the real packages
# (scripts/gpu_sglang/compare.py CUDA_ENV says why)
export SGLANG_IS_FLASHINFER_AVAILABLE=false SGLANG_ENABLE_JIT_DEEPGEMM=false
if [ -z "${CUDA_HOME:-}" ] && [ -x /usr/local/cuda/bin/nvcc ]; then export CUDA_HOME=/usr/local/cuda; fi

(timeout "$(cap 200)" python3 scripts/gpu_sglang/jit_warmup.py > "$WORK/jit_warmup.log" 2>&1) &
jit_pid=$!
build_extension
rc=0; wait "$jit_pid" || rc=$?
if [ $rc = 0 ]; then result "PASS SGLang JIT kernels build here"
else tail -5 "$WORK/jit_warmup.log"; result "INFO SGLang JIT kernels: jit_warmup rc=$rc (the benchmark compiles what it needs)"; fi

step benchmark
have_time benchmark || exit 1
args=(--device cuda --json "$LOGS/plugin_hooks-cuda.json")
if [ -n "${BASELINE:-}" ]; then args+=(--baseline "$BASELINE"); fi
# shellcheck disable=SC2206
args+=(${BENCH_ARGS:-})
rc=0
timeout "$(cap 600)" python3 benchmarks/bench_plugin_hooks.py "${args[@]}" > "$LOGS/plugin_hooks-cuda.txt" 2>&1 || rc=$?
grep -v -i "warn" "$LOGS/plugin_hooks-cuda.txt" | tail -80 || true
if [ $rc = 0 ]; then result "PASS bench_plugin_hooks --device cuda ($LOGS/plugin_hooks-cuda.json)"
else result "FAIL bench_plugin_hooks --device cuda (rc=$rc; sections that failed are in the JSON's errors and the txt)"; fi

step done
summary_status FAIL
