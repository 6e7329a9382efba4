"""Where the draft fc's prefill time goes (a measurement for planning): per-kernel device times of ops.draft_fc
(normalise kernel, then cuBLAS) from the torch profiler, averaged over repeated eager calls, next to the bytes the
normalise pass must move (x read, xn written) and the streaming read bandwidth measured in the same run.

  python benchmarks/profile_draft_fc_prefill.py --out benchmarks/results/draft_fc-prefill-profile-h200.json
"""
from __future__ import annotations

import argparse
import os
import sys

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

from eagle3_capture import ops  # noqa: E402


def kernel_times_us(fn, calls: int) -> dict[str, float]:
    """Mean device microseconds per call of each CUDA kernel fn() launches (name cut to 80 characters)."""
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    total: dict[str, float] = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            total[e.name[:80]] = total.get(e.name[:80], 0.0) + e.device_time_total
    return {name: t / calls for name, t in total.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.add_draft_fc_shape_args(ap, "512,4096")
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--out", default="benchmarks/results/draft_fc-prefill-profile-h200.json")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("profile_draft_fc_prefill.py needs a CUDA GPU")
    bw = common.streaming_read_bandwidth()
    rows = []
    for n in common.int_list(args.N):
        for m in common.int_list(args.M):
            gen = torch.Generator(device="cuda").manual_seed(m + n)
            x = torch.randn(m, args.K * args.H, device="cuda", generator=gen).bfloat16()
            w = (torch.randn(n, args.K * args.H, device="cuda", generator=gen) * (args.K * args.H) ** -0.5).bfloat16()
            g = (torch.randn(args.K, args.H, device="cuda", generator=gen) + 1).bfloat16()
            for _ in range(3):
                ops.draft_fc(x, w, g, 1e-6)
            times = kernel_times_us(lambda: ops.draft_fc(x, w, g, 1e-6), args.calls)
            norm_us = sum(t for name, t in times.items() if "draft_fc_normalize_kernel" in name)
            pass_bytes = 2 * m * args.K * args.H * 2
            rows.append(dict(M=m, N=n, H=args.H, K=args.K, kernels_us=times, normalize_us=norm_us,
                             normalize_bytes=pass_bytes, normalize_floor_us=pass_bytes / bw * 1e6,
                             gemm_us=sum(times.values()) - norm_us))
            print(f"  M={m:5d} N={n:5d}: normalise {norm_us:8.1f} us (floor {rows[-1]['normalize_floor_us']:7.1f}), "
                  f"GEMM kernels {rows[-1]['gemm_us']:8.1f} us", flush=True)
    common.write_results(args.out, rows, {"read_bandwidth_TBps": bw / 1e12,
                                          "method": "torch profiler device times, mean over eager calls"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
