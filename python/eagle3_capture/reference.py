"""Plain-torch reference of every op: the test oracle.

Each function is out of place and computes in the dtype of its inputs, so passing float64 tensors gives the exact
answer the kernels approximate. Nothing here is fast or fused on purpose.
"""
from __future__ import annotations

from typing import Optional

import torch


def capture(packed: torch.Tensor, slot: int, hidden: torch.Tensor, residual: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Returns a copy of `packed` with tap `slot` set to hidden (+ residual)."""
    h = hidden.shape[1]
    out = packed.clone()
    out[:, slot * h:(slot + 1) * h] = hidden if residual is None else hidden + residual
    return out


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x * rsqrt(mean(x^2, -1) + eps) * weight, in x's dtype."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def fused_add_rmsnorm_capture(hidden: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                              packed: torch.Tensor, slot: int):
    """Returns (hidden_out, residual_out, packed_out) of the fused residual step with capture."""
    new_residual = hidden + residual
    return rmsnorm(new_residual, weight, eps), new_residual, capture(packed, slot, new_residual)


def draft_fc(x, weight: torch.Tensor, norm_weights=None, eps: float = 1e-6, bias: Optional[torch.Tensor] = None,
             round_normed_to: Optional[torch.dtype] = None) -> torch.Tensor:
    """linear(cat(rmsnorm(x_k) * g_k for k), weight, bias): what SGLang's fc_norm ModuleList + cat + fc compute.

    x: packed [M, K*H] (K from norm_weights, else one input) or a list of K [M, H]. With round_normed_to, each
    normalised tap is rounded to that dtype before the projection, as K RMSNorm modules in bf16 would do.
    """
    taps = [x] if isinstance(x, torch.Tensor) else list(x)
    if norm_weights is not None:
        g = norm_weights if isinstance(norm_weights, torch.Tensor) else torch.stack(list(norm_weights))
        if len(taps) == 1:
            taps = list(taps[0].chunk(g.shape[0], dim=-1))
        taps = [rmsnorm(t, g[k], eps) for k, t in enumerate(taps)]
        if round_normed_to is not None:
            taps = [t.to(round_normed_to).to(weight.dtype) for t in taps]
    xcat = taps[0] if len(taps) == 1 else torch.cat(taps, dim=-1)
    y = xcat @ weight.t()
    return y if bias is None else y + bias
