#!/usr/bin/env bash
# At Kimi-K2.5's width on ONE GPU (an H100 80 GB or an H200): SGLang's real serving loop (sglang.Engine and
# launch_server) with a 61-layer, 7168-wide MLA target in bf16 (SGLang's dummy weights, reshaped at load so that its
# layers differ: scripts/gpu_sglang/kimi_shape.py), one phase per device call, each inside the 10-minute call:
#   usage: PHASE=collect|train|online|miswired|llama|mla|eager|dump bash scripts/gpu_sglang_kimi.sh [--help]
#   collect   launch_server with an untrained Llama draft and its full-stream dump on serves 32 prompts, then the
#             doctor's teacher-forced pass; the taps go to $STATE for train (scripts/gpu_sglang/kimi_accept.py)
#   train     the draft trained on them (the doctor's loop, 300 iterations) in a process that exits before any
#             server starts; the draft goes to $STATE for online. Run it in the call right after collect
#   online    launch_server serving the trained draft; doctor online on 8 held-out prompts: the draft accepts
#             (accept length > 1.5) and predicted = served by the bf16 criterion (near-ties listed)
#   miswired  a server serving the draft's taps one layer later: doctor online exits 1 and names each slot
#   llama     plugin against stock, Llama EAGLE-3 draft (draft vocab 32000, a d2t map), CUDA graphs on, ROUNDS
#             interleaved timed rounds at batch 1 and 16 (scripts/gpu_sglang/kimi_compare.py); two servers side by
#             side: an H200 only (kimi_plan.py says why an H100 cannot)
#   mla       the same with the MLA draft (Eagle3DeepseekV2ForCausalLM, kimi-k2.5-eagle3-mla)
#   eager     the llama phase with --disable-cuda-graph
#   dump      the plugin with its capture dump on (declared taps, the doctor's requests' full stream) against off
# First (before anything is installed) scripts/gpu_sglang/kimi_plan.py reads the card (nvidia-smi), chooses EXPERTS
# for it (H100: 2, H200: 8 for one server, 4 for two), checks the GPU memory and the seconds the phase needs against
# BUDGET_S and that the earlier phase's files are in $STATE; when the phase cannot fit it prints one line and the
# script exits 2. Then: the wheels (scripts/fetch_device_wheels.sh, carried as $WHEELS) into /tmp/e3site, the
# extension built for the GPU, the test-only SGLang plugin (tests/sglang_cpu_plugin: only its reshape hook acts on
# a GPU), the phase. $STATE (/tmp/e3kimi-state) survives between back-to-back calls on a warm machine; collect
# starts it afresh. $OUT/kimi_<phase>.json (machine, card, torch, SGLang release, command, the plan: EXPERTS and
# why, memory and seconds; the figures; the stock or dump-off baseline of the same run), $OUT/plan.json,
# $OUT/summary.txt (PASS / FAIL lines), $OUT/logs.tar.gz (logs and the runs' files, weights and dumps left out).
# Environment: OUT (default /tmp/e3out), BUDGET_S (default 560: the call's seconds left), PHASE, ROUNDS (3),
# EXPERTS (default: by the card), GAIN (0.3: kimi_shape's projection gain), WHEELS (.whl).
set -euo pipefail
source "$(dirname "$0")/device_env.sh"
no_arguments_but_help "$@"
PHASE=${PHASE:-}
case "$PHASE" in collect|train|online|miswired|llama|mla|eager|dump) ;; *)
  echo "gpu_sglang_kimi.sh: PHASE must be one of collect, train, online, miswired, llama, mla, eager, dump; got '${PHASE}'" >&2
  exit 2 ;; esac
BUDGET_S=${BUDGET_S:-560}
ROUNDS=${ROUNDS:-3}
GAIN=${GAIN:-0.3}
STATE=/tmp/e3kimi-state
WARM=$STATE/warm      # a server started on this machine: Triton / JIT caches are warm
LOGS_DIR=${OUT:-/tmp/e3out}
mkdir -p "$LOGS_DIR"
[ "$PHASE" = collect ] && rm -rf "$STATE"
mkdir -p "$STATE"
plan_args=(--phase "$PHASE" --state "$STATE" --warm-marker "$WARM" --rounds "$ROUNDS")
[ -n "${EXPERTS:-}" ] && plan_args+=(--experts "$EXPERTS")
python3 scripts/gpu_sglang/kimi_plan.py "${plan_args[@]}" --budget-s "$BUDGET_S" > "$LOGS_DIR/plan.json" || exit 2
EXPERTS=$(python3 -c "import json, sys; print(json.load(open(sys.argv[1]))['experts'])" "$LOGS_DIR/plan.json")
start_run "$LOGS_DIR"
result "PASS plan: $(python3 -c "import json, sys; p = json.load(open(sys.argv[1])); print(f\"{p['card']['name']}, EXPERTS={p['experts']} ({p['experts_why']}); needs about {p['need_s']:.0f} s of {p['budget_s']:.0f}\")" "$LOGS_DIR/plan.json")"
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
WHEELS=${WHEELS:-.whl}
WORK=/tmp/e3kimi
rm -rf "$WORK"
mkdir -p "$WORK"
# the servers' logs and the result JSONs, never the weights (the drafts are GBs) nor the dumps
pack() { tar -C /tmp -czf "$LOGS/logs.tar.gz" --exclude='*.safetensors' --exclude='dump_*' --exclude='*.pt' \
  e3kimi e3kimi-state 2>/dev/null || true; }
trap pack EXIT

t_setup=$(date +%s)
if [ "$PHASE" != train ]; then  # training needs torch and the package's Python only
  install_wheels "$WHEELS" "$WORK/wheels.log"
  export PYTHONPATH=/tmp/e3site${PYTHONPATH:+:$PYTHONPATH}
  if [ -z "${CUDA_HOME:-}" ] && [ -x /usr/local/cuda/bin/nvcc ]; then export CUDA_HOME=/usr/local/cuda; fi
  build_extension
  step test plugin
  if python3 -m pip install -q --no-build-isolation --no-deps -e tests/sglang_cpu_plugin > "$WORK/test_plugin.log" 2>&1
  then result "PASS test-only SGLang plugin installed (the target's reshape at load)"
  else tail -20 "$WORK/test_plugin.log"; result "FAIL test-only SGLang plugin"; exit 1; fi
  result "PASS SGLang $(python3 -c 'from importlib import metadata; print(metadata.version("sglang"))') installed"
fi
export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv,noheader | tee "$LOGS/gpu_memory_before.txt"
left=$(( DEADLINE - $(date +%s) - 25 ))
result "INFO setup took $(( $(date +%s) - t_setup )) s; $left s left for the phase"
# the plan again with the seconds really left (the setup's were an allowance)
if ! python3 scripts/gpu_sglang/kimi_plan.py "${plan_args[@]}" --experts "$EXPERTS" --budget-s "$left" --setup-done \
    > "$LOGS/plan_after_setup.json" 2> "$WORK/plan_after_setup.err"; then
  result "SKIP phase $PHASE: $(cat "$WORK/plan_after_setup.err")"
  exit 2
fi

step "phase $PHASE"
cmd="PHASE=$PHASE bash scripts/gpu_sglang_kimi.sh"
common=(--out "$WORK/$PHASE" --experts "$EXPERTS" --gain "$GAIN" --budget-s "$left" --result "$LOGS/kimi_$PHASE.json"
        --command "$cmd" --plan "$LOGS/plan.json")
rc=0
case "$PHASE" in
  llama|mla) python3 scripts/gpu_sglang/kimi_compare.py "${common[@]}" --draft "$PHASE" --rounds "$ROUNDS" || rc=$? ;;
  eager) python3 scripts/gpu_sglang/kimi_compare.py "${common[@]}" --draft llama --rounds "$ROUNDS" --cuda-graph off \
           || rc=$? ;;
  dump) python3 scripts/gpu_sglang/kimi_compare.py "${common[@]}" --draft llama --rounds "$ROUNDS" --against dump \
          || rc=$? ;;
  collect|train|online|miswired)
    python3 scripts/gpu_sglang/kimi_accept.py "${common[@]}" --phase "$PHASE" --state "$STATE" || rc=$? ;;
esac
[ "$PHASE" != train ] && touch "$WARM"
if [ -f "$LOGS/kimi_$PHASE.json" ]; then
  python3 - "$LOGS/kimi_$PHASE.json" "$rc" <<'EOF2' | tee -a "$SUMMARY"
import json, sys
r = json.load(open(sys.argv[1]))
word = "PASS" if r.get("ok") and sys.argv[2] == "0" else "FAIL"
figures = {k: r.get(k) for k in ("accept_length", "ratios", "dump", "online_equals_offline", "handoff", "miswired",
                                 "collect", "train") if r.get(k) is not None}
figures.get("miswired", {}).pop("text", None)
if isinstance(figures.get("train"), dict):
    figures["train"] = {k: figures["train"].get(k) for k in ("train", "seconds", "labels_in_the_hot_set")}
print(f"{word} phase: {json.dumps(figures)[:1500]}; failures {r.get('failures')}")
EOF2
else
  result "FAIL phase $PHASE (rc=$rc): no result JSON"
fi
step done
summary_status FAIL SKIP
