"""The p2p gather kernel's own cost on ONE GPU: a one-rank PackedGatherer (world 1: no peers, so no waits and no
peer stores; what remains is the kernel's launch, its gather number, fences and the local copy of the rows) against
torch's copy_ of the same rows into the same buffer, in the same run. For comparing two builds of the kernel on a
machine with one GPU (the two-GPU gather against NCCL is bench_gather.py): run it once per build with --label.

Rows layout, K taps of H, bf16; times are CUDA-graph replays of `--reps` calls, median over `--samples` replays. The
rows stay in L2 at these sizes: the figures are fixed costs, not bandwidth.

  python benchmarks/bench_gather_one_gpu.py --label after --out benchmarks/results/gather-one-gpu-h200.json
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import torch.distributed as dist

import common  # benchmarks/common.py: the script's own folder is first on sys.path when run as a script


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--T", default="1,8,64,512")
    ap.add_argument("--H", type=int, default=7168)
    ap.add_argument("--K", type=int, default=3)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--samples", type=int, default=30)
    ap.add_argument("--label", required=True, help="which build this is (e.g. before / after)")
    ap.add_argument("--out", required=True, help="JSON file; an existing file gets this label's rows added")
    args = ap.parse_args()
    from eagle3_capture.tp import PackedGatherer

    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1, device_id=torch.device("cuda", 0))
    rows = []
    for t in common.int_list(args.T):
        gat = PackedGatherer(None, num_taps=args.K, hidden_size=args.H, dtype=torch.bfloat16, max_rows_per_rank=t,
                             backend="p2p", device="cuda:0", timeout_s=30.0)
        local = torch.randn(t, args.K * args.H, device="cuda").to(torch.bfloat16)
        out = gat.output(t)
        ours = common.time_graph_us(lambda _i: gat.gather(local), args.reps, samples=args.samples)
        gat.check()
        copy = common.time_graph_us(lambda _i: out.copy_(local), args.reps, samples=args.samples)
        gat.gather(local)
        torch.cuda.synchronize()
        rows.append(dict(T=t, K=args.K, H=args.H, ours_us=ours, copy_us=copy, blocks=gat.blocks,
                         signal=gat.signal, matches=bool(torch.equal(gat.output(t), local)), build=args.label))
        gat.close()
    dist.destroy_process_group()
    common.print_table(rows, ["build", "T", "ours_us", "copy_us", "blocks", "matches"])
    previous = []
    if os.path.exists(args.out):
        with open(args.out) as f:
            previous = [r for r in json.load(f)["rows"] if r.get("build") != args.label]
    common.write_results(args.out, previous + rows,
                         {"baseline": "torch copy_ of the same rows into the gatherer's output",
                          "time": "median over CUDA-graph replays of --reps calls"})
    return 0 if all(r["matches"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
