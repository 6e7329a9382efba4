"""Before a real-width phase starts (scripts/gpu_sglang_kimi.sh runs this first, before anything is installed): the
card, the routed experts chosen for it, the GPU memory each server needs, the seconds the phase needs against
those left in the device call, and the files an earlier phase must have left. Prints one JSON object (recorded in
the phase's result) and exits 0 when the phase fits; exits 2 with one line on stderr when it cannot (a phase that
would run out of time or memory halfway costs a whole device call).

    python scripts/gpu_sglang/kimi_plan.py --phase P --budget-s S [--experts N] [--state DIR] [--warm-marker F]
        [--card "NAME, MiB"]          (default: nvidia-smi's GPU 0)

Memory (GiB = 2**30 bytes; bf16): a server holds the target's and the draft's weights and a KV pool of
``max_total_tokens`` (MLA: (kv_lora_rank + qk_rope_head_dim) x 2 bytes x layers per token) inside its
``mem_fraction_static`` x the card; the rest of the card is left for activations, CUDA graphs and (in accept's
online phase) the doctor beside the server (9.4 GB measured at EXPERTS=2). Seconds: DESIGN.md's measurements on an
H100 (launch_server start 239 s with cold Triton / JIT caches, 93 s warm; 32 prompts served and teacher-forced
14-19 s; 300 training iterations 108 s; doctor online 34.9 s), plus allowances for what was not measured (the
wheels, the extension build, a server's shutdown), named as such in the JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from typing import Dict, List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import kimi_shape  # noqa: E402  (pure Python at import: no torch before the wheels are in)

GIB = 2 ** 30
PHASES = ("collect", "train", "online", "miswired", "llama", "mla", "eager", "dump")
SIDE_BY_SIDE = ("llama", "mla", "eager", "dump")     # two servers at once (kimi_compare.py)
# measured (DESIGN.md, "The project's real-width script on an H100 80 GB")
START_S = {"cold": 239.0, "warm": 93.0}             # launch_server with the reshaped target, EXPERTS=2
COLLECT_S = 19.0                                     # 32 prompts served + the teacher-forced pass
TRAIN_S = 108.0                                      # 300 iterations of the doctor's loop at 7168
DOCTOR_S = 35.0                                      # doctor online (34.9 s)
DOCTOR_GPU_GIB = 9.4e9 / GIB                         # its GPU memory beside the server
TOKENS_PER_S = {1: 41.0, 16: 308.0}                  # the H200 probe's plugin/stock tokens/s at batch 1 / 16
# allowances, not measurements
ALLOW = {"setup_cold_s": 150.0, "setup_warm_s": 40.0, "shutdown_s": 20.0, "train_load_s": 30.0,
         "round1_s": 30.0, "margin_s": 25.0, "write_draft_s": 30.0}
DRAFT_VOCAB, DRAFT_MLP = 32000, 18432                # kimi_compare's Llama draft
MAX_TOTAL_TOKENS = {"accept": 16384, "compare": 8192}
MEM_FRACTION = {"one": 0.6, "two": 0.42}             # kimi_accept's / kimi_compare's defaults
H200_MIB = 120000                                    # an H200 reports 143771 MiB, an H100 80 GB 81559


def card_from_smi() -> Tuple[str, int]:
    out = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, timeout=30).stdout.strip().splitlines()
    if not out:
        raise ValueError("nvidia-smi listed no GPU")
    return parse_card(out[0])


def parse_card(text: str) -> Tuple[str, int]:
    name, _, mib = text.rpartition(",")
    try:
        return name.strip(), int(float(mib.strip().split()[0]))
    except (ValueError, IndexError):
        raise ValueError(f"a card is 'NAME, MiB' (nvidia-smi's name,memory.total), got {text!r}") from None


def choose_experts(phase: str, card_mib: int, given: Optional[int]) -> Tuple[int, str]:
    if given is not None:
        return given, "EXPERTS set by the caller"
    big = card_mib >= H200_MIB
    if phase in SIDE_BY_SIDE:
        return 4, ("two servers side by side on an H200: 4 routed experts (44 GB of target weights each), as the "
                   "side-by-side phases were planned")
    if big:
        return 8, ("one server on an H200 (141 GB): 8 routed experts, the configuration SGLang served at 61 x 7168 "
                   "with CUDA graphs on the H200 probe (62.2 GB of target weights)")
    return 2, ("one server on an H100 (80 GB): 2 routed experts (33 GB of target weights), the configuration that "
               "ran on the H100; with the draft, the KV pool, CUDA graphs and the doctor beside it, more do not fit")


def draft_parameters(cfg: dict) -> int:
    """The Llama EAGLE-3 draft kimi_compare writes beside `cfg` (Eagle3Draft's parameters, d2t aside)."""
    H, V = cfg["hidden_size"], cfg["vocab_size"]
    small = H < 7168
    dv = min(DRAFT_VOCAB, V // 2) if small else DRAFT_VOCAB
    heads = cfg["num_attention_heads"]
    kv, hd = max(1, heads // 8), H // heads
    inter = cfg["intermediate_size"]
    attn = 2 * H * heads * hd + 2 * (2 * H * kv * hd) + heads * hd * H
    return V * H + 3 * H * H + attn + 3 * H * inter + dv * H + 4 * H  # 4 norms


def kv_bytes_per_token(cfg: dict) -> int:
    """The target's MLA KV (latent + rope key) over every layer, plus the draft's one Llama layer, bf16."""
    heads = cfg["num_attention_heads"]
    target = (cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"]) * 2 * cfg["num_hidden_layers"]
    draft = 2 * max(1, heads // 8) * (cfg["hidden_size"] // heads) * 2
    return target + draft


def memory(phase: str, cfg: dict, card_mib: int) -> dict:
    card = card_mib * 2 ** 20 / GIB
    two = phase in SIDE_BY_SIDE
    frac = MEM_FRACTION["two" if two else "one"]
    tokens = MAX_TOTAL_TOKENS["compare" if two else "accept"]
    weights = (kimi_shape.parameter_count(cfg) + draft_parameters(cfg)) * 2 / GIB
    kv = tokens * kv_bytes_per_token(cfg) / GIB
    servers = 2 if two else (0 if phase == "train" else 1)
    per_server = weights + kv
    out = {"card_gib": round(card, 1), "servers": servers, "mem_fraction_static": frac,
           "weights_gib_per_server": round(weights, 1), "kv_gib_per_server": round(kv, 2),
           "static_gib_per_server": round(per_server, 1), "static_pool_gib_per_server": round(frac * card, 1)}
    problems = []
    if servers and per_server > frac * card:
        problems.append(f"{servers} server(s) of {per_server:.1f} GiB (weights {weights:.1f} + KV {kv:.2f}) each "
                        f"exceed mem_fraction_static {frac} x {card:.1f} GiB = {frac * card:.1f} GiB")
    left = card * (1 - servers * frac)
    out["left_gib"] = round(left, 1)
    if phase in ("online", "miswired") and left < DOCTOR_GPU_GIB:
        problems.append(f"{left:.1f} GiB left beside the server, the doctor needs {DOCTOR_GPU_GIB:.1f}")
    out["problems"] = problems
    return out


def seconds(phase: str, warm: bool, rounds: int = 3, setup_done: bool = False) -> Dict[str, float]:
    """The phase's steps and their seconds (measured, or an allowance where the name says so)."""
    start = START_S["warm" if warm else "cold"]
    steps = {} if setup_done or phase == "train" else {
        "setup (allowance)": ALLOW["setup_warm_s" if warm else "setup_cold_s"]}
    if phase in ("collect", "miswired") or phase in SIDE_BY_SIDE:  # a 4.9 GB draft written before its server
        steps["write the draft (allowance)"] = ALLOW["write_draft_s"]
    if phase == "collect":
        steps.update({"server start": start, "serve + teacher-force": COLLECT_S,
                      "shutdown (allowance)": ALLOW["shutdown_s"]})
    elif phase == "train":
        steps.update({"load the dump's taps (allowance)": ALLOW["train_load_s"], "300 iterations": TRAIN_S})
    elif phase in ("online", "miswired"):
        steps.update({"server start": start, "doctor online": DOCTOR_S, "shutdown (allowance)": ALLOW["shutdown_s"]})
    else:  # two servers start together, then their timed rounds one at a time (16 prompts x 48 tokens, b 1 and 16)
        per_round = sum(16 * 48 / tps for tps in TOKENS_PER_S.values())
        steps.update({"two server starts, side by side": start, "round 1 (allowance)": ALLOW["round1_s"],
                      f"{rounds} timed rounds x 2 servers": 2 * rounds * per_round,
                      "shutdown (allowance)": ALLOW["shutdown_s"]})
    steps["margin (allowance)"] = ALLOW["margin_s"]
    return steps


def missing_files(phase: str, state: Optional[str]) -> Optional[str]:
    need = {"train": ("collect", ["collect.json", "train_data.pt", "target/config.json"]),
            "online": ("train", ["train.json", "draft_trained/config.json", "draft_trained/model.safetensors",
                                 "held_out_prompts.json"])}
    if phase not in need:
        return None
    before, files = need[phase]
    gone = [f for f in files if not state or not os.path.exists(os.path.join(state, f))]
    if gone:
        return (f"PHASE={phase} needs the {before} phase's files in {state} ({', '.join(gone)} missing): run "
                f"PHASE={before} first, in the device call right before this one (the machine keeps /tmp only "
                "while it stays warm, about 30 s after a call)")
    return None


def plan(phase: str, budget_s: float, card: Tuple[str, int], experts: Optional[int] = None,
         state: Optional[str] = None, warm: bool = False, rounds: int = 3,
         setup_done: bool = False) -> Tuple[dict, Optional[str]]:
    """(the plan, None) when the phase fits, else (the plan, the one-line reason)."""
    name, mib = card
    n, why = choose_experts(phase, mib, experts)
    cfg = kimi_shape.target_config(n, 2)
    mem = memory(phase, cfg, mib)
    steps = seconds(phase, warm, rounds, setup_done)
    need = sum(steps.values())
    out = {"phase": phase, "card": {"name": name, "memory_mib": mib}, "experts": n, "experts_why": why,
           "target_gb": round(kimi_shape.parameter_count(cfg) * 2 / 1e9, 1), "memory": mem,
           "caches": "warm" if warm else "cold", "seconds": {k: round(v, 1) for k, v in steps.items()},
           "need_s": round(need, 1), "budget_s": budget_s}
    why_not = missing_files(phase, state)
    if why_not is None and phase in SIDE_BY_SIDE and mem["problems"] and mib < H200_MIB:
        why_not = (f"PHASE={phase} runs two servers side by side and does not fit this {name} "
                   f"({'; '.join(mem['problems'])}): ask for an H200 (kind nvidia-h200 with needs_h200=true)")
    elif why_not is None and mem["problems"]:
        why_not = f"PHASE={phase} with EXPERTS={n} does not fit this {name}: {'; '.join(mem['problems'])}"
    elif why_not is None and need > budget_s:
        why_not = (f"PHASE={phase} needs about {need:.0f} s ({', '.join(f'{k} {v:.0f}' for k, v in steps.items())}) "
                   f"and {budget_s:.0f} s are left in this call ({out['caches']} caches)")
    out["fits"] = why_not is None
    return out, why_not


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--phase", required=True, choices=PHASES)
    p.add_argument("--budget-s", type=float, required=True, help="seconds left in the device call")
    p.add_argument("--experts", type=int, default=None)
    p.add_argument("--state", default=None, help="where the phases keep their files between calls")
    p.add_argument("--warm-marker", default=None, help="a file that exists once a server started on this machine")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--card", default=None, help="'NAME, MiB' instead of asking nvidia-smi")
    p.add_argument("--setup-done", action="store_true", help="the wheels and the build are in: no allowance for them")
    a = p.parse_args(argv)
    try:
        if a.experts is not None and a.experts < 2:
            raise ValueError(f"EXPERTS must be >= 2 (two routed experts per token), got {a.experts}")
        card = parse_card(a.card) if a.card else card_from_smi()
        out, why_not = plan(a.phase, a.budget_s, card, a.experts, a.state,
                            bool(a.warm_marker and os.path.exists(a.warm_marker)), a.rounds, a.setup_done)
    except (ValueError, OSError, subprocess.SubprocessError) as e:
        print(f"kimi_plan.py: {e}", file=sys.stderr)
        return 2
    print(json.dumps(out))
    if why_not:
        print(f"kimi_plan.py: {why_not}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
