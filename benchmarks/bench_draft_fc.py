"""Draft fc benchmark on one GPU: ops.draft_fc (per-tap RMSNorm + concat + projection, fused) against
  (a) K torch RMSNorms + torch.cat + F.linear  (what SGLang's fc_norm ModuleList + fc do), and
  (b) plain F.linear on an already normed, concatenated input (the GEMM alone),
all measured in the same run, with weights (and inputs) rotating among copies that one rotation spans >= 4x L2.
Ours and (b) are each measured twice in the order (b), ours, (a), ours, (b) and reported as the mean of the two
(ours_first_us / ours_repeat_us, linear_first_us / linear_repeat_us keep both): the large GEMMs run at the power
limit and the clock drifts within a row.

floor_us = max(bytes / streaming read bandwidth, flops / bf16 matmul rate), both measured here; bytes = weight once
+ inputs + outputs (+ norm weights), flops = 2*M*N*K*H.

  python benchmarks/bench_draft_fc.py --out benchmarks/results/draft_fc-h200.json
"""
from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F

import common  # benchmarks/common.py: the script's own folder is first on sys.path when run as a script

from eagle3_capture import ops, tuning  # noqa: E402


def bench_row(m, n, h, k, dtype, bw, rate, samples, decode_rows, compare_paths=False, compare_kernels=False):
    es = 2
    w_bytes = n * k * h * es
    x_bytes = m * k * h * es
    ncopies, ws, xs, g, normed = common.draft_fc_inputs(m, n, h, k, dtype, seed=m * 7 + n)
    out = torch.empty(m, n, device="cuda", dtype=dtype)

    def ours(i):
        ops.draft_fc(xs[i % ncopies], ws[i % ncopies], g, 1e-6, out=out)

    def base_a(i):
        x = xs[i % ncopies]
        cat = torch.cat([F.rms_norm(c, (h,), g[j], 1e-6) for j, c in enumerate(x.chunk(k, -1))], -1)
        torch.matmul(cat, ws[i % ncopies].t(), out=out)

    def base_b(i):
        torch.matmul(normed[i % ncopies], ws[i % ncopies].t(), out=out)

    sink = torch.empty((), device="cuda", dtype=torch.float32)

    def read_weights(i):  # a plain streaming read of the same weight bytes: what this size allows at best
        torch.sum(ws[i % ncopies], dim=(0, 1), dtype=torch.float32, out=sink)

    ours(0)  # eager warm-up: the decode workspace exists before capture
    # (b), ours, (a), ours, (b): ours and (b) each measured twice, symmetric in time, and each reported as the mean
    # of its two. The large GEMMs run at the GPU's power limit and its clock drifts over a row's seconds, so a fixed
    # order favoured whatever ran first: at M=4096 N=7168 ours moved 1677 -> 1874 us between its two measurements
    # of one run, and ours / (b) read 0.98x to 1.12x across runs (docs/performance.md).
    t_b1 = common.time_graph_us(base_b, ncopies, samples=samples)
    t_ours1 = common.time_graph_us(ours, ncopies, samples=samples)
    t_a = common.time_graph_us(base_a, ncopies, samples=samples)
    t_ours2 = common.time_graph_us(ours, ncopies, samples=samples)
    t_b2 = common.time_graph_us(base_b, ncopies, samples=samples)
    t_ours, t_b = (t_ours1 + t_ours2) / 2, (t_b1 + t_b2) / 2
    t_read = common.time_graph_us(read_weights, ncopies, samples=samples)
    t_other_path = None
    if compare_paths and m <= decode_rows:  # for M on the decode kernel: the same op through normalise + cuBLAS
        ops._set_draft_fc_decode_max_rows(0)
        try:
            ours(0)
            t_other_path = common.time_graph_us(ours, ncopies, samples=samples)
        finally:
            ops._set_draft_fc_decode_max_rows(decode_rows)
    t_kernel = {"cluster": None, "split": None}
    if compare_kernels:  # for M on the decode path: each register decode kernel forced, not auto's choice
        for name in t_kernel if m <= decode_rows else ():
            prev = ops._set_draft_fc_decode_kernel(name)
            try:
                ours(0)
                t_kernel[name] = common.time_graph_us(ours, ncopies, samples=samples)
            finally:
                ops._set_draft_fc_decode_kernel(prev)
    nbytes = w_bytes + x_bytes + m * n * es + k * h * es
    flops = 2.0 * m * n * k * h
    floor = max(nbytes / bw, flops / rate) * 1e6
    row = dict(case="draft_fc_norm", M=m, N=n, H=h, K=k, dtype=str(dtype).replace("torch.", ""),
               ours_us=t_ours, baseline_us=t_a, linear_us=t_b, floor_us=floor, ours_repeat_us=t_ours2,
               ours_first_us=t_ours1, linear_first_us=t_b1, linear_repeat_us=t_b2,
               bytes=nbytes, flops=flops, bound="bytes" if nbytes / bw >= flops / rate else "flops",
               weight_bw_fraction=(w_bytes / (t_ours * 1e-6)) / bw, ours_over_floor=t_ours / floor,
               speedup_vs_a=t_a / t_ours, speedup_vs_b=t_b / t_ours, read_weights_us=t_read,
               ours_cublas_path_us=t_other_path, ours_cluster_kernel_us=t_kernel["cluster"],
               ours_split_kernel_us=t_kernel["split"])
    print(f"  M={m:5d} N={n:5d}: ours {t_ours:9.2f} ({t_ours1:.2f}, {t_ours2:.2f})  (a) {t_a:9.2f}  (b) {t_b:9.2f} "
          f"({t_b1:.2f}, {t_b2:.2f})  "
          f"floor {floor:8.2f} us  weight-bw {row['weight_bw_fraction']:.2f}  sum(W) {t_read:8.2f}"
          + (f"  normalise+cuBLAS {t_other_path:8.2f}" if t_other_path is not None else "")
          + "".join(f"  {k} {v:8.2f}" for k, v in t_kernel.items() if v is not None), flush=True)
    del ws, xs, normed
    torch.cuda.empty_cache()
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.add_draft_fc_shape_args(ap, "1,8,32,64,512,4096")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    ap.add_argument("--samples", type=int, default=25)
    ap.add_argument("--out", default="benchmarks/results/draft_fc-h200.json")
    ap.add_argument("--plot", default=None)
    ap.add_argument("--compare-paths", action="store_true",
                    help="for M on the decode kernel (M <= 16) also time the op through normalise + cuBLAS "
                         "(ours_cublas_path_us)")
    ap.add_argument("--compare-kernels", action="store_true",
                    help="for M on the decode path also time the op with each decode kernel forced (cluster, split) "
                         "instead of auto's choice (ours_cluster_kernel_us, ours_split_kernel_us)")
    ap.add_argument("--decode-max-rows", type=int, default=None,
                    help="rows at or below which the op takes the decode kernels, for this run (0..16; default: the "
                         "library's threshold)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_draft_fc.py needs a CUDA GPU")
    if args.decode_max_rows is not None:
        if not 0 <= args.decode_max_rows <= 16:
            sys.exit(f"--decode-max-rows must be in 0..16, got {args.decode_max_rows}")
        ops._set_draft_fc_decode_max_rows(args.decode_max_rows)
    dtype = getattr(torch, args.dtype)
    bw = common.streaming_read_bandwidth()
    rate = common.matmul_rate()
    print(f"streaming read bandwidth {bw / 1e12:.3f} TB/s, bf16 matmul {rate / 1e12:.0f} TFLOP/s")
    decode_rows = tuning.decode_max_rows()  # the threshold in force: --decode-max-rows, else the device's
    rows = []
    for n in common.int_list(args.N):
        for m in common.int_list(args.M):
            rows.append(bench_row(m, n, args.H, args.K, dtype, bw, rate, args.samples, decode_rows,
                                  args.compare_paths, args.compare_kernels))
    cols = ["M", "N", "ours_us", "baseline_us", "linear_us", "floor_us", "weight_bw_fraction", "speedup_vs_a",
            "speedup_vs_b"]
    common.print_table(rows, cols)
    print(common.markdown_table(rows, cols))
    common.write_results(args.out, rows, {"read_bandwidth_TBps": bw / 1e12, "matmul_TFLOPs": rate / 1e12,
                                          "floor_definition": "max(bytes / read bandwidth, flops / matmul rate)",
                                          "baseline": "(a) K x F.rms_norm + torch.cat + matmul",
                                          "linear": "(b) matmul on the pre-normed concatenated input",
                                          "decode_max_rows": decode_rows})
    common.plot_rows(args.plot or args.out.replace(".json", ".png"), rows, "M",
                     ["ours_us", "baseline_us", "linear_us", "floor_us"], "N", "draft fc", "M (rows)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
