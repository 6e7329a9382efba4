"""Runs every op once against the float64 reference on CPU (and CUDA when present) and says what it checked."""
from __future__ import annotations

import json

import torch

from . import reference
from .native import build_info

_TOL = {torch.float32: 2e-5, torch.float16: 2.0 / 1024, torch.bfloat16: 2.0 / 128}


def _rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    g, w = got.double().cpu(), want.double().cpu()
    if torch.isnan(g).any():
        return float("inf")
    return float(((g - w).abs() / (w.abs() + 1e-3 * w.abs().max())).max()) if w.numel() else 0.0


def _checks(device: str, dtype: torch.dtype, t: int = 17, h: int = 7168, k: int = 3):
    from . import ops

    gen = torch.Generator().manual_seed(0)
    rnd = lambda *s: torch.randn(*s, generator=gen).to(dtype=dtype, device=device)  # noqa: E731
    hidden, residual, weight = rnd(t, h), rnd(t, h), rnd(h)
    packed = torch.full((t, k * h), float("nan"), dtype=dtype, device=device)
    want = reference.capture(packed.double().cpu(), 1, hidden.double().cpu(), residual.double().cpu())
    ops.capture_(packed, 1, hidden, residual)
    yield f"capture_ T={t} H={h} K={k} slot 1", _rel_err(packed[:, h:2 * h], want[:, h:2 * h])

    want_h, want_r, _ = reference.fused_add_rmsnorm_capture(hidden.double().cpu(), residual.double().cpu(),
                                                            weight.double().cpu(), 1e-6, packed.double().cpu(), 2)
    ops.fused_add_rmsnorm_capture_(hidden, residual, weight, 1e-6, packed, 2)
    err = max(_rel_err(hidden, want_h), _rel_err(residual, want_r), _rel_err(packed[:, 2 * h:], want_r))
    yield f"fused_add_rmsnorm_capture_ T={t} H={h} slot 2", err

    # draft_fc over the packed buffer just filled, with per-tap norms and a bias (norm-wise error: a projection).
    ops.capture_(packed, 0, rnd(t, h))  # slot 0 was still poisoned
    n = 96
    fc_w = rnd(n, k * h) * (k * h) ** -0.5
    g, b = rnd(k, h) + 1, rnd(n)
    y = ops.draft_fc(packed, fc_w, g, 1e-6, b)
    want = reference.draft_fc(packed.double().cpu(), fc_w.double().cpu(), g.double().cpu(), 1e-6, b.double().cpu())
    yield f"draft_fc M={t} K={k} H={h} N={n} with fc_norm", float((y.double().cpu() - want).norm() / want.norm())


def run(verbose: bool = True) -> bool:
    info = build_info()
    if verbose:
        print("build:", json.dumps(info))
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() and "cuda" in info["backends"] else [])
    if verbose and torch.cuda.is_available() and "cuda" not in info["backends"]:
        print("note: a GPU is present but the extension was built CPU-only; CUDA ops not checked")
    ok = True
    for device in devices:
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            for what, err in _checks(device, dtype):
                good = err <= _TOL[dtype]
                ok &= good
                if verbose:
                    print(f"{'ok  ' if good else 'FAIL'} {device:4s} {str(dtype).replace('torch.', ''):8s} {what}: "
                          f"max rel err {err:.2e} vs float64 reference (tolerance {_TOL[dtype]:.1e})")
    if verbose:
        print("all ops agree with the reference" if ok else "SOME OPS DISAGREE WITH THE REFERENCE")
    return ok
