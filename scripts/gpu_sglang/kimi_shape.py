"""A Kimi-K2.5-shaped target for SGLang's real serving loop (scripts/gpu_sglang): its config, the shapes
of its checkpoint, and weights whose layers differ, loaded through the model's own ``load_weights``.

**The config.** Kimi-K2.5's language model as SGLang serves it (``DeepseekV3ForCausalLM``): 61 layers, hidden 7168,
MLA (q_lora 1536, kv_lora 512, qk 128 + 64, v 128, 64 heads), yarn RoPE (factor 64 over 4096 positions), vocab
163840, the first layer dense (18432 wide), the others MoE (2048 wide per expert, one shared expert, sigmoid router
with a correction bias, noaux_tc). Only the routed experts are cut (384 top-8 in Kimi; ``experts`` / ``topk`` here)
so that the target fits one GPU: what a token reads per layer at batch 1 is unchanged in kind (top-k routed experts
+ the shared one + MLA), and the residual stream, which is all the capture touches, keeps Kimi's width and depth.
``target_config(**small)`` gives the same layout at a CPU dry run's size.

**Why the weights are reshaped.** SGLang's ``load_format="dummy"`` (``model_loader/weight_utils.py
initialize_dummy_weights``) draws every floating-point parameter from U(-1e-3, 1e-3) with one seed for every
parameter: RMSNorm weights are ~1e-3, every layer adds almost nothing to the residual stream, and parameters of one
shape are *the same tensor* in every layer. Adjacent taps are then nearly parallel and a one-layer miswire is
invisible. :func:`layer_batches` gives, per layer, the checkpoint tensors of a target whose layers differ: norms 1,
every projection U(-a, a) with ``a = gain * sqrt(3 / fan_in)`` (a per-output variance of ``gain**2`` times the
input's), embedding rows of unit variance, the router bias 0, each tensor seeded by its name (the same on every
server and rank). The test-only plugin (``E3_SGLANG_RESHAPE_TARGET``, tests/sglang_cpu_plugin/e3_sglang_cpu/
reshape.py) hands each batch to the target's ``load_weights`` right after SGLang loads it, before CUDA graphs are
captured: the function SGLang's checkpoint loader and its update-weights API call (DeepseekV2's fuses ``q_a_proj``
with ``kv_a_proj_with_mqa`` within one call and re-derives the absorbed MLA weights of the layers whose
``kv_b_proj`` came). tests/gpu_programs/test_kimi_shape.py checks every parameter against the batches, and the model
against transformers' on the same checkpoint.

(Engine.update_weights_from_tensor after the start was tried first: on SGLang 0.5.23 the update reaches the
draft's runner too, whose ``load_weights`` asserts on the target's vocabulary and takes the server down, even with
``begin_weight_update(selector="target")``.)

    python scripts/gpu_sglang/kimi_shape.py --out DIR [--experts 8 --topk 2] [--small]   (writes DIR/config.json)
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sys
from typing import Dict, Iterator, List, Optional, Tuple

# Kimi-K2.5's text config (moonshotai/Kimi-K2.5 config.json, text_config), routed experts aside
KIMI_K25 = dict(
    architectures=["DeepseekV3ForCausalLM"], model_type="deepseek_v3", vocab_size=163840, hidden_size=7168,
    intermediate_size=18432, moe_intermediate_size=2048, num_hidden_layers=61, num_attention_heads=64,
    num_key_value_heads=64, n_shared_experts=1, n_routed_experts=384, num_experts_per_tok=8,
    routed_scaling_factor=2.827, kv_lora_rank=512, q_lora_rank=1536, qk_rope_head_dim=64, v_head_dim=128,
    qk_nope_head_dim=128, topk_method="noaux_tc", n_group=1, topk_group=1, norm_topk_prob=True,
    scoring_func="sigmoid", first_k_dense_replace=1, moe_layer_freq=1, hidden_act="silu", rms_norm_eps=1e-5,
    max_position_embeddings=262144, rope_theta=50000.0, attention_bias=False, tie_word_embeddings=False,
    rope_scaling={"type": "yarn", "factor": 64.0, "original_max_position_embeddings": 4096, "beta_fast": 32.0,
                  "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0},
    bos_token_id=163584, eos_token_id=163585, torch_dtype="bfloat16",
)
# the CPU dry run's size: the same layout, every width cut (heads 4, experts 4)
SMALL = dict(vocab_size=1024, hidden_size=256, intermediate_size=512, moe_intermediate_size=128,
             num_hidden_layers=61, num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=64, q_lora_rank=96,
             qk_rope_head_dim=16, v_head_dim=32, qk_nope_head_dim=32, bos_token_id=1000, eos_token_id=1001)


def target_config(experts: int = 8, topk: int = 2, **overrides) -> dict:
    """Kimi-K2.5's text config with `experts` routed experts, `topk` per token, and any field overridden."""
    if not (isinstance(experts, int) and isinstance(topk, int) and 1 <= topk <= experts):
        raise ValueError(f"need integers 1 <= topk <= experts, got topk={topk!r}, experts={experts!r}")
    unknown = set(overrides) - set(KIMI_K25)
    if unknown:
        raise ValueError(f"not a field of the Kimi-K2.5 config: {sorted(unknown)}")
    cfg = dict(KIMI_K25, n_routed_experts=experts, num_experts_per_tok=topk)
    cfg.update(overrides)
    return cfg


def _layer_shapes(cfg: dict, i: int) -> Dict[str, Tuple[int, ...]]:
    """Checkpoint tensor name -> shape for decoder layer i (the DeepSeek / Kimi checkpoint layout)."""
    H, nh = cfg["hidden_size"], cfg["num_attention_heads"]
    qk = cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]
    p = f"model.layers.{i}."
    s = {
        p + "input_layernorm.weight": (H,),
        p + "post_attention_layernorm.weight": (H,),
        p + "self_attn.q_a_proj.weight": (cfg["q_lora_rank"], H),
        p + "self_attn.q_a_layernorm.weight": (cfg["q_lora_rank"],),
        p + "self_attn.q_b_proj.weight": (nh * qk, cfg["q_lora_rank"]),
        p + "self_attn.kv_a_proj_with_mqa.weight": (cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"], H),
        p + "self_attn.kv_a_layernorm.weight": (cfg["kv_lora_rank"],),
        p + "self_attn.kv_b_proj.weight": (nh * (cfg["qk_nope_head_dim"] + cfg["v_head_dim"]), cfg["kv_lora_rank"]),
        p + "self_attn.o_proj.weight": (H, nh * cfg["v_head_dim"]),
    }
    if i < cfg["first_k_dense_replace"]:
        mlps = {p + "mlp.": cfg["intermediate_size"]}                # MLP prefix -> its width
    else:
        E = cfg["n_routed_experts"]
        s[p + "mlp.gate.weight"] = (E, H)
        s[p + "mlp.gate.e_score_correction_bias"] = (E,)
        mlps = {p + f"mlp.experts.{e}.": cfg["moe_intermediate_size"] for e in range(E)}
        if cfg["n_shared_experts"]:
            mlps[p + "mlp.shared_experts."] = cfg["moe_intermediate_size"] * cfg["n_shared_experts"]
    for m, w in mlps.items():
        s.update({m + "gate_proj.weight": (w, H), m + "up_proj.weight": (w, H), m + "down_proj.weight": (H, w)})
    return s


def checkpoint_shapes(cfg: dict) -> List[Dict[str, Tuple[int, ...]]]:
    """Per batch (the embedding, each layer, the final norm + lm_head): checkpoint name -> shape."""
    H = cfg["hidden_size"]
    out = [{"model.embed_tokens.weight": (cfg["vocab_size"], H)}]
    out += [_layer_shapes(cfg, i) for i in range(cfg["num_hidden_layers"])]
    out.append({"model.norm.weight": (H,), "lm_head.weight": (cfg["vocab_size"], H)})
    return out


def parameter_count(cfg: dict) -> int:
    return sum(math.prod(shape) for batch in checkpoint_shapes(cfg) for shape in batch.values())


def _seed(name: str, seed: int) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}:{name}".encode()).digest()[:8], "little") & (2 ** 63 - 1)


def shaped_tensor(name: str, shape: Tuple[int, ...], gain: float, seed: int, dtype, device):
    """One checkpoint tensor of the reshaped target (module docstring), the same for a name and seed anywhere."""
    import torch

    if name.endswith("norm.weight"):
        return torch.ones(shape, dtype=dtype, device=device)
    if name.endswith("e_score_correction_bias"):
        return torch.zeros(shape, dtype=torch.float32, device=device)  # SGLang keeps the router bias in float32
    g = torch.Generator(device=device).manual_seed(_seed(name, seed))
    if name == "model.embed_tokens.weight":
        a = math.sqrt(3.0)                                    # unit variance per element
    else:
        a = gain * math.sqrt(3.0 / shape[-1])                 # fan_in = the last dim of a [out, in] weight
    t = torch.empty(shape, dtype=torch.float32, device=device).uniform_(-a, a, generator=g)
    return t.to(dtype)


def layer_batches(cfg: dict, gain: float, seed: int = 0, dtype=None, device: str = "cpu",
                  batches: Optional[List[int]] = None) -> Iterator[List[Tuple[str, "object"]]]:
    """Per checkpoint batch (embedding, layer 0, ..., layer L-1, norm + lm_head): [(name, tensor)], made when
    asked (one layer's tensors alive at a time: about 1 GB at Kimi's width with 8 experts). A bad gain is refused
    here, at the call, not at the first batch."""
    import torch

    if isinstance(gain, bool) or not isinstance(gain, (int, float)) or not 0 < gain <= 4:
        raise ValueError(f"gain must be in (0, 4], got {gain!r}")
    shapes = checkpoint_shapes(cfg)
    dtype = dtype or torch.bfloat16
    return ([(n, shaped_tensor(n, s, gain, seed, dtype, device)) for n, s in batch.items()]
            for k, batch in enumerate(shapes) if batches is None or k in batches)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="a directory for config.json (created)")
    p.add_argument("--experts", type=int, default=8, help="routed experts (Kimi-K2.5 has 384)")
    p.add_argument("--topk", type=int, default=2, help="routed experts per token (Kimi-K2.5 has 8)")
    p.add_argument("--small", action="store_true", help="the CPU dry run's widths (same layout and depth)")
    p.add_argument("--layers", type=int, default=None, help="override num_hidden_layers")
    a = p.parse_args(argv)
    try:
        over = dict(SMALL) if a.small else {}
        if a.layers is not None:
            if a.layers < 2:
                raise ValueError(f"--layers must be >= 2, got {a.layers}")
            over["num_hidden_layers"] = a.layers
        cfg = target_config(a.experts, a.topk, **over)
    except ValueError as e:
        print(f"kimi_shape.py: {e}", file=sys.stderr)
        return 2
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    n = parameter_count(cfg)
    print(f"kimi_shape.py: {a.out}/config.json: {cfg['num_hidden_layers']} layers x {cfg['hidden_size']}, "
          f"{cfg['n_routed_experts']} experts top-{cfg['num_experts_per_tok']}: {n / 1e9:.2f} G parameters, "
          f"{2 * n / 1e9:.1f} GB in bf16")
    return 0


if __name__ == "__main__":
    sys.exit(main())
