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

``--models kimi``: the same figures for the Kimi-K2.5-layout target of scripts/gpu_sglang (kimi_shape.target_config(
experts=4, topk=2, **kimi_shape.SMALL): 61 layers, hidden 256), (a) with the weights SGLang's load_format="dummy"
leaves (its own initialize_dummy_weights) and (b) with kimi_shape.layer_batches at each --gains, each row with the
learnability of the target's greedy text (what a draft is trained on; see :func:`learnability`):

    python benchmarks/bench_fingerprint_depth.py --models kimi --out benchmarks/results/fingerprint_depth_kimi-cpu.json
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import sys
import tempfile
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))  # bootstrap: the checkout's package, installed or not
KIMI_SHAPE_DIR = os.path.join(os.path.dirname(HERE), "scripts", "gpu_sglang")  # kimi_shape.py (a GPU program)


def llama(layers: int, hidden: int, seed: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=512, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=512)
    return LlamaForCausalLM(cfg).eval(), "LlamaForCausalLM, transformers' init (normal, std 0.02)"


def deepseek(layers: int, hidden: int, seed: int):
    from eagle3_capture.doctor.target_side.model import build_demo_target

    model = build_demo_target(seed, overrides={"num_hidden_layers": layers, "hidden_size": hidden,
                                               "intermediate_size": 2 * hidden, "moe_intermediate_size": hidden // 2,
                                               "vocab_size": 512})
    return model, "DeepseekV3ForCausalLM (MLA + MoE), the demo's seeded init gains"


def _kimi_shape():
    if KIMI_SHAPE_DIR not in sys.path:
        sys.path.insert(0, KIMI_SHAPE_DIR)
    import kimi_shape

    return kimi_shape


def kimi_config(layers: int, hidden: int) -> dict:
    """kimi_shape.target_config(experts=4, topk=2, **SMALL) with `layers` layers and a residual stream `hidden` wide
    (SMALL's other widths kept: at another `hidden` only the stream, which the fingerprint reads, widens)."""
    ks = _kimi_shape()
    return ks.target_config(experts=4, topk=2, **dict(ks.SMALL, num_hidden_layers=layers, hidden_size=hidden))


def _hf_config_dict(cfg: dict) -> dict:
    """The Kimi config as transformers' DeepseekV3Config reads it. transformers 5 takes rope_scaling's legacy "type"
    as rope_type itself (checked in _check_hf_config); the only change: bos / eos ids, Kimi's 163584 / 163585, lie
    outside SMALL's 1024-token vocab and transformers warns about them: dropped there (nothing here stops on eos)."""
    d = dict(cfg)
    for k in ("bos_token_id", "eos_token_id"):
        if d.get(k) is not None and d[k] >= d["vocab_size"]:
            d[k] = None
    return d


def _check_hf_config(model, cfg: dict) -> None:
    c = model.config
    rope = getattr(c, "rope_parameters", None) or {}
    want_rope = (cfg["rope_scaling"]["type"], cfg["rope_scaling"]["factor"])
    got = {"rope": (rope.get("rope_type"), rope.get("factor")), "experts": c.n_routed_experts,
           "topk": c.num_experts_per_tok, "layers": c.num_hidden_layers, "dense": c.first_k_dense_replace}
    want = {"rope": want_rope, "experts": cfg["n_routed_experts"], "topk": cfg["num_experts_per_tok"],
            "layers": cfg["num_hidden_layers"], "dense": cfg["first_k_dense_replace"]}
    if got != want:
        raise RuntimeError(f"transformers read the Kimi config otherwise: expected {want}, got {got}")


def kimi_dummy(layers: int, hidden: int, seed: int):
    """(a) The Kimi-layout target with the weights SGLang's load_format="dummy" leaves: SGLang's own
    initialize_dummy_weights applied to transformers' DeepseekV3ForCausalLM, built in bfloat16 as SGLang builds the
    model in its dtype. `seed` is unused: SGLang's seed is its default 1234, the same for every parameter.

    Where transformers' parameters differ from SGLang's DeepseekV2 (a draw is the seed's stream from its start, so
    where the fusing differs some *values* differ; what the bench reproduces -- same-shaped parameters identical in
    every layer, norms ~1e-3 -- holds in both):
    * SGLang fuses q_a_proj and kv_a_proj_with_mqa into one fused_qkv_a_proj_with_mqa [q_lora + kv_lora + rope, H]
      (one draw: its q rows equal transformers' q_a_proj, checked on the CPU); transformers draws kv_a_proj_with_mqa
      apart, from the seed's start, so it is the first rows of q_a_proj, where SGLang's are the draw's next rows. The
      same in every layer either way.
    * SGLang merges the dense MLP's and the shared expert's gate_proj / up_proj into one gate_up_proj [2I, H];
      transformers keeps two of one shape, drawn alike: its gate == up (silu(g) * g instead of silu(g) * u). At these
      weights an MLP's output is < 1e-7 of the stream (four factors ~1e-3 * sqrt(fan_in) * 6e-4), so the stream
      does not see the difference.
    * The routed experts are fused alike: transformers 5's experts.gate_up_proj [E, 2I, H] and down_proj [E, H, I]
      are SGLang's w13_weight and w2_weight (same shapes, same draws).
    * SGLang derives MLA's absorbed w_kc / w_vc from kv_b_proj after the dummy fill (post_load_weights); transformers
      uses kv_b_proj itself: the same function. The router's correction bias is filled in both (SGLang keeps it in
      float32, here bfloat16). On the GPU the generator is CUDA's Philox, not the CPU's: other values, the same
      property."""
    from sglang.srt.model_loader.weight_utils import initialize_dummy_weights
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    cfg = kimi_config(layers, hidden)
    model = DeepseekV3ForCausalLM(DeepseekV3Config(**_hf_config_dict(cfg))).to(torch.bfloat16)
    _check_hf_config(model, cfg)
    with torch.no_grad():
        initialize_dummy_weights(model)
    a = model.model.layers
    if not (torch.equal(a[1].mlp.experts.gate_up_proj, a[-1].mlp.experts.gate_up_proj)
            and torch.equal(a[1].self_attn.o_proj.weight, a[-1].self_attn.o_proj.weight)):
        raise RuntimeError("SGLang's dummy fill: expected same-shaped parameters to be equal in every layer, got "
                           "layer 1 != the last layer")
    return model.eval(), ("DeepseekV3ForCausalLM, Kimi-K2.5 layout (kimi_shape SMALL, 4 experts top-2), SGLang's "
                          "load_format=dummy weights (initialize_dummy_weights: U(-1e-3, 1e-3), one seed per parameter)")


def kimi_shaped(gain: float):
    """(b) A builder of the Kimi-layout target with kimi_shape.layer_batches(cfg, gain) as its weights: written as a
    safetensors checkpoint (the per-expert checkpoint names) + config.json in a temp dir and read by from_pretrained,
    which fuses the experts (transformers' qwen2_moe conversion) -- checked against the tensors written."""
    def build(layers: int, hidden: int, seed: int):
        from safetensors.torch import save_file
        from transformers import DeepseekV3ForCausalLM

        ks = _kimi_shape()
        cfg = kimi_config(layers, hidden)
        with tempfile.TemporaryDirectory(prefix="kimi_shaped_") as d:
            tensors = {n: t.contiguous() for batch in ks.layer_batches(cfg, gain, seed=seed, dtype=torch.float32)
                       for n, t in batch}
            save_file(tensors, os.path.join(d, "model.safetensors"))
            del tensors
            with open(os.path.join(d, "config.json"), "w") as f:
                json.dump(_hf_config_dict(cfg), f)
            model, info = DeepseekV3ForCausalLM.from_pretrained(d, dtype=torch.float32, output_loading_info=True)
        bad = {k: sorted(v)[:5] for k, v in info.items() if v}
        if bad:
            raise RuntimeError(f"loading the reshaped Kimi checkpoint: expected every tensor to land, got {bad}")
        _check_hf_config(model, cfg)
        last, I = cfg["num_hidden_layers"] - 1, cfg["moe_intermediate_size"]
        want = {n: ks.shaped_tensor(n, s, gain, seed, torch.float32, "cpu")
                for n, s in ks.checkpoint_shapes(cfg)[last + 1].items()
                if n.endswith(("experts.1.gate_proj.weight", "experts.1.up_proj.weight", "self_attn.o_proj.weight"))}
        p = f"model.layers.{last}."
        experts = model.model.layers[last].mlp.experts.gate_up_proj[1]
        got = {p + "mlp.experts.1.gate_proj.weight": experts[:I], p + "mlp.experts.1.up_proj.weight": experts[I:],
               p + "self_attn.o_proj.weight": model.model.layers[last].self_attn.o_proj.weight}
        wrong = [n for n in want if not torch.equal(want[n], got[n])]
        if sorted(want) != sorted(got) or wrong:
            raise RuntimeError(f"the loaded Kimi target differs from layer_batches: {wrong or sorted(want)}")
        return model.eval(), (f"DeepseekV3ForCausalLM, Kimi-K2.5 layout (kimi_shape SMALL, 4 experts top-2), "
                              f"kimi_shape.layer_batches weights at gain {gain}")
    return build


@torch.no_grad()
def learnability(half, ref, vocab: int, prompts: int = 8, prompt_len: int = 32, new: int = 32, seed: int = 0) -> dict:
    """How learnable the target's greedy text is (a draft is trained on it): `prompts` random prompts of
    `prompt_len` tokens, `new` greedy tokens each by the bf16 model (with its KV cache, as a server decodes).

    * distinct generated tokens per request, and over all requests (1 = the text is one token repeated);
    * bigram determinism: the share of generated tokens equal to the previous token's most frequent successor, in
      sample (the lead's figure; 1.0 whenever every bigram is seen once, so it flatters varied text) and leave one
      out (the successor counted from the *other* transitions of the pooled text; a previous token seen nowhere else
      is a miss): what a draft that reads the current token alone could get;
    * reproducibility: the share of generated tokens the same model re-derives in one prefill (bf16, other kernels)
      and the float32 model re-derives (teacher-forced), and the share of steps whose top-2 logits lie within bf16's
      rounding (|top1 - top2| <= 2^-8 |top1|): a server's other kernels can flip those, so training text and served
      text would part."""
    from eagle3_capture.doctor.target_side.model import greedy_continue

    g = torch.Generator().manual_seed(seed + 2)
    ids = torch.randint(2, vocab, (prompts, prompt_len), generator=g)
    full = greedy_continue(half, ids, new)
    gen = full[:, prompt_len:]
    pos = slice(prompt_len - 1, prompt_len - 1 + new)  # logits that predict the generated tokens
    lb = half(full[:, :-1]).logits[:, pos].float()
    lf = ref(full[:, :-1]).logits[:, pos].float()
    top2 = lb.topk(2, -1).values
    near_tie = (top2[..., 0] - top2[..., 1]) <= top2[..., 0].abs() * 2.0 ** -8
    pairs = [(int(full[r, t - 1]), int(full[r, t])) for r in range(prompts) for t in range(prompt_len, full.shape[1])]
    succ = collections.defaultdict(collections.Counter)
    for a, b in pairs:
        succ[a][b] += 1
    in_sample = sum(succ[a].most_common(1)[0][0] == b for a, b in pairs) / len(pairs)
    loo_hits = loo_seen = 0
    for a, b in pairs:
        others = succ[a].copy()
        others[b] -= 1
        others = +others  # drop zero counts
        if others:
            loo_seen += 1
            loo_hits += others.most_common(1)[0][0] == b
    distinct = [len(set(gen[r].tolist())) for r in range(prompts)]
    return {"prompts": prompts, "prompt_tokens": prompt_len, "new_tokens": new,
            "distinct_per_request": distinct, "distinct_per_request_mean": sum(distinct) / prompts,
            "distinct_over_requests": len(set(gen.flatten().tolist())),
            "distinct_continuations": len({tuple(r) for r in gen.tolist()}),
            "bigram_in_sample": in_sample, "bigram_leave_one_out": loo_hits / len(pairs),
            "bigram_leave_one_out_coverage": loo_seen / len(pairs),
            "bf16_prefill_agrees": float((lb.argmax(-1) == gen).float().mean()),
            "fp32_agrees": float((lf.argmax(-1) == gen).float().mean()),
            "near_tie_steps": float(near_tie.float().mean()),
            "first_request": gen[0].tolist()}


@torch.no_grad()
def stream(m, ids: torch.Tensor, chunk: int = 0, autocast: bool = False) -> torch.Tensor:
    if autocast:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return _stream(m, ids, chunk)
    return _stream(m, ids, chunk)


def _stream(m, ids: torch.Tensor, chunk: int = 0) -> torch.Tensor:
    """[T, L+1, H] float32: every layer input (0 = embedding, L = final boundary before the norm)."""
    from eagle3_capture.doctor.target_side.model import residual_stream

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


def measure(name, build, layers, hidden, prompts, length, seed, learn: bool = False):
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
    out = {"model": name, "description": desc, "num_layers": layers, "hidden_size": hidden, "prompts": prompts,
           "tokens_per_prompt": length, "seed": seed, "seconds": round(time.time() - t0, 1), "summary": summary,
           "per_layer_input": rows}
    if learn:
        out["learnability"] = learnability(half, model, model.config.vocab_size, seed=seed)
    return out


MODELS = ("deepseek_v3", "llama", "kimi")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="deepseek_v3,llama",
                   help=f"comma-separated, of {', '.join(MODELS)} (kimi: SGLang's dummy weights and each --gains)")
    p.add_argument("--layers", default=None,
                   help="comma-separated layer counts (each >= 32; 61 is Kimi-K2.5's); default 32,61, kimi alone 61")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--gains", default="0.25,0.5,1.0", help="kimi: the gains of kimi_shape.layer_batches")
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=None, help="default results/fingerprint_depth-cpu.json, "
                                               "kimi alone results/fingerprint_depth_kimi-cpu.json")
    a = p.parse_args()
    models = [m for m in a.models.split(",") if m]
    if not models or set(models) - set(MODELS):
        p.error(f"--models {a.models!r}: expected comma-separated names of {', '.join(MODELS)}")
    kimi_only = models == ["kimi"]
    if a.out is None:
        if "kimi" in models and not kimi_only:
            p.error("--models mixes kimi with the others: name the --out file")
        a.out = os.path.join(HERE, "results", "fingerprint_depth_kimi-cpu.json" if kimi_only
                             else "fingerprint_depth-cpu.json")
    try:
        depths = [int(v) for v in (a.layers or ("61" if kimi_only else "32,61")).split(",")]
        gains = [float(v) for v in a.gains.split(",")]
    except ValueError:
        p.error(f"--layers {a.layers!r} / --gains {a.gains!r}: expected comma-separated numbers")
    if min(depths) < 32:
        p.error("--layers: the point is depth: at least 32")
    torch.set_num_threads(a.threads)
    builders = {"deepseek_v3": [("deepseek_v3", deepseek)], "llama": [("llama", llama)],
                "kimi": [("kimi_dummy", kimi_dummy)] + [(f"kimi_gain{g:g}", kimi_shaped(g)) for g in gains]}
    results = [measure(n, b, L, a.hidden, a.prompts, a.tokens, a.seed, learn=m == "kimi")
               for L in depths for m in models for n, b in builders[m]]
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
        if "learnability" in r:
            g = r["learnability"]
            print(f"  greedy text: {g['distinct_per_request_mean']:.1f} distinct tokens per request of "
                  f"{g['new_tokens']} ({g['distinct_over_requests']} over {g['prompts']}, {g['distinct_continuations']}"
                  f" distinct continuations); bigram in sample {g['bigram_in_sample']:.2f}, leave one out "
                  f"{g['bigram_leave_one_out']:.2f} (coverage {g['bigram_leave_one_out_coverage']:.2f}); re-derived "
                  f"bf16 prefill {g['bf16_prefill_agrees']:.2f}, fp32 {g['fp32_agrees']:.2f}; near-tie steps "
                  f"{g['near_tie_steps']:.2f}")
    print(f"wrote {a.out}")
    return 0

if __name__ == "__main__":
    sys.exit(main())
