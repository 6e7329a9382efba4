#!/usr/bin/env bash
# At Kimi-K2.5's width on ONE H200 (kind nvidia-h200): SGLang 0.5.23's real serving loop (sglang.Engine and
# launch_server) with a 61-layer, 7168-wide MLA target in bf16 (SGLang's dummy weights, reshaped at load so that its
# layers differ: scripts/gpu_sglang/kimi_shape.py), one phase per device call, each under the 10-minute call:
#   usage: PHASE=llama|mla|eager|dump|accept|miswired bash scripts/gpu_sglang_kimi.sh [--help]
#   llama   plugin against stock, Llama EAGLE-3 draft (draft vocab 32000, a d2t map), CUDA graphs on, ROUNDS
#           interleaved timed rounds at batch 1 and 16 (scripts/gpu_sglang/kimi_compare.py)
#   mla     the same with the MLA draft (Eagle3DeepseekV2ForCausalLM, kimi-k2.5-eagle3-mla)
#   eager   the llama phase with --disable-cuda-graph
#   dump    the plugin with its capture dump on (declared taps, the doctor's requests' full stream) against off
#   accept  a Llama draft trained on the server's own dump, then doctor online against a server serving it:
#           predicted = served (scripts/gpu_sglang/kimi_accept.py)
#   miswired  a server serving the draft's taps one layer later: doctor online exits 1 and names each slot
# Needs SGLang and its light deps as wheels in $WHEELS (default .whl; scripts/fetch_device_wheels.sh, carried).
# Each phase: install the wheels into /tmp/e3site, build the extension for the GPU (kept between calls on a warm
# machine), install the test-only SGLang plugin (tests/sglang_cpu_plugin: only its reshape hook acts on a GPU), run.
# $OUT/kimi_<phase>.json (machine, torch, command, figures, the stock or dump-off baseline of the same run),
# $OUT/summary.txt (PASS / FAIL lines), $OUT/logs.tar.gz (server logs and the runs' files, weights left out).
# The target has EXPERTS routed experts (default 4: 44 GB in bf16, so two servers fit side by side and their timed
# rounds alternate; top-2 either way). Environment: OUT (default /tmp/e3out), BUDGET_S (default 560), PHASE,
# ROUNDS (3), EXPERTS (4), GAIN (0.3: kimi_shape's projection gain), WHEELS.
set -euo pipefail
source "$(dirname "$0")/device_env.sh"
no_arguments_but_help "$@"
PHASE=${PHASE:-}
case "$PHASE" in llama|mla|eager|dump|accept|miswired) ;; *)
  echo "gpu_sglang_kimi.sh: PHASE must be one of llama, mla, eager, dump, accept, miswired; got '${PHASE}'" >&2
  exit 2 ;; esac
BUDGET_S=${BUDGET_S:-560}
ROUNDS=${ROUNDS:-3}
EXPERTS=${EXPERTS:-4}
GAIN=${GAIN:-0.3}
start_run "${OUT:-/tmp/e3out}"
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
WHEELS=${WHEELS:-.whl}
WORK=/tmp/e3kimi
rm -rf "$WORK"
mkdir -p "$WORK"
# the servers' logs and the result JSONs, never the weights (the drafts are GBs)
pack() { tar -C /tmp -czf "$LOGS/logs.tar.gz" --exclude='*.safetensors' e3kimi 2>/dev/null || true; }
trap pack EXIT

install_wheels "$WHEELS" "$WORK/wheels.log"
export PYTHONPATH=/tmp/e3site${PYTHONPATH:+:$PYTHONPATH}
if [ -z "${CUDA_HOME:-}" ] && [ -x /usr/local/cuda/bin/nvcc ]; then export CUDA_HOME=/usr/local/cuda; fi
build_extension
step test plugin
if python3 -m pip install -q --no-build-isolation --no-deps -e tests/sglang_cpu_plugin > "$WORK/test_plugin.log" 2>&1
then result "PASS test-only SGLang plugin installed (the target's reshape at load)"
else tail -20 "$WORK/test_plugin.log"; result "FAIL test-only SGLang plugin"; exit 1; fi
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv,noheader | tee "$LOGS/gpu_memory_before.txt"

step "phase $PHASE"
left=$(( DEADLINE - $(date +%s) - 25 ))
cmd="PHASE=$PHASE bash scripts/gpu_sglang_kimi.sh"
common=(--out "$WORK/$PHASE" --experts "$EXPERTS" --gain "$GAIN" --budget-s "$left" --result "$LOGS/kimi_$PHASE.json"
        --command "$cmd")
rc=0
case "$PHASE" in
  llama|mla) python3 scripts/gpu_sglang/kimi_compare.py "${common[@]}" --draft "$PHASE" --rounds "$ROUNDS" || rc=$? ;;
  eager) python3 scripts/gpu_sglang/kimi_compare.py "${common[@]}" --draft llama --rounds "$ROUNDS" --cuda-graph off \
           || rc=$? ;;
  dump) python3 scripts/gpu_sglang/kimi_compare.py "${common[@]}" --draft llama --rounds "$ROUNDS" --against dump \
          || rc=$? ;;
  accept) python3 scripts/gpu_sglang/kimi_accept.py "${common[@]}" || rc=$? ;;
  miswired) python3 scripts/gpu_sglang/kimi_accept.py "${common[@]}" --miswired || rc=$? ;;
esac
if [ -f "$LOGS/kimi_$PHASE.json" ]; then
  python3 - "$LOGS/kimi_$PHASE.json" "$rc" <<'EOF' | tee -a "$SUMMARY"
import json, sys
r = json.load(open(sys.argv[1]))
word = "PASS" if r.get("ok") and sys.argv[2] == "0" else "FAIL"
figures = {k: r.get(k) for k in ("accept_length", "ratios", "dump", "online_equals_offline", "miswired")
           if r.get(k) is not None}
figures.get("miswired", {}).pop("text", None)
print(f"{word} phase: {json.dumps(figures)[:1500]}; failures {r.get('failures')}")
EOF
else
  result "FAIL phase $PHASE (rc=$rc): no result JSON"
fi
step done
summary_status FAIL SKIP
