"""SGLang 0.5.23's real serving loop at Kimi-K2.5's width on one GPU: this project's plugin against stock SGLang,
side by side, CUDA graphs on, bf16, timed rounds interleaved at batch 1 and batch 16 (scripts/gpu_sglang).

    python scripts/gpu_sglang/kimi_compare.py --out DIR --draft llama|mla [--experts 4] [--rounds 3] [--budget-s 540]
        [--prompts 16] [--new-tokens 48] [--gain 0.3] [--result PATH] [--command TEXT]
        [--cuda-graph on|off] [--against stock|dump]
    python scripts/gpu_sglang/kimi_compare.py --out DIR --draft llama --small --layers 8 --device cpu   (a dry run)

The target: kimi_shape.target_config (61 layers x 7168, MLA, yarn, vocab 163840, `--experts` routed top-2 + one
shared), SGLang's dummy weights reshaped at load (kimi_shape.py says why), identical on both servers
(``E3_SGLANG_RESHAPE_TARGET``: the test-only plugin's load hook, tests/sglang_cpu_plugin/e3_sglang_cpu/
reshape.py). With 4 experts the target is 44 GB in bf16, so the plugin and stock servers fit on one H200
together and their timed rounds can alternate (plugin, stock; stock, plugin; ...); a top-2 step reads two routed
experts at batch 1 whatever their number, so the batch-1 step costs what it would with more experts.

The drafts (weights written here, read from disk: `speculative_draft_load_format=auto`, so the d2t map is loaded):
* llama: ``LlamaForCausalLMEagle3`` at width 7168, 64 heads (8 KV), MLP 18432, draft vocab 32000 with a d2t
  hot-token map of 32000 target ids;
* mla: ``Eagle3DeepseekV2ForCausalLM`` (kimi-k2.5-eagle3-mla), the target's MLA dims, full vocab.
Both at ids [1, 29, 57] (LayerOutput indices; stock's own convention [2, 30, 58], its defaults for 61 layers, is
what the stock server's copy of the draft declares; :func:`draft_ids` at a dry run's depth).

``--against dump`` serves the plugin with its capture dump on (EAGLE3_CAPTURE_DUMP, every forward's declared taps,
the doctor's requests' full stream) beside the plugin without it: the dump's cost, and its bytes per served token.

Writes DIR/kimi_<draft>_graphs-<on|off>_vs-<stock|dump>.json: machine, torch, command, per server the start,
memory lines, the plugin's startup and self-test lines, tokens/s per timed round and batch size; the two servers'
outputs, verify counts and histograms compared, and plugin / the other per round pair at each batch size (median,
min, max). Exit 0 when both served the same.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time
from typing import Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import kimi_shape  # noqa: E402
from compare import REPO, Server, child_env, machine, run_side_by_side  # noqa: E402
from server_flags import accepted  # noqa: E402
from make_pair import stock_ids  # noqa: E402
from report import compare_requests, per_request, read_jsonl  # noqa: E402

RESHAPE_ENV = "E3_SGLANG_RESHAPE_TARGET"  # tests/sglang_cpu_plugin/e3_sglang_cpu/reshape.py

def draft_ids(num_layers: int) -> List[int]:
    """The drafts' taps as LayerOutput indices: [1, 29, 57] at 61 layers (stock's own convention [2, 30, 58],
    SGLang's default there); the same spread at a dry run's depth (at least 8 layers)."""
    if num_layers < 8:
        raise ValueError(f"the target needs at least 8 layers for three distinct taps, got {num_layers}")
    return [1, num_layers // 2 - 1, num_layers - 4]

DRAFT_VOCAB = 32000
BATCHES = (1, 16)
# kimi_shape's projection gain: at 0.3 the fingerprint tells adjacent layers apart at the most depths (47 of 62 layer
# inputs on the 61-layer layout, against none with SGLang's dummy weights) while the greedy text stays re-derivable
# in bf16 (99%) -- benchmarks/bench_fingerprint_depth.py --models kimi, docs/performance.md
GAIN = 0.3
MEMORY_LINE = re.compile(r"(Load weight end|Memory pool end|Capture cuda graph end|KV Cache is allocated)")


def draft_arch(kind: str, target: dict, layer_ids: List[int]):
    """The doctor's DraftArch for a Kimi-K2.5 EAGLE-3 draft of `kind` (llama / mla) beside `target`."""
    from eagle3_capture.doctor.draft.model import DraftArch

    H, small = target["hidden_size"], target["hidden_size"] < 7168
    common = dict(hidden_size=H, target_hidden_size=H, num_aux=len(layer_ids), vocab_size=target["vocab_size"],
                  intermediate_size=target["intermediate_size"], rms_norm_eps=target["rms_norm_eps"],
                  max_position_embeddings=4096, layer_ids=list(layer_ids))
    if kind == "llama":
        heads = target["num_attention_heads"]
        return DraftArch(draft_vocab_size=min(DRAFT_VOCAB, target["vocab_size"] // 2) if small else DRAFT_VOCAB,
                         num_attention_heads=heads, num_key_value_heads=max(1, heads // 8), head_dim=H // heads,
                         rope_theta=target["rope_theta"], **common)
    return DraftArch(draft_vocab_size=target["vocab_size"], num_attention_heads=target["num_attention_heads"],
                     num_key_value_heads=target["num_attention_heads"], head_dim=0,
                     q_lora_rank=target["q_lora_rank"], kv_lora_rank=target["kv_lora_rank"],
                     qk_nope_head_dim=target["qk_nope_head_dim"], qk_rope_head_dim=target["qk_rope_head_dim"],
                     v_head_dim=target["v_head_dim"], rope_scaling=dict(target["rope_scaling"]),
                     rope_theta=target["rope_theta"], **common)


def write_draft(kind: str, target: dict, out: str, seed: int = 1, device: str = "cpu") -> dict:
    """The draft's config.json and weights (the doctor's checkpoint names, from its Eagle3Draft made on the meta
    device): norms 1, projections U(+-sqrt(3 / fan_in)), embeddings of unit variance, and for a smaller draft
    vocabulary a d2t map onto that many distinct target ids. Returns {path, parameters, d2t}."""
    import torch
    from safetensors.torch import save_file

    from eagle3_capture.doctor.draft.model import Eagle3Draft

    arch = draft_arch(kind, target, draft_ids(target["num_hidden_layers"]))
    with torch.device("meta"):
        shapes = {k: (tuple(v.shape), v.dtype) for k, v in Eagle3Draft(arch).state_dict().items()}
    os.makedirs(out, exist_ok=True)
    state, n = {}, 0
    for name, (shape, dtype) in shapes.items():
        if name == "d2t":
            g = torch.Generator().manual_seed(seed)
            hot = torch.randperm(arch.vocab_size, generator=g)[:arch.draft_vocab_size].sort().values
            state[name] = hot - torch.arange(arch.draft_vocab_size)   # SpecForge: target id = i + d2t[i]
            continue
        t = kimi_shape.shaped_tensor(f"draft.{name}", shape, 1.0, seed, torch.bfloat16, device)
        state[name] = t.cpu()
        n += t.numel()
    cfg = arch.config_json()
    cfg["torch_dtype"] = "bfloat16"
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    save_file(state, os.path.join(out, "model.safetensors"), {"format": "pt"})
    return {"path": out, "parameters": n, "d2t": arch.draft_vocab_size < arch.vocab_size}


def write_stock_copy(draft: str, out: str, rule: str = "shift_if_first_is_1") -> str:
    """The draft with its ids in stock SGLang's convention (``rule``: the served release's, server_flags.id_rule;
    weights linked, not copied)."""
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(draft, "config.json")) as f:
        cfg = json.load(f)
    ids = cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = stock_ids(ids, rule)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    link = os.path.join(out, "model.safetensors")
    if not os.path.lexists(link):
        os.symlink(os.path.join(draft, "model.safetensors"), link)
    return out


def prompts(n: int, length: int, vocab: int, seed: int = 2) -> List[List[int]]:
    import torch

    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n, length), generator=g).tolist()


def ratios(plugin: dict, stock: dict) -> Dict[str, dict]:
    """plugin / stock tokens/s per timed round pair, per batch size: {batch: {per_round, median, min, max}}."""
    out = {}
    pt = {t["round"]: t.get("per_batch", {}) for t in plugin.get("timed") or []}
    st = {t["round"]: t.get("per_batch", {}) for t in stock.get("timed") or []}
    for b in sorted({b for d in pt.values() for b in d}, key=int):
        per = {r: round(pt[r][b]["tokens_per_s"] / st[r][b]["tokens_per_s"], 4)
               for r in sorted(set(pt) & set(st)) if b in pt[r] and b in st[r]}
        vals = list(per.values())
        out[b] = {"per_round": per, "median": round(statistics.median(vals), 4) if vals else None,
                  "min": min(vals, default=None), "max": max(vals, default=None),
                  "plugin_tokens_per_s": [pt[r][b]["tokens_per_s"] for r in per],
                  "stock_tokens_per_s": [st[r][b]["tokens_per_s"] for r in per]}
    return out


def target_of(a, p) -> dict:
    """The target's config for the command line (--experts, --small, --layers); p.error on a bad value."""
    over = dict(kimi_shape.SMALL) if a.small else {}
    if a.layers is not None:
        if a.layers < 8:
            p.error(f"--layers must be >= 8, got {a.layers}")
        over["num_hidden_layers"] = a.layers
    try:
        return kimi_shape.target_config(a.experts, 2, **over)
    except ValueError as e:
        p.error(str(e))


def dump_cost(dump: str, run: dict) -> dict:
    """What the dump wrote over the server's whole life (round 1 and every timed round): files, bytes, and bytes
    per served token."""
    files = [os.path.join(r, f) for r, _, fs in os.walk(dump) for f in fs] if os.path.isdir(dump) else []
    size = sum(os.path.getsize(f) for f in files)
    tokens = (run.get("round1") or {}).get("tokens", 0) + sum(t.get("tokens", 0) for t in run.get("timed") or [])
    return {"files": len(files), "bytes": size, "served_tokens": tokens,
            "bytes_per_token": round(size / tokens, 1) if tokens else None}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--draft", choices=("llama", "mla"), required=True)
    p.add_argument("--experts", type=int, default=4)
    p.add_argument("--rounds", type=int, default=3, help="timed rounds of each server, interleaved")
    p.add_argument("--budget-s", type=float, default=540)
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--new-tokens", type=int, default=48)
    p.add_argument("--gain", type=float, default=GAIN,
                   help="kimi_shape's projection gain for the target (0.3: benchmarks/results/"
                        "fingerprint_depth_kimi-cpu.json)")
    p.add_argument("--mem-fraction", type=float, default=0.42, help="each server's mem_fraction_static")
    p.add_argument("--small", action="store_true", help="kimi_shape.SMALL widths (a dry run)")
    p.add_argument("--layers", type=int, default=None, help="override the target's 61 layers (a dry run: >= 8)")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--cuda-graph", choices=("on", "off"), default=None, help="default: on with cuda, off with cpu")
    p.add_argument("--against", choices=("stock", "dump"), default="stock",
                   help="stock: the plugin against stock SGLang; dump: the plugin with its capture dump on (the "
                        "declared taps of every forward, the full stream of the doctor's requests) against off")
    p.add_argument("--plan", default=None, help="kimi_plan.py's JSON for this phase (recorded in the result)")
    p.add_argument("--result", default=None)
    p.add_argument("--command", default=None)
    a = p.parse_args(argv)
    if a.rounds < 1 or a.prompts < 1 or a.new_tokens < 1 or a.budget_s <= 0:
        p.error(f"--rounds, --prompts, --new-tokens must be >= 1 and --budget-s > 0; got {a.rounds}, {a.prompts}, "
                f"{a.new_tokens}, {a.budget_s}")
    if a.device == "cpu" and not a.small:
        p.error("--device cpu needs --small (a 44 GB target does not fit the CPU machine)")
    if a.device == "cpu" and a.cuda_graph == "on":
        p.error("--cuda-graph on needs --device cuda")
    deadline = time.time() + a.budget_s
    os.makedirs(a.out, exist_ok=True)
    graph = a.cuda_graph or ("on" if a.device == "cuda" else "off")
    name = f"kimi_{a.draft}_graphs-{graph}_vs-{a.against}"
    logf = open(os.path.join(a.out, f"{name}.log"), "a")

    def log(msg):
        line = f"[{time.strftime('%H:%M:%S')}] {msg}"
        print(line, flush=True)
        logf.write(line + "\n")
        logf.flush()

    cfg = target_of(a, p)
    target = os.path.join(a.out, "target")
    os.makedirs(target, exist_ok=True)
    with open(os.path.join(target, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    t0 = time.time()
    draft = write_draft(a.draft, cfg, os.path.join(a.out, f"draft_{a.draft}"), device=a.device)
    # stock's convention is the served release's own (+1 on every id up to 0.5.12): read from it, in the servers'
    # environment
    rule = accepted(child_env({}, a.device), cwd=REPO)["id_rule"]
    stock_draft = write_stock_copy(draft["path"], os.path.join(a.out, f"draft_{a.draft}_stock_ids"), rule)
    log(f"target {kimi_shape.parameter_count(cfg) / 1e9:.2f} G parameters; draft {a.draft}: "
        f"{draft['parameters'] / 1e9:.2f} G, d2t {draft['d2t']}, written in {time.time() - t0:.0f} s")
    ppath = os.path.join(a.out, "prompts.json")
    with open(ppath, "w") as f:
        json.dump(prompts(a.prompts, a.prompt_len, cfg["vocab_size"]), f)
    serve_args = ["--dtype", "float32" if a.device == "cpu" else "bfloat16", "--load-format", "dummy",
                  "--draft-load-format", "auto", "--timed-batches",
                  ",".join(map(str, BATCHES)), "--max-running", max(BATCHES),
                  "--context-length", a.prompt_len + a.new_tokens + 16, "--max-total-tokens", 8192,
                  "--decode-bs", ",".join(map(str, BATCHES)), "--prefill-bs", "64,512"]
    reshape = {RESHAPE_ENV: f"{a.gain}:0"}  # the same target on both servers (e3_sglang_cpu/reshape.py)
    dump = os.path.join(a.out, "dump")
    table = {"plugin": {"graph": graph, "draft": draft["path"], "env": dict(reshape), "serve_args": serve_args}}
    if a.against == "stock":
        table["stock"] = {"graph": graph, "draft": stock_draft, "env": {"EAGLE3_CAPTURE_DISABLE": "all", **reshape},
                          "serve_args": serve_args}
    else:  # every forward's declared taps (no bound on records), the doctor's requests' full stream
        table["plugin_dump"] = {"graph": graph, "draft": draft["path"], "serve_args": serve_args,
                                "env": {**reshape, "EAGLE3_CAPTURE_DUMP": dump, "EAGLE3_CAPTURE_DUMP_MAX": "1000000",
                                        "EAGLE3_CAPTURE_DUMP_REQUESTS": "1000000",
                                        "EAGLE3_CAPTURE_DUMP_STREAM": "all"}}
    pair = {"target": target, "prompts": ppath}
    servers = [Server(n, table[n], pair, a.out, 1, a.new_tokens, a.device, True, a.rounds, a.mem_fraction)
               for n in table]
    schedule = run_side_by_side(servers, deadline, per_round_s=90, log=log, reserve_s=30)
    runs = {s.name: s.result(log) for s in servers}
    for s in servers:
        text = open(s.logpath, errors="replace").read() if os.path.exists(s.logpath) else ""
        runs[s.name]["memory_lines"] = [ln.strip()[-240:] for ln in text.splitlines() if MEMORY_LINE.search(ln)][:8]
        runs[s.name]["reshape_lines"] = [ln.strip()[-200:] for ln in text.splitlines() if "target reshaped" in ln][:2]
    base, other = servers[0], servers[1]
    p1 = per_request(read_jsonl(os.path.join(base.odir, "round1.jsonl")))
    s1 = per_request(read_jsonl(os.path.join(other.odir, "round1.jsonl")))
    same = compare_requests(p1, s1)
    verifies = sum(q["verify_ct"] or 0 for q in p1)
    tokens = sum(q["tokens"] or 0 for q in p1)
    result = {
        "what": f"SGLang's real serving loop (sglang.Engine) at Kimi-K2.5's width: the plugin against {other.name}, "
                f"{a.draft} draft, CUDA graphs {graph}",
        "command": a.command or " ".join(sys.argv), "machine": machine(), "device": a.device,
        "plan": json.load(open(a.plan)) if a.plan else None,
        "target": {k: cfg[k] for k in ("num_hidden_layers", "hidden_size", "n_routed_experts",
                                       "num_experts_per_tok", "vocab_size")},
        "target_parameters": kimi_shape.parameter_count(cfg), "gain": a.gain, "draft": draft,
        "stock_id_rule": rule,
        "prompts": a.prompts, "prompt_len": a.prompt_len, "new_tokens": a.new_tokens, "batches": list(BATCHES),
        "schedule": schedule,
        "configs": {n: {k: v for k, v in r.items() if k not in ("round1_rows", "timed_rows")} for n, r in runs.items()},
        "against": other.name, "cuda_graph": graph, "same_outputs": same,
        "accept_length": round(tokens / verifies, 4) if verifies else None,
        # plugin / other per round pair: against stock, the plugin's cost; against the dump, 1 / the dump's cost
        "ratios": ratios(runs[base.name], runs[other.name]),
    }
    if a.against == "dump":
        result["dump"] = dump_cost(dump, runs[other.name])
    failures = [f"{n}: {r.get('error') or 'not served'}" for n, r in runs.items() if not r.get("ok")]
    if not same["equal"]:
        failures.append(f"{base.name} != {other.name}: {same.get('mismatch_count')} mismatches, first "
                        f"{same['mismatches'][:2]}")
    result["failures"], result["ok"] = failures, not failures
    for path in filter(None, (os.path.join(a.out, f"{name}.json"), a.result)):
        with open(path, "w") as f:
            json.dump(result, f, indent=1)
    log(f"ratios: {json.dumps(result['ratios'])}")
    for line in failures or [f"plugin = {other.name}; both served"]:
        log(f"result: {line}")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
