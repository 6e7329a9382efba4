"""Probe for the draft fc's prefill path (a measurement for planning, not a product path): how close could a
per-tap form come to (b) if the per-(row, tap) sums of squares arrived from the capture ops and the norm weights were
folded into the fc weight at load time? Then y = sum_k rrms_k[m] * (x_k @ (W_k * g_k)^T), and no pass over x is
needed: K GEMMs on strided views of the packed buffer (one batched call) plus a small combine. Timed in one run, all
with CUDA-graph replays and rotating copies (one rotation >= 4x L2):

  b           F.linear on an already normed, concatenated input (the issue's baseline (b))
  ours        ops.draft_fc as it is (normalise pass + cuBLAS)
  tap_gemm    the K per-tap GEMMs alone: torch.bmm over strided [K, M, H] x [K, H, N] views, fp32 outputs when
              this torch's bmm takes out_dtype (else bf16)
  tap_form    tap_gemm + the combine (rrms scaling, sum over taps, bias-free) in torch: three kernels, an upper
              bound for one fused combine
  sum_sq      one pass over x computing the [M, K] root sums of squares (torch.linalg.vector_norm): what the
              capture ops would have to emit, timed here as a separate pass

  python benchmarks/probe_prefill_forms.py --out benchmarks/results/draft_fc-prefill-forms-h200.json
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

from eagle3_capture import ops  # noqa: E402


def bmm_out_dtype_supported() -> bool:
    a = torch.randn(1, 16, 16, device="cuda", dtype=torch.bfloat16)
    try:
        return torch.bmm(a, a, out_dtype=torch.float32).dtype == torch.float32
    except (TypeError, RuntimeError):
        return False


def row(m, n, h, k, samples, fp32_out):
    dt = torch.bfloat16
    ncopies, ws, xs, g, normed = common.draft_fc_inputs(m, n, h, k, dt, seed=m + n)
    rr = [torch.rsqrt(x.float().view(m, k, h).pow(2).mean(-1) + 1e-6) for x in xs]  # [M, K], as if handed over
    out = torch.empty(m, n, device="cuda", dtype=dt)
    taps_out = torch.empty(k, m, n, device="cuda", dtype=torch.float32 if fp32_out else dt)
    ss = torch.empty(m, k, device="cuda", dtype=torch.float32)

    def tap_gemm(i):
        a = xs[i % ncopies].view(m, k, h).transpose(0, 1)          # [K, M, H], strides (H, K*H, 1): no copy
        b = ws[i % ncopies].view(n, k, h).permute(1, 2, 0)         # [K, H, N], strides (H, 1, K*H): no copy
        if fp32_out:
            torch.bmm(a, b, out_dtype=torch.float32, out=taps_out)
        else:
            torch.bmm(a, b, out=taps_out)

    def tap_form(i):  # the combine in torch (a product, a sum, a cast): an upper bound for one fused kernel
        tap_gemm(i)
        out.copy_(torch.sum(taps_out * rr[i % ncopies].t().unsqueeze(-1), dim=0, dtype=torch.float32))

    t = {
        "b": common.time_graph_us(lambda i: torch.matmul(normed[i % ncopies], ws[i % ncopies].t(), out=out), ncopies,
                                  samples=samples),
        "ours": common.time_graph_us(lambda i: ops.draft_fc(xs[i % ncopies], ws[i % ncopies], g, 1e-6, out=out),
                                     ncopies, samples=samples),
        "tap_gemm": common.time_graph_us(tap_gemm, ncopies, samples=samples),
        "tap_form": common.time_graph_us(tap_form, ncopies, samples=samples),
        "sum_sq": common.time_graph_us(  # one read of x, fp32 accumulation: the root of the sums of squares
            lambda i: torch.linalg.vector_norm(xs[i % ncopies].view(m, k, h), dim=-1, dtype=torch.float32, out=ss),
            ncopies, samples=samples),
    }
    r = dict(M=m, N=n, H=h, K=k, tap_out_dtype="float32" if fp32_out else "bfloat16",
             **{f"{key}_us": v for key, v in t.items()},
             ours_over_b=t["ours"] / t["b"], tap_gemm_over_b=t["tap_gemm"] / t["b"],
             tap_form_over_b=t["tap_form"] / t["b"])
    print(f"  M={m:5d} N={n:5d}: (b) {t['b']:8.1f}  ours {t['ours']:8.1f} ({r['ours_over_b']:.2f}x)  tap GEMMs "
          f"{t['tap_gemm']:8.1f} ({r['tap_gemm_over_b']:.2f}x)  + combine {t['tap_form']:8.1f} "
          f"({r['tap_form_over_b']:.2f}x)  sums of squares {t['sum_sq']:7.1f} us", flush=True)
    del ws, xs, normed, rr
    torch.cuda.empty_cache()
    return r


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_draft_fc_shape_args(ap, "512,4096")
    ap.add_argument("--samples", type=int, default=11)
    ap.add_argument("--out", default=None, help="results JSON")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("probe_prefill_forms.py needs a CUDA GPU")
    fp32_out = bmm_out_dtype_supported()
    print(f"per-tap GEMM outputs in {'float32' if fp32_out else 'bfloat16 (this torch has no bmm out_dtype)'}")
    rows = [row(m, n, args.H, args.K, args.samples, fp32_out)
            for n in common.int_list(args.N) for m in common.int_list(args.M)]
    if args.out:
        common.write_results(args.out, rows, {"note": "planning probe; see the module docstring"})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
