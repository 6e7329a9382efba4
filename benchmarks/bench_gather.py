"""Two-GPU gather benchmark: PackedGatherer's p2p kernel against NCCL all_gather_into_tensor of the packed buffer
(baseline) and NCCL per tap + copy into the packed slots (per_tap), measured in the same run on every rank.

Rows layout: T is the row count of the packed [T, K*H] buffer every rank ends with (the batch's tokens), split as
evenly as the world size allows (T=1: one rank holds the row, the others none); K taps of H, bf16. NCCL needs equal
parts, so its inputs are padded to ceil(T / world) rows. Times are CUDA-graph replays, median of many, each rank's
own events; the row reports the slower rank. bytes_per_rank = bytes the largest part sends to each peer.

  python benchmarks/bench_gather.py --out benchmarks/results/gather-h200x2.json
  python benchmarks/bench_gather.py --signal flags --out ...   # the protocol for links without native peer atomics
"""
from __future__ import annotations

import argparse
import os
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import common  # benchmarks/common.py: the script's own folder is first on sys.path when run as a script


def timed_graph(fn, reps: int, samples: int) -> float:
    """Median microseconds of one fn() in a graph of `reps` calls, every rank starting each sample together."""
    return common.time_graph_us(lambda _i: fn(), reps, samples=samples, before_sample=dist.barrier)


def worker(rank, world, port, ts, k, h, samples, queue, sweep_blocks=(), signal="auto"):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), NCCL_NVLS_ENABLE="0",
                      TORCH_SYMM_MEM_DISABLE_MULTICAST="1")
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device("cuda", rank))
    from eagle3_capture.tp import PackedGatherer

    rows = []
    dt = torch.bfloat16
    for t in ts:
        parts = [t // world + (1 if r < t % world else 0) for r in range(world)]
        m = max(parts)  # NCCL's equal part per rank
        gat = PackedGatherer(None, num_taps=k, hidden_size=h, dtype=dt, max_rows_per_rank=m, backend="p2p",
                             device=f"cuda:{rank}", timeout_s=30.0, signal=signal)
        padded = torch.zeros(m, k * h, device="cuda", dtype=dt)
        padded[: parts[rank]] = torch.randn(parts[rank], k * h, device="cuda", dtype=torch.float32).to(dt)
        local = padded[: parts[rank]]
        taps = [padded[:, j * h:(j + 1) * h].contiguous() for j in range(k)]
        packed = torch.empty(world * m, k * h, device="cuda", dtype=dt)
        tap_out = [torch.empty(world * m, h, device="cuda", dtype=dt) for _ in range(k)]
        reps = 20 if t <= 1024 else 3

        def ours():
            gat.gather(local, rows_per_rank=parts)

        def nccl_packed():
            dist.all_gather_into_tensor(packed, padded)

        def nccl_per_tap():
            for j in range(k):
                dist.all_gather_into_tensor(tap_out[j], taps[j])
                packed[:, j * h:(j + 1) * h].copy_(tap_out[j])

        t_ours = timed_graph(ours, reps, samples)
        gat.check()
        t_nccl = timed_graph(nccl_packed, reps, samples)
        t_tap = timed_graph(nccl_per_tap, reps, samples)
        t_ours2 = timed_graph(ours, reps, samples)
        gat.check()
        by_blocks = {}
        for b in sweep_blocks:  # the same gather with other grid sizes (the default: the link class's tuned grid)
            other = PackedGatherer(None, num_taps=k, hidden_size=h, dtype=dt, max_rows_per_rank=m, backend="p2p",
                                   device=f"cuda:{rank}", timeout_s=30.0, blocks=b, signal=signal)
            by_blocks[b] = timed_graph(lambda: other.gather(local, rows_per_rank=parts), reps, samples)
            other.check()
            other.close()
        # Correctness of what was timed: the gathered rows equal NCCL's (its padding rows left out).
        gat.gather(local, rows_per_rank=parts)
        nccl_packed()
        torch.cuda.synchronize()
        want = torch.cat([packed.view(world, m, k * h)[r, : parts[r]] for r in range(world)])
        same = bool(torch.equal(gat.output(t), want))
        rows.append(dict(T=t, H=h, K=k, dtype="bfloat16", world=world, rows_per_rank=parts, ours_us=t_ours,
                         ours_repeat_us=t_ours2, baseline_us=t_nccl, per_tap_us=t_tap, bytes_per_rank=m * k * h * 2,
                         matches_nccl=same, signal=gat.signal, link_class=gat.plan.link_class,
                         blocks=gat.blocks, ours_us_by_blocks=by_blocks))
        gat.close()
        del gat
        torch.cuda.empty_cache()
    all_rows = [None] * world
    dist.all_gather_object(all_rows, rows)
    if rank == 0:
        queue.put(all_rows)
    dist.barrier()
    dist.destroy_process_group()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--T", default="1,64,512,8192")
    ap.add_argument("--H", type=int, default=7168)
    ap.add_argument("--K", type=int, default=3)
    ap.add_argument("--samples", type=int, default=30)
    ap.add_argument("--out", default="benchmarks/results/gather-h200x2.json")
    ap.add_argument("--sweep-blocks", default="", help="comma list of other p2p grid sizes to time as well")
    ap.add_argument("--signal", default="auto", choices=["auto", "atomic", "flags"],
                    help="the p2p kernel's arrival signal (auto: atomic where every pair has native peer atomics; "
                         "flags: the protocol for links without them, e.g. PCIe)")
    args = ap.parse_args()
    world = torch.cuda.device_count()
    if world < 2:
        sys.exit("bench_gather.py needs at least two GPUs")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    ts = [int(v) for v in args.T.split(",")]
    sweep = [int(v) for v in args.sweep_blocks.split(",") if v]
    procs = [ctx.Process(target=worker, args=(r, world, port, ts, args.K, args.H, args.samples, q, sweep, args.signal))
             for r in range(world)]
    for p in procs:
        p.start()
    per_rank = q.get(timeout=900)
    for p in procs:
        p.join()

    rows = []
    for i, t in enumerate(ts):
        rs = [per_rank[r][i] for r in range(world)]
        row = dict(rs[0])
        for key in ("ours_us", "ours_repeat_us", "baseline_us", "per_tap_us"):
            row[key] = max(r[key] for r in rs)
        row["matches_nccl"] = all(r["matches_nccl"] for r in rs)
        row["ours_us_by_blocks"] = {b: max(r["ours_us_by_blocks"][b] for r in rs) for b in rs[0]["ours_us_by_blocks"]}
        row["speedup_vs_nccl"] = row["baseline_us"] / row["ours_us"]
        row["per_rank"] = rs
        rows.append(row)
    for row in rows:
        if row["ours_us_by_blocks"]:
            print(f"T={row['T']}: {row['blocks']} blocks {row['ours_us']:.1f} us; " +
                  ", ".join(f"{b} blocks {v:.1f} us" for b, v in row["ours_us_by_blocks"].items()))
    cols = ["T", "world", "ours_us", "ours_repeat_us", "baseline_us", "per_tap_us", "speedup_vs_nccl", "matches_nccl"]
    common.print_table(rows, cols)
    print(common.markdown_table(rows, cols))
    common.write_results(args.out, rows, {"baseline": "NCCL all_gather_into_tensor of the packed [T, K*H] buffer",
                                          "per_tap": "NCCL all_gather per tap + copy_ into the packed slot",
                                          "time": "slower rank's median over CUDA-graph replays"})
    return 0 if all(r["matches_nccl"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
