"""Tensor helpers for the op tests: random data, poisoned outputs, strided views, tolerances."""
from __future__ import annotations

import torch

DTYPES = [torch.float32, torch.float16, torch.bfloat16]

# Elementwise tolerance of one rounding to the storage dtype (relative), with a small absolute floor.
RTOL = {torch.float32: 2e-5, torch.float16: 1.0 / 1024, torch.bfloat16: 1.0 / 128}


def randn(shape, dtype, device, gen, scale=1.0):
    """Non-zero random data (never zeros: they hide unwritten outputs)."""
    t = torch.randn(shape, generator=gen, dtype=torch.float32) * scale
    return t.to(dtype=dtype, device=device)


def strided_rows(rows, cols, dtype, device, gen, row_pad=0, col_offset=0, scale=1.0):
    """A [rows, cols] view with row stride cols+row_pad+col_offset that starts col_offset elements into its
    storage: covers row-strided and misaligned starts. Returns (view, base) where base is the whole storage."""
    base = randn((rows, cols + row_pad + col_offset), dtype, device, gen, scale)
    return base[:, col_offset:col_offset + cols], base


def assert_close_rel(actual, expected64, dtype, what, rtol=None):
    """|actual - expected| <= rtol*|expected| + atol elementwise, expected in float64; NaN never passes."""
    rtol = RTOL[dtype] if rtol is None else rtol
    a = actual.to(torch.float64).cpu()
    e = expected64.to(torch.float64).cpu()
    assert not torch.isnan(a).any(), f"{what}: NaN in output (unwritten poison?)"
    atol = rtol * 1e-3 * max(1.0, float(e.abs().max()) if e.numel() else 1.0)
    err = (a - e).abs()
    bad = err > rtol * e.abs() + atol
    if bad.any():
        idx = bad.nonzero()[0].tolist()
        raise AssertionError(f"{what}: {int(bad.sum())} of {a.numel()} elements off; first at {idx}: "
                             f"got {a[tuple(idx)].item()}, want {e[tuple(idx)].item()} (rtol {rtol})")


def bits(t):
    """Bit pattern view for exact comparisons that treat NaN payloads as values."""
    return t.view(torch.int32) if t.dtype == torch.float32 else t.view(torch.int16)
