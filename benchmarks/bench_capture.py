"""Capture benchmark on one GPU: the fused ops against the unfused torch path they replace, measured in one run.

Cases (K taps of one forward, each from its own layer's tensors, into one packed [T, K*H] buffer):
  capture  ours: K x capture_(packed, k, hidden_k, residual_k)
           baseline: K x packed[:, k*H:(k+1)*H].copy_(hidden_k + residual_k)     (SGLang's add + strided copy_)
           bytes: K * (read hidden, read residual, write slot) = 3*K*T*H*elem
  fused    ours: K x fused_add_rmsnorm_capture_(hidden_k, residual_k, w, eps, packed, k)
           baseline: K x (residual += hidden; hidden = rms_norm(residual) * w; packed slot copy_(residual))
           bytes: K * (read h, r; write r, h, slot) = 5*K*T*H*elem (the weight is negligible)
floor_us = bytes / streaming read bandwidth measured here (torch.sum over 4 GiB).

  python benchmarks/bench_capture.py --out benchmarks/results/capture-h200.json
"""
from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F

import common  # benchmarks/common.py: the script's own folder is first on sys.path when run as a script

from eagle3_capture import ops  # noqa: E402


def bench_case(t: int, h: int, k: int, dtype: torch.dtype, bw: float, samples: int) -> list[dict]:
    es = torch.tensor([], dtype=dtype).element_size()
    tap = t * h * es
    n = common.copies_for(2 * k * tap)
    gen = torch.Generator(device="cuda").manual_seed(t)

    def rnd(*shape):
        return torch.randn(*shape, device="cuda", dtype=torch.float32, generator=gen).to(dtype)

    hid = [[rnd(t, h) for _ in range(k)] for _ in range(n)]
    res = [[rnd(t, h) for _ in range(k)] for _ in range(n)]
    w = rnd(h)
    packed = rnd(t, k * h)
    eps = 1e-6

    def cap_ours(i):
        for j in range(k):
            ops.capture_(packed, j, hid[i % n][j], res[i % n][j])

    def cap_base(i):
        for j in range(k):
            packed[:, j * h:(j + 1) * h].copy_(hid[i % n][j] + res[i % n][j])

    def fused_ours(i):
        for j in range(k):
            ops.fused_add_rmsnorm_capture_(hid[i % n][j], res[i % n][j], w, eps, packed, j)

    def fused_base(i):
        for j in range(k):
            r = res[i % n][j]
            r.add_(hid[i % n][j])
            hid[i % n][j].copy_(F.rms_norm(r, (h,), w, eps))
            packed[:, j * h:(j + 1) * h].copy_(r)

    rows = []
    for case, ours, base, nbytes in [("capture", cap_ours, cap_base, 3 * k * tap),
                                     ("fused", fused_ours, fused_base, 5 * k * tap)]:
        t_ours = common.time_graph_us(ours, n, samples=samples)
        t_base = common.time_graph_us(base, n, samples=samples)
        t_ours2 = common.time_graph_us(ours, n, samples=samples)  # a second timing: the run-to-run spread
        floor = nbytes / bw * 1e6
        rows.append(dict(case=case, T=t, H=h, K=k, dtype=str(dtype).replace("torch.", ""), ours_us=t_ours,
                         baseline_us=t_base, floor_us=floor, bytes=nbytes, ours_repeat_us=t_ours2,
                         ours_over_floor=t_ours / floor, speedup_vs_baseline=t_base / t_ours,
                         launches_ours=k))
        print(f"  {case:8s} T={t:5d}: ours {t_ours:9.2f} us (again {t_ours2:9.2f})  baseline {t_base:9.2f} us  "
              f"floor {floor:8.2f} us", flush=True)
    del hid, res
    torch.cuda.empty_cache()
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--T", default="1,64,512,8192", help="token counts (comma separated)")
    ap.add_argument("--H", type=int, default=7168)
    ap.add_argument("--K", type=int, default=3)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--samples", type=int, default=25)
    ap.add_argument("--out", default="benchmarks/results/capture-h200.json")
    ap.add_argument("--plot", default=None, help="PNG path (default: beside --out)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_capture.py needs a CUDA GPU")
    dtype = getattr(torch, args.dtype)
    bw = common.streaming_read_bandwidth()
    print(f"streaming read bandwidth (torch.sum over 4 GiB): {bw / 1e12:.3f} TB/s")
    rows = []
    for t in [int(x) for x in args.T.split(",")]:
        rows += bench_case(t, args.H, args.K, dtype, bw, args.samples)
    cols = ["case", "T", "H", "K", "dtype", "ours_us", "baseline_us", "floor_us", "ours_over_floor",
            "speedup_vs_baseline"]
    common.print_table(rows, cols)
    print(common.markdown_table(rows, cols))
    common.write_results(args.out, rows, {"read_bandwidth_TBps": bw / 1e12,
                                          "floor_definition": "bytes / streaming read bandwidth (torch.sum, 4 GiB)"})
    common.plot_rows(args.plot or args.out.replace(".json", ".png"), rows, "T", ["ours_us", "baseline_us", "floor_us"],
                     "case", "capture", "T (tokens)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
