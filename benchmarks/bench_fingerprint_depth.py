"""How far apart neighbouring layers are at depth, against how far apart two captures of one tap are: the numbers
behind the fingerprint's "ambiguous" (doctor/fingerprint/stream_match.py).

For seeded transformers models of at least 32 layers (a DeepseekV3 with the demo's init gains, and a Llama with
transformers' own init), on the CPU, three captures of every layer input of the same tokens:

* fp32: one prefill in float32 (a reference run);
* bf16: one prefill in bfloat16 (how SpecForge makes training data);
* bf16 other: the same tokens with the float32 weights under bfloat16 autocast (matmuls in bf16, norms and residual
  adds in float32), prefilled in two chunks through the KV cache: a server's capture of the same taps, bf16 too but
  by other kernels in another order (a plain bf16 model in two chunks is bit-equal to one prefill on the CPU, so it
  would show no noise at all).

Per layer input i: the noise between two captures of the same tap (1 - cos, bf16 vs the other bf16 and bf16 vs
fp32), the cosine of neighbouring layers (bf16 i vs the other bf16 at i-1 and i+1), and the fingerprint's own verdict
when the bf16 capture is the training slot and the other bf16 one the server's full stream (margin = best - next best,
called clear when it beats 2x the noise and wins on 90% of the rows one by one).

    python benchmarks/bench_fingerprint_depth.py --out benchmarks/results/fingerprint_depth-cpu.json
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))


def llama(layers: int, hidden: int, seed: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=512, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=512)
    return LlamaForCausalLM(cfg).eval(), "LlamaForCausalLM, transformers' init (normal, std 0.02)"


def deepseek(layers: int, hidden: int, seed: int):
    from eagle3_capture.doctor.target.model import build_demo_target

    model = build_demo_target(seed, overrides={"num_hidden_layers": layers, "hidden_size": hidden,
                                               "intermediate_size": 2 * hidden, "moe_intermediate_size": hidden // 2,
                                               "vocab_size": 512})
    return model, "DeepseekV3ForCausalLM (MLA + MoE), the demo's seeded init gains"


@torch.no_grad()
def stream(m, ids: torch.Tensor, chunk: int = 0, autocast: bool = False) -> torch.Tensor:
    if autocast:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return _stream(m, ids, chunk)
    return _stream(m, ids, chunk)


def _stream(m, ids: torch.Tensor, chunk: int = 0) -> torch.Tensor:
    """[T, L+1, H] float32: every layer input (0 = embedding, L = final boundary before the norm)."""
    from eagle3_capture.doctor.target.model import residual_stream

    if not chunk:
        return residual_stream(m, ids[None])[0][0].float()
    inner = m.model
    grabbed = {}

    def pre(module, args, kwargs=None):
        grabbed["x"] = args[0] if args else kwargs.get("hidden_states")

    h = inner.norm.register_forward_pre_hook(pre)
    try:
        a = m(ids[None, :chunk], use_cache=True, output_hidden_states=True)
        fa = grabbed["x"]
        b = m(ids[None, chunk:], past_key_values=a.past_key_values, use_cache=True, output_hidden_states=True)
        fb = grabbed["x"]
    finally:
        h.remove()
    L = len(inner.layers)
    parts = [torch.cat([x, y], 1) for x, y in zip(a.hidden_states[:L], b.hidden_states[:L])]
    return torch.stack(parts + [torch.cat([fa, fb], 1)], 2)[0].float()


def cosines(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cosine_similarity(x.double(), y.double(), dim=-1)


def measure(name, build, layers, hidden, prompts, length, seed):
    from eagle3_capture.doctor.fingerprint.stream_match import StreamMatcher

    import copy

    model, desc = build(layers, hidden, seed)
    model = model.float()
    half = copy.deepcopy(model).to(torch.bfloat16)
    g = torch.Generator().manual_seed(seed + 1)
    ids = [torch.randint(2, 512, (length,), generator=g) for _ in range(prompts)]
    t0 = time.time()
    caps = {"fp32": [], "bf16": [], "bf16_other": []}
    for x in ids:
        caps["fp32"].append(stream(model, x))
        caps["bf16"].append(stream(half, x))
        caps["bf16_other"].append(stream(model, x, chunk=length // 2, autocast=True))
    cat = {k: torch.cat(v) for k, v in caps.items()}  # [N, L+1, H]
    Lp1 = cat["bf16"].shape[1]
    rows = []
    matcher = StreamMatcher(Lp1, hidden)
    for a, b in zip(caps["bf16"], caps["bf16_other"]):
        # every bf16 layer input as a "training slot" against the other bf16 run as the server's full stream
        matcher.add(a.reshape(a.shape[0], -1), b.permute(1, 0, 2), list(range(Lp1)))
    verdicts = matcher.matches(min_cos=0.5, expected=list(range(Lp1)))
    for i in range(Lp1):
        tr, sv, ref = cat["bf16"][:, i], cat["bf16_other"], cat["fp32"][:, i]
        same_bf16 = float(cosines(tr, sv[:, i]).mean())
        same_fp32 = float(cosines(tr, ref).mean())
        prev = float(cosines(tr, sv[:, i - 1]).mean()) if i > 0 else None
        nxt = float(cosines(tr, sv[:, i + 1]).mean()) if i + 1 < Lp1 else None
        v = verdicts[i]
        rows.append({"layer_input": i, "noise_bf16_vs_bf16": 1 - same_bf16, "noise_bf16_vs_fp32": 1 - same_fp32,
                     "cos_prev_layer": prev, "cos_next_layer": nxt,
                     "margin": v.margin, "row_wins": v.row_wins, "verdict": v.verdict, "named": v.best,
                     "named_right": v.best == i})
    depth = [r for r in rows if 0 < r["layer_input"] < Lp1 - 1]
    summary = {
        "clear_and_right": sum(r["verdict"] in ("clear", "exact") and r["named_right"] for r in rows),
        "ambiguous": sum(r["verdict"] == "ambiguous" for r in rows),
        "wrong": sum(r["verdict"] in ("clear", "exact") and not r["named_right"] for r in rows),
        "layer_inputs": Lp1,
        "max_noise_bf16_vs_bf16": max(r["noise_bf16_vs_bf16"] for r in rows),
        "max_noise_bf16_vs_fp32": max(r["noise_bf16_vs_fp32"] for r in rows),
        "max_neighbour_cos_at_depth": max(max(r["cos_prev_layer"], r["cos_next_layer"]) for r in depth),
        "min_margin_at_depth": min(r["margin"] for r in depth),
        "min_margin_over_noise_at_depth": min(r["margin"] / max(r["noise_bf16_vs_bf16"], 1e-12) for r in depth),
    }
    return {"model": name, "description": desc, "num_layers": layers, "hidden_size": hidden, "prompts": prompts,
            "tokens_per_prompt": length, "seed": seed, "seconds": round(time.time() - t0, 1), "summary": summary,
            "per_layer_input": rows}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", default="32,61", help="comma-separated layer counts (each >= 32; 61 is Kimi-K2.5's)")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=os.path.join(HERE, "results", "fingerprint_depth-cpu.json"))
    a = p.parse_args()
    try:
        depths = [int(v) for v in a.layers.split(",")]
    except ValueError:
        p.error(f"--layers {a.layers!r}: expected comma-separated integers")
    if min(depths) < 32:
        p.error("--layers: the point is depth: at least 32")
    torch.set_num_threads(a.threads)
    results = [measure(n, b, L, a.hidden, a.prompts, a.tokens, a.seed)
               for L in depths for n, b in (("deepseek_v3", deepseek), ("llama", llama))]
    import transformers

    out = {"command": " ".join(["python"] + sys.argv), "machine": {"cpu": platform.processor() or platform.machine(),
                                                                    "cores": os.cpu_count(),
                                                                    "python": platform.python_version()},
           "torch": torch.__version__, "transformers": transformers.__version__, "results": results}
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)
    for r in results:
        s = r["summary"]
        print(f"{r['model']}: L={r['num_layers']} H={r['hidden_size']}: {s['clear_and_right']}/{s['layer_inputs']} "
              f"layer inputs named right, {s['ambiguous']} ambiguous, {s['wrong']} wrong; noise bf16/bf16 <= "
              f"{s['max_noise_bf16_vs_bf16']:.2e}, bf16/fp32 <= {s['max_noise_bf16_vs_fp32']:.2e}; neighbours' cos "
              f"<= {s['max_neighbour_cos_at_depth']:.6f}; margin >= {s['min_margin_at_depth']:.2e} "
              f"({s['min_margin_over_noise_at_depth']:.1f}x the bf16 noise)")
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
