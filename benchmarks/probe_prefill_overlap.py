"""Probe for the draft fc's prefill path (a measurement for planning, not a product path): can the normalise pass
hide under the GEMM if both are cut into row chunks on two streams (chunk j + 1 normalised while chunk j's GEMM
runs)? The normalise is stood in for by one elementwise pass with its bytes (read x, write xn: torch.mul by a
[K*H] vector), so the probe needs no build. Timed in one run, CUDA-graph replays, rotating copies (one rotation
>= 4x L2):

  b          F.linear on an already normed, concatenated input (the issue's baseline (b))
  ours       ops.draft_fc as it is (our normalise kernel, then cuBLAS, one stream)
  pass       the stand-in normalise pass alone
  seq        pass, then the GEMM (one stream): the stand-in for `ours`
  overlap_c  c row chunks: the pass of chunk j + 1 on a side stream while chunk j's GEMM runs

  python benchmarks/probe_prefill_overlap.py --out benchmarks/results/draft_fc-prefill-overlap-h200.json
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

from eagle3_capture import ops  # noqa: E402


def row(m, n, h, k, samples, chunk_counts):
    dt = torch.bfloat16
    ncopies, ws, xs, g, normed = common.draft_fc_inputs(m, n, h, k, dt, seed=m + n)
    gcat = g.reshape(-1)
    xn = torch.empty(m, k * h, device="cuda", dtype=dt)
    out = torch.empty(m, n, device="cuda", dtype=dt)
    side = torch.cuda.Stream()

    def b(i):
        torch.matmul(normed[i % ncopies], ws[i % ncopies].t(), out=out)

    def ours(i):
        ops.draft_fc(xs[i % ncopies], ws[i % ncopies], g, 1e-6, out=out)

    def pass_(i):
        torch.mul(xs[i % ncopies], gcat, out=xn)

    def seq(i):
        pass_(i)
        torch.matmul(xn, ws[i % ncopies].t(), out=out)

    def overlap(c):
        bounds = [m * j // c for j in range(c + 1)]
        events = [torch.cuda.Event() for _ in range(c)]

        def step(i):
            x, w = xs[i % ncopies], ws[i % ncopies]
            main = torch.cuda.current_stream()
            side.wait_stream(main)
            with torch.cuda.stream(side):
                for j in range(c):
                    lo, hi = bounds[j], bounds[j + 1]
                    torch.mul(x[lo:hi], gcat, out=xn[lo:hi])
                    events[j].record(side)
            for j in range(c):
                lo, hi = bounds[j], bounds[j + 1]
                main.wait_event(events[j])
                torch.matmul(xn[lo:hi], w.t(), out=out[lo:hi])
            main.wait_stream(side)

        return step

    t = {}
    # b and ours first and last: the flop-bound rows drift with the clock over a row's seconds.
    t["b"] = common.time_graph_us(b, ncopies, samples=samples)
    t["ours"] = common.time_graph_us(ours, ncopies, samples=samples)
    t["pass"] = common.time_graph_us(pass_, ncopies, samples=samples)
    t["seq"] = common.time_graph_us(seq, ncopies, samples=samples)
    for c in chunk_counts:
        t[f"overlap_{c}"] = common.time_graph_us(overlap(c), ncopies, samples=samples)
    t["ours_repeat"] = common.time_graph_us(ours, ncopies, samples=samples)
    t["b_repeat"] = common.time_graph_us(b, ncopies, samples=samples)
    bm = (t["b"] + t["b_repeat"]) / 2
    r = dict(M=m, N=n, H=h, K=k, **{f"{key}_us": v for key, v in t.items()})
    r.update({f"{key}_over_b": v / bm for key, v in t.items() if not key.startswith("b")})
    print(f"  M={m:5d} N={n:5d}: " + "  ".join(f"{key} {v:8.1f}" for key, v in t.items())
          + "  | over b: " + "  ".join(f"{key} {v / bm:.3f}" for key, v in t.items() if not key.startswith("b")),
          flush=True)
    del ws, xs, normed
    torch.cuda.empty_cache()
    return r


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.add_draft_fc_shape_args(ap, "512,4096")
    ap.add_argument("--chunks", default="2,4,8")
    ap.add_argument("--samples", type=int, default=11)
    ap.add_argument("--out", default="benchmarks/results/draft_fc-prefill-overlap-h200.json")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("probe_prefill_overlap.py needs a CUDA GPU")
    chunks = common.int_list(args.chunks)
    rows = [row(m, n, args.H, args.K, args.samples, chunks)
            for n in common.int_list(args.N) for m in common.int_list(args.M)]
    common.write_results(args.out, rows, {"stand_in": "torch.mul(x, g.flatten()) for the normalise pass",
                                          "baseline": "(b) matmul on the pre-normed concatenated input"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
