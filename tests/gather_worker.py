"""Worker processes for the gather tests (spawned: this module must import without side effects)."""
from __future__ import annotations

import os
import traceback

import torch
import torch.distributed as dist


def local_data(rank: int, rows: int, cols: int, dtype, device, case: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * case + rank)
    return (torch.randn(rows, cols, generator=g) + rank + 1).to(dtype=dtype, device=device)


CASES = [
    # (layout, rows per rank as a function of world, num_taps, hidden)
    ("rows", lambda w: [5] * w, 3, 16),
    ("rows", lambda w: [(3 * r + 1) % 7 for r in range(w)], 2, 24),     # uneven, some zero
    ("rows", lambda w: [0] * w, 3, 16),                                  # nothing anywhere
    ("columns", lambda w: [4] * w, 3, 48),                               # H/tp columns of each tap
]


def run_cases(rank: int, world: int, device: str, backend: str, results, signal: str = "auto") -> None:
    from eagle3_capture.tp import PackedGatherer, reference_gather

    dtype = torch.bfloat16
    for case, (layout, rows_fn, k, h) in enumerate(CASES):
        rows = rows_fn(world)
        cols = k * h if layout == "rows" else k * h // world
        gat = PackedGatherer(None, num_taps=k, hidden_size=h, dtype=dtype, max_rows_per_rank=max(max(rows), 1),
                             layout=layout, backend=backend, device=device, timeout_s=20.0, signal=signal)
        local = local_data(rank, rows[rank], cols, dtype, device, case)
        out = gat.gather(local, rows_per_rank=rows if layout == "rows" else None)
        gat.check()
        want = reference_gather([local_data(r, rows[r], cols, dtype, "cpu", case) for r in range(world)], layout, k, h)
        got = out.cpu()
        assert got.shape == want.shape, (case, got.shape, want.shape)
        assert torch.equal(got, want), f"case {case} ({layout}, rows {rows}) differs on rank {rank}"
        results.append((rank, case, gat.backend, gat.signal))


def entry(rank: int, world: int, port: int, device: str, backend: str, signal: str, queue) -> None:
    try:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), NCCL_NVLS_ENABLE="0",
                          TORCH_SYMM_MEM_DISABLE_MULTICAST="1")
        if device == "cuda":
            torch.cuda.set_device(rank)
            dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device("cuda", rank))
            device = f"cuda:{rank}"
        else:
            dist.init_process_group("gloo", rank=rank, world_size=world)
        results: list = []
        run_cases(rank, world, device, backend, results, signal)
        dist.barrier()
        dist.destroy_process_group()
        queue.put((rank, "ok", results))
    except BaseException:
        queue.put((rank, "error", traceback.format_exc()))


def graph_and_timeout(rank: int, world: int, port: int, signal: str, queue) -> None:
    """CUDA graph capture and replay of a p2p gather, then a peer that never arrives (rank 1 skips a gather)."""
    try:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), NCCL_NVLS_ENABLE="0",
                          TORCH_SYMM_MEM_DISABLE_MULTICAST="1")
        torch.cuda.set_device(rank)
        dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device("cuda", rank))
        from eagle3_capture.tp import GatherTimeout, PackedGatherer, reference_gather

        dev = f"cuda:{rank}"
        k, h, t = 3, 7168, 64
        gat = PackedGatherer(None, num_taps=k, hidden_size=h, dtype=torch.bfloat16, max_rows_per_rank=t,
                             backend="p2p", device=dev, timeout_s=2.0, signal=signal)
        assert gat.signal == signal, (gat.signal, signal)
        static = local_data(rank, t, k * h, torch.bfloat16, dev, 0)
        gat.gather(static)  # eager warm-up
        gat.check()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = gat.gather(static)
        for trial in range(1, 4):
            static.copy_(local_data(rank, t, k * h, torch.bfloat16, dev, trial))
            gat.output().fill_(float("nan"))
            dist.barrier()  # every rank has poisoned its output before anyone replays
            graph.replay()
            gat.check()
            want = reference_gather([local_data(r, t, k * h, torch.bfloat16, "cpu", trial) for r in range(world)],
                                    "rows", k, h)
            assert torch.equal(out.cpu(), want), f"replay {trial} differs on rank {rank}"
        dist.barrier()
        torch.cuda.synchronize()
        # Timeout: rank 1 does not take part; rank 0 must give up and say who and where.
        message = ""
        if rank == 0:
            # a replay: an eager gather's argument agreement would refuse on the host first (that path is
            # test_gather_agreement.py's); a replay runs only the kernel, whose own timeout must end it
            graph.replay()
            try:
                gat.check()
                message = "no timeout raised"
            except GatherTimeout as e:
                message = str(e)
        dist.barrier()
        queue.put((rank, "ok", message))
        dist.destroy_process_group()
    except BaseException:
        queue.put((rank, "error", traceback.format_exc()))


def probe_failure(rank: int, world: int, port: int, queue) -> None:
    """The p2p probe failing on one rank only (a stand-in for peer writes that never land there): every rank must
    switch to NCCL together and gather correctly."""
    try:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), NCCL_NVLS_ENABLE="0",
                          TORCH_SYMM_MEM_DISABLE_MULTICAST="1")
        torch.cuda.set_device(rank)
        dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device("cuda", rank))
        from eagle3_capture.tp import PackedGatherer, reference_gather

        if rank == 1:
            PackedGatherer._probe_p2p = lambda self: "rank 1: simulated probe failure"
        dev = f"cuda:{rank}"
        gat = PackedGatherer(None, num_taps=2, hidden_size=64, dtype=torch.bfloat16, max_rows_per_rank=4,
                             device=dev, timeout_s=5.0)
        local = local_data(rank, 4, 128, torch.bfloat16, dev, 9)
        out = gat.gather(local)
        want = reference_gather([local_data(r, 4, 128, torch.bfloat16, "cpu", 9) for r in range(world)], "rows", 2, 64)
        assert torch.equal(out.cpu(), want), f"rank {rank}: gathered rows differ after the fallback"
        queue.put((rank, "ok", (gat.backend, gat.plan.reason)))
        dist.barrier()
        dist.destroy_process_group()
    except BaseException:
        queue.put((rank, "error", traceback.format_exc()))
