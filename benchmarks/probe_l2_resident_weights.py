"""Probe for the draft fc's M = 16-64 rows at small N (a measurement for planning, not a product path): would the
normalise + cuBLAS path reach (b) if the normalise kernel also pulled the fc weight into L2 (it fits at N=896: 38.5
MB of the H200's 60 MB), so that cuBLAS then reads it from L2? Timed in one run, CUDA-graph replays, rotating copies
(one rotation >= 4x L2):

  b             F.linear on an already normed, concatenated input, weights cold (the issue's baseline (b))
  hot           the same GEMM on one weight copy, replayed: the weight stays in L2
  read_w        torch.sum over the weight copy: a stand-in for a kernel that pulls it into L2
  read_then_mm  read_w, then (b) on the same copy
  ours          ops.draft_fc as it is (normalise kernel + cuBLAS)

  python benchmarks/probe_l2_resident_weights.py --out benchmarks/results/draft_fc-l2-resident-h200.json
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

from eagle3_capture import ops  # noqa: E402


def row(m, n, h, k, samples):
    ncopies, ws, xs, g, normed = common.draft_fc_inputs(m, n, h, k, torch.bfloat16, seed=m + n)
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    sink = torch.empty((), device="cuda", dtype=torch.float32)

    def b(i):
        torch.matmul(normed[i % ncopies], ws[i % ncopies].t(), out=out)

    def hot(i):
        torch.matmul(normed[0], ws[0].t(), out=out)

    def read_w(i):
        torch.sum(ws[i % ncopies], dim=(0, 1), dtype=torch.float32, out=sink)

    def read_then_mm(i):
        read_w(i)
        b(i)

    def ours(i):
        ops.draft_fc(xs[i % ncopies], ws[i % ncopies], g, 1e-6, out=out)

    t = {"b": common.time_graph_us(b, ncopies, samples=samples)}
    for name, fn in (("hot", hot), ("read_w", read_w), ("read_then_mm", read_then_mm), ("ours", ours)):
        t[name] = common.time_graph_us(fn, ncopies, samples=samples)
    t["b_repeat"] = common.time_graph_us(b, ncopies, samples=samples)
    print(f"  M={m:3d} N={n:5d}: " + "  ".join(f"{key} {v:7.2f}" for key, v in t.items()), flush=True)
    return dict(M=m, N=n, H=h, K=k, weight_bytes=n * k * h * 2, **{f"{key}_us": v for key, v in t.items()})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.add_draft_fc_shape_args(ap, "16,64")
    ap.set_defaults(N="896")
    ap.add_argument("--samples", type=int, default=11)
    ap.add_argument("--out", default="benchmarks/results/draft_fc-l2-resident-h200.json")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("probe_l2_resident_weights.py needs a CUDA GPU")
    rows = [row(m, n, args.H, args.K, args.samples) for n in common.int_list(args.N) for m in common.int_list(args.M)]
    common.write_results(args.out, rows, {"l2_bytes": common.l2_bytes(),
                                          "baseline": "(b) matmul on the pre-normed concatenated input, cold weights"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
