"""What both draft attentions share (model.py's Llama attention, mla.py's MLA): RMSNorm, the attention
of R draft rows per anchor over the draft's KV cache (the prefix of step-1 keys and each row's own keys), and how a
config's rope_scaling names its kind."""
from __future__ import annotations

from typing import Any, List

import torch
from torch import nn


def rope_kind(scaling: Any) -> Any:
    """A rope_scaling / rope_parameters object's kind: ``rope_type`` (transformers' key) or ``type`` (the older
    one), "default" when it names none or is not an object."""
    if not isinstance(scaling, dict):
        return "default"
    return scaling.get("rope_type", scaling.get("type", "default"))


def rope_scaling_of(cfg: dict) -> Any:
    """A draft config's RoPE scaling under either name transformers has used for it."""
    return cfg.get("rope_scaling") or cfg.get("rope_parameters")


def rmsnorm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


class RMSNorm(nn.Module):
    def __init__(self, n: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        return rmsnorm(x, self.weight, self.eps)


def attend_rows(q, prefix_k, prefix_v, own_k: List[torch.Tensor], own_v: List[torch.Tensor],
                scale: float) -> torch.Tensor:
    """R draft rows per anchor: q [B,h,T,R,d] (row r of anchor t); prefix_k [B,h,P,d], prefix_v [B,h,P,dv]: the
    draft KV of positions 0..P-1, of which row (t, r) sees positions <= t when P == T (every anchor at once) and all
    P when T == 1 (one anchor whose cache holds P positions); own_k/v: [B,h,T,R,d] / [B,h,T,R,dv] each, keys that
    only row (t, r) sees (its chain, or SGLang's per-slot entries of a tree). Returns the heads' outputs
    [B,T,R,h*dv], before the output projection."""
    B, h, T, R, d = q.shape
    P = prefix_k.shape[2]
    if P != T and T != 1:
        raise ValueError(f"prefix of {P} positions for {T} anchors: expected {T}, or one anchor")
    s1 = torch.einsum("bhtrd,bhpd->bhtrp", q, prefix_k) * scale  # [B,h,T,R,P]
    if P == T:
        causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()[None, None, :, None, :]
        s1 = s1.masked_fill(~causal, float("-inf"))
    diag = [((q * k).sum(-1, keepdim=True) * scale) for k in own_k]  # [B,h,T,R,1] each
    p = torch.softmax(torch.cat([s1] + diag, dim=-1).float(), dim=-1).to(q.dtype)
    out = torch.einsum("bhtrp,bhpd->bhtrd", p[..., :P], prefix_v)
    for i, v in enumerate(own_v):
        out = out + p[..., P + i: P + i + 1] * v
    return out.permute(0, 2, 3, 1, 4).reshape(B, T, R, h * out.shape[-1])


__all__ = ["rope_kind", "rmsnorm", "RMSNorm", "attend_rows"]
