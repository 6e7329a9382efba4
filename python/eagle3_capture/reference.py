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
