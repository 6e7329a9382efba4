"""The attention of an EAGLE-3 draft with DeepSeek-V2 multi-latent attention (the MLA layout of draft_layouts.py), as
SGLang's ``Eagle3DeepseekV2ForCausalLM`` (read in 0.5.23) (models/kimi_k25_eagle3.py, the ``kimi-k2.5-eagle3-mla`` layout) builds it: the
draft layer's 2H-wide input ``cat(input_layernorm(embed), hidden_norm(hidden))`` goes through MLA's down projections
(``q_a_proj`` and ``kv_a_proj_with_mqa``, which SGLang fuses into one ``fused_qkv_a_proj_with_mqa`` of 2H inputs),
``q_a_layernorm`` / ``kv_a_layernorm``, the up projections ``q_b_proj`` / ``kv_b_proj``, and ``o_proj``.

Per head, the query and key are ``[nope | rope]`` (``qk_nope_head_dim`` + ``qk_rope_head_dim``; the key's rope part
is one vector shared by every head), the value is ``v_head_dim`` wide. RoPE is DeepSeek's interleaved form
(SGLang's ``is_neox_style=False``) with the draft's ``rope_scaling`` (yarn for Kimi-K2.x) and the softmax scale
``qk_head_dim ** -0.5`` times yarn's ``mscale(factor, mscale_all_dim) ** 2``; the cos/sin tables and the rotation
come from transformers' DeepseekV3 code (the same maths SGLang's ``DeepseekScalingRotaryEmbedding`` runs).

The module answers the draft model's two calls (``qkv`` and ``attend_rows``), so the multi-step unroll and the tree
replay of model.py run unchanged on it. Unabsorbed maths (the keys and values materialised per head): what
SGLang's absorbed kernels compute, in another order.
"""
from __future__ import annotations

from typing import List

import torch
from torch import nn

from ... import draft_layouts
from ..common import DoctorError
from .layers import RMSNorm, attend_rows, rope_kind

MLA_DRAFT_ARCH = draft_layouts.MLA.architecture


def _rotary_config(a):
    """A transformers DeepseekV3Config holding only what its rotary embedding and yarn scale read."""
    from transformers import DeepseekV3Config

    kw = dict(hidden_size=a.hidden_size, num_attention_heads=a.num_attention_heads,
              qk_rope_head_dim=a.qk_rope_head_dim, qk_nope_head_dim=a.qk_nope_head_dim,
              v_head_dim=a.v_head_dim, max_position_embeddings=a.max_position_embeddings,
              rope_interleave=a.rope_interleave)
    scaling = dict(a.rope_scaling) if a.rope_scaling else None
    params = {"rope_type": "default", "rope_theta": a.rope_theta}
    if scaling:
        params = {**{k: v for k, v in scaling.items() if k != "type"}, "rope_type": rope_kind(scaling),
                  "rope_theta": a.rope_theta}
    try:
        cfg = DeepseekV3Config(**kw, rope_parameters=params)
    except TypeError:  # transformers before rope_parameters
        cfg = DeepseekV3Config(**kw, rope_theta=a.rope_theta, rope_scaling=scaling)
    return cfg


def softmax_scale(a) -> float:
    """qk_head_dim ** -0.5, times yarn's mscale(factor, mscale_all_dim) ** 2 when the draft's rope is yarn-scaled
    (DeepseekV2AttentionMLA's scaling)."""
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import yarn_get_mscale

    scale = (a.qk_nope_head_dim + a.qk_rope_head_dim) ** -0.5
    s = a.rope_scaling or {}
    if rope_kind(s) not in ("default", None) and s.get("mscale_all_dim"):
        m = yarn_get_mscale(float(s["factor"]), float(s["mscale_all_dim"]))
        scale *= m * m
    return scale


class MLAAttention(nn.Module):
    """MLA over the draft layer's 2H-wide input; the checkpoint's tensor names (``self_attn.*``)."""

    def __init__(self, a):
        super().__init__()
        if not a.q_lora_rank:
            raise DoctorError("MLA draft: q_lora_rank is missing (SGLang's Eagle3 MLA layer requires it)")
        from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3RotaryEmbedding

        self.a = a
        nh, nope, rope, vd = a.num_attention_heads, a.qk_nope_head_dim, a.qk_rope_head_dim, a.v_head_dim
        self.q_a_proj = nn.Linear(2 * a.hidden_size, a.q_lora_rank, bias=False)
        self.q_a_layernorm = RMSNorm(a.q_lora_rank, a.rms_norm_eps)
        self.q_b_proj = nn.Linear(a.q_lora_rank, nh * (nope + rope), bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(2 * a.hidden_size, a.kv_lora_rank + rope, bias=False)
        self.kv_a_layernorm = RMSNorm(a.kv_lora_rank, a.rms_norm_eps)
        self.kv_b_proj = nn.Linear(a.kv_lora_rank, nh * (nope + vd), bias=False)
        self.o_proj = nn.Linear(nh * vd, a.hidden_size, bias=False)
        with torch.device("cpu"):  # the tables are computed, never loaded: not on the meta device
            self._rotary = DeepseekV3RotaryEmbedding(_rotary_config(a))
        self.scale = softmax_scale(a)

    def _rope(self, q_pe: torch.Tensor, k_pe: torch.Tensor, pos: torch.Tensor):
        from transformers.models.deepseek_v3.modeling_deepseek_v3 import (apply_rotary_pos_emb,
                                                                          apply_rotary_pos_emb_interleave)

        cos, sin = self._rotary(q_pe, pos.long())  # [B, T, rope] each; the table moves with the module
        apply = apply_rotary_pos_emb_interleave if self.a.rope_interleave else apply_rotary_pos_emb
        return apply(q_pe, k_pe, cos.to(q_pe.dtype), sin.to(q_pe.dtype))

    def qkv(self, x: torch.Tensor, pos: torch.Tensor):
        """x [B, T, 2H], pos [B, T] -> q, k [B, h, T, nope + rope], v [B, h, T, v_head_dim]."""
        a = self.a
        B, T, _ = x.shape
        nh, nope, rope, vd = a.num_attention_heads, a.qk_nope_head_dim, a.qk_rope_head_dim, a.v_head_dim
        q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x))).view(B, T, nh, nope + rope).transpose(1, 2)
        q_nope, q_pe = q.split([nope, rope], dim=-1)
        kv_a = self.kv_a_proj_with_mqa(x)
        latent, k_pe = kv_a.split([a.kv_lora_rank, rope], dim=-1)
        kv = self.kv_b_proj(self.kv_a_layernorm(latent)).view(B, T, nh, nope + vd).transpose(1, 2)
        k_nope, v = kv.split([nope, vd], dim=-1)
        q_pe, k_pe = self._rope(q_pe, k_pe.view(B, 1, T, rope), pos)
        q = torch.cat([q_nope, q_pe], -1)
        k = torch.cat([k_nope, k_pe.expand(B, nh, T, rope)], -1)
        return q, k, v.contiguous()

    def attend_rows(self, q, prefix_k, prefix_v, own_k: List[torch.Tensor], own_v: List[torch.Tensor]):
        return self.o_proj(attend_rows(q, prefix_k, prefix_v, own_k, own_v, self.scale))


__all__ = ["MLA_DRAFT_ARCH", "MLAAttention", "softmax_scale"]
