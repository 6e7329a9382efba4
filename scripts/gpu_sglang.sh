#!/usr/bin/env bash
# SGLang's real serving loop on ONE GPU (an H100 or H200), CUDA graphs on against off, ~5 minutes; SGLANG=0.5.23
# (default), 0.5.12 (the seed's release: +1 on every id, torch pin 2.11) or 0.5.20 (a packer release).
#   usage: bash scripts/gpu_sglang.sh [--help]      (from the repository root or anywhere)
# Needs SGLang and its light deps as wheels in $WHEELS (default .whl in the repository root): run
# `SGLANG=X bash scripts/fetch_device_wheels.sh` where pip works and name .whl in the device call's carry (0.5.23:
# 55.1 MiB, 0.5.12: 37.9 MiB, 0.5.20: 57.8 MiB); the wheels installed must be release $SGLANG, or the run stops.
# Stock's draft ids are written in the installed release's own convention (scripts/gpu_sglang/server_flags.py
# id_rule): on 0.5.12 (+1 on every id) the demo draft's embedding tap is id -1, which stock cannot capture (it
# raises at the first forward, residual None at layer input 0) while the plugin does.
# sglang-kernel cannot travel: scripts/gpu_sglang/standins stands in for sgl_kernel, flash_mla, cutlass and IPython
# (torch versions of what the tested path calls, an error naming any other name that gets called).
# 1. install the wheels into /tmp/e3site (cleared first); in the background: build the extension for the GPU's arch
#    (pip install -e .), write the demo pair (scripts/gpu_sglang/make_pair.py: doctor demo --fast, on CUDA with a
#    CPU fallback, plus the target's greedy continuations and the expected-acceptance profile from doctor accept),
#    build SGLang's JIT kernels on the path (tvm-ffi + nvcc, scripts/gpu_sglang/jit_warmup.py) and test the
#    stand-ins on this GPU (CUDA graphs too)
# 2. scripts/gpu_sglang/compare.py: five sglang.Engine servers, started side by side and timed one at a time: the
#    plugin with --disable-cuda-graph and with CUDA graphs on, stock SGLang (plugin off, the draft's ids in stock's
#    convention) likewise, and the plugin with CUDA graphs and SGLang's metrics on (--enable-metrics, the profile);
#    the graph-on servers' timed rounds interleaved (ROUNDS each, the order rotated every round); one deadline
# $OUT/gpu_sglang.json: machine, torch, command, per server the timings, errors and log checks, the comparisons
# (greedy outputs, per-request verify counts and histograms, graphs on vs off, plugin vs stock, vs the target's
# own greedy continuation), the plugin's startup / self-test lines, what the capture dump holds, tokens/s per timed
# round (median, min/max) and plugin_graphs / stock_graphs, plugin_metrics / stock_graphs per round pair, what the
# plugin's metrics counted against the responses and the profile.
# $OUT/summary.txt: one PASS / FAIL / SKIP / INFO line per check (INFO: a difference stock SGLang shows too);
# $OUT/logs.tar.gz: every log, response and dump (scripts/gpu_sglang/compare.py --rejudge re-reads them).
# Success: exit status 0, no summary line starts with FAIL or SKIP. Environment: OUT (default /tmp/e3out), BUDGET_S
# (default 460), ROUNDS (default 5: timed rounds of each graph-on server; fewer run when time runs short, and the
# summary says how many), SGLANG (0.5.23), WHEELS, TORCHDYNAMO_DISABLE (passed to the servers; unset: SGLang's
# torch.compile runs).
set -euo pipefail
source "$(dirname "$0")/device_env.sh"
no_arguments_but_help "$@"
BUDGET_S=${BUDGET_S:-460}
ROUNDS=${ROUNDS:-5}
start_run "${OUT:-/tmp/e3out}"
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
WHEELS=${WHEELS:-.whl}
WORK=/tmp/e3sgl
rm -rf "$WORK"
mkdir -p "$WORK"
# Everything but the result and the summary goes into one archive under $OUT (the machine returns 8 files at most).
pack() { cp "$LOGS/gpu_sglang.json" "$WORK/" 2>/dev/null || true; tar -C /tmp -czf "$LOGS/logs.tar.gz" e3sgl 2>/dev/null || true; }
trap pack EXIT

SGLANG=${SGLANG:-0.5.23}
install_wheels "$WHEELS" "$WORK/wheels.log"
export PYTHONPATH=/tmp/e3site${PYTHONPATH:+:$PYTHONPATH}
# beside the import-only flashinfer / deep_gemm stand-ins, in every process here (the JIT warm-up too), as the
# servers get them from compare.py's CUDA_ENV
export SGLANG_IS_FLASHINFER_AVAILABLE=false SGLANG_ENABLE_JIT_DEEPGEMM=false
got=$(python3 -c 'from importlib import metadata; print(metadata.version("sglang"))')
if [ "$got" != "$SGLANG" ]; then
  result "FAIL wheels: SGLang $got installed, SGLANG=$SGLANG asked (SGLANG=$SGLANG bash scripts/fetch_device_wheels.sh, carry .whl)"
  exit 1
fi
rule=$(PYTHONPATH=$PWD/scripts/gpu_sglang/standins:$PYTHONPATH SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK=1 \
  python3 -c 'import json, sys; sys.path.insert(0, "scripts/gpu_sglang"); import server_flags; print(server_flags.id_rule())' \
  2> "$WORK/id_rule.log") || { tail -5 "$WORK/id_rule.log"; result "FAIL reading SGLang $got's id rule"; exit 1; }
result "PASS SGLang $got installed (draft ids: $rule)"
# SGLang's JIT kernels link -lcudart from $CUDA_HOME/lib64 (CUDA_HOME from nvcc's folder when unset, which a
# wrapper script in /usr/local/bin would get wrong).
if [ -z "${CUDA_HOME:-}" ] && [ -x /usr/local/cuda/bin/nvcc ]; then export CUDA_HOME=/usr/local/cuda; fi
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)"

step build, demo pair, SGLang JIT kernels and stand-in tests, side by side
cc=$(gpu_cc)
arch="${cc%?}.${cc: -1}a"
(TORCH_CUDA_ARCH_LIST="$arch" MAX_JOBS="$(nproc)" timeout "$(cap 240)" \
  python3 -m pip install -q --no-build-isolation --no-deps -e . > "$WORK/build.log" 2>&1) &
build_pid=$!
(timeout "$(cap 200)" python3 scripts/gpu_sglang/make_pair.py --out "$WORK/pair" --id-rule "$rule" > "$WORK/pair.log" 2>&1) &
pair_pid=$!
(E3_HYPOTHESIS_PROFILE=sanitizer timeout "$(cap 150)" python3 -m pytest -q -p no:cacheprovider \
  tests/gpu_programs/test_native.py > "$WORK/standin_tests.log" 2>&1) &
tests_pid=$!
(timeout "$(cap 200)" python3 scripts/gpu_sglang/jit_warmup.py > "$WORK/jit_warmup.log" 2>&1) &
jit_pid=$!
rc=0; wait "$build_pid" || rc=$?
if [ $rc = 0 ]; then result "PASS build (TORCH_CUDA_ARCH_LIST=$arch)"
else tail -30 "$WORK/build.log"; result "FAIL build (rc=$rc): the plugin's capture and fc hooks will be off"; fi
rc=0; wait "$pair_pid" || rc=$?
if [ $rc = 0 ]; then result "PASS demo pair ($(tail -1 "$WORK/pair.log"))"
else tail -30 "$WORK/pair.log"; result "FAIL demo pair (rc=$rc)"; exit 1; fi
rc=0; wait "$tests_pid" || rc=$?
pytest_result "stand-in tests on this GPU (tests/gpu_programs/test_native.py)" "$WORK/standin_tests.log" $rc
rc=0; wait "$jit_pid" || rc=$?
if [ $rc = 0 ]; then result "PASS SGLang JIT kernels build here ($(grep -c "'ok': True" "$WORK/jit_warmup.log") of the path's)"
else grep "jit_warmup:" "$WORK/jit_warmup.log" | cut -c1-300 || tail -20 "$WORK/jit_warmup.log"
  result "FAIL SGLang JIT kernels (rc=$rc; the servers compile what they need themselves)"; fi

step SGLang serving: graphs off, graphs on, plugin, stock, plugin with metrics, interleaved timed rounds
left=$(( DEADLINE - $(date +%s) - 20 ))
rc=0
python3 scripts/gpu_sglang/compare.py --pair "$WORK/pair" --out "$WORK/compare" --budget-s "$left" --rounds "$ROUNDS" \
  --result "$LOGS/gpu_sglang.json" --command "SGLANG=$SGLANG bash scripts/gpu_sglang.sh" 2>&1 | tee "$WORK/compare.out" || rc=$?
if [ -f "$LOGS/gpu_sglang.json" ]; then
  python3 scripts/gpu_sglang/report.py "$LOGS/gpu_sglang.json" >> "$SUMMARY"
else
  result "FAIL compare (rc=$rc): no result JSON"
fi

step done
summary_status FAIL SKIP
