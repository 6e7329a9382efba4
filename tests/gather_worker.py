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


def _init(rank: int, world: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), NCCL_NVLS_ENABLE="0",
                      TORCH_SYMM_MEM_DISABLE_MULTICAST="1")
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device("cuda", rank))


def _store():
    """The process group's key-value store: host-side, so it still works on a rank whose CUDA context trapped."""
    from torch.distributed import distributed_c10d as c10d

    return c10d._get_process_group_store(c10d._get_default_group())


def graph_and_timeout(rank: int, world: int, port: int, signal: str, queue) -> None:
    """CUDA graph capture and replay of a p2p gather, then a peer that never arrives (rank 1 skips a replay): rank
    0's kernel traps after timeout_s, and check() raises a GatherTimeout naming rank 1 and the step, chained to the
    CUDA error. After the trap rank 0's CUDA context is lost: the ranks finish through the host-side store only."""
    try:
        _init(rank, world, port)
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
        # Timeout: rank 1 does not take part; rank 0 must give up loudly and say who and where.
        message, cause = "", ""
        if rank == 0:
            # a replay: an eager gather's argument agreement would refuse on the host first (that path is
            # test_gather_agreement.py's); a replay runs only the kernel, whose own timeout must end it
            graph.replay()
            try:
                gat.check()
                message = "no timeout raised"
            except GatherTimeout as e:
                message, cause = str(e), repr(e.__cause__)
            _store().set("graph_and_timeout_done", "1")
        else:
            _store().wait(["graph_and_timeout_done"])
        queue.put((rank, "ok", (message, cause)))
    except BaseException:
        queue.put((rank, "error", traceback.format_exc()))
    os._exit(0)  # rank 0's context is lost; NCCL's teardown would fail there


def _columns_case(rank: int, world: int, t: int, cols: int, case: int, dev) -> torch.Tensor:
    return local_data(rank, t, cols, torch.bfloat16, dev, case)


def graph_stress(rank: int, world: int, port: int, signal: str, steps: int, queue) -> None:
    """The draft's column gather (N = 7168 over the ranks) captured for batch sizes 1..16 x 4 rows in one pool,
    replayed `steps` times in a seeded random order (the same on every rank) with new rows, one in five steps an
    eager gather instead, and every third step a 1024-block grid on another stream keeping SMs busy (tests/busy_sms.py).
    Each output equals NCCL's all_gather of the same rows (gathered per column shard, laid out as the draft's fc
    does)."""
    try:
        import random

        import busy_sms
        _init(rank, world, port)
        from eagle3_capture.tp import COLUMNS, PackedGatherer

        dev = torch.device("cuda", rank)
        h = 7168
        cols = h // world
        sizes = [4 * bs for bs in range(1, 17)]
        gat = PackedGatherer(None, num_taps=1, hidden_size=h, dtype=torch.bfloat16, max_rows_per_rank=max(sizes),
                             layout=COLUMNS, backend="p2p", device=dev, timeout_s=30.0, signal=signal)
        assert gat.backend == "p2p" and gat.signal == signal, (gat.backend, gat.signal)
        buf = torch.zeros(max(sizes), cols, dtype=torch.bfloat16, device=dev)
        pool = torch.cuda.graph_pool_handle()
        cap = torch.cuda.Stream(dev)
        graphs, outs = {}, {}
        for t in sorted(sizes, reverse=True):  # SGLang: largest first, two eager warm-ups each, one pool
            cap.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(cap):
                for _ in range(2):
                    torch.cuda.synchronize()
                    gat.gather(buf[:t])
                graphs[t] = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graphs[t], pool=pool, stream=cap):
                    outs[t] = gat.gather(buf[:t])
            torch.cuda.current_stream().wait_stream(cap)
        gat.check()
        rng = random.Random(1234)  # the same sequence on every rank
        busy = torch.cuda.Stream(dev)
        nccl_parts = torch.empty(world * max(sizes), cols, dtype=torch.bfloat16, device=dev)
        replays = eager = 0
        for step in range(steps):
            t = rng.choice(sizes)
            use_eager = rng.random() < 0.2
            buf[:t].copy_(_columns_case(rank, world, t, cols, 100000 + step, dev))
            gat.output().fill_(float("nan"))
            dist.barrier()  # every rank has poisoned its output before anyone gathers
            if step % 3 == 0:
                busy_sms.launch(busy, 1024, spin_ns=20_000)
            if use_eager:
                got = gat.gather(buf[:t])
                eager += 1
            else:
                graphs[t].replay()
                got = outs[t]
                replays += 1
            gat.check()
            dist.all_gather_into_tensor(nccl_parts[: world * t], buf[:t].contiguous())
            want = nccl_parts[: world * t].view(world, t, cols).permute(1, 0, 2).reshape(t, h)
            if not torch.equal(got, want):
                bad = (got != want).any(dim=1).nonzero().flatten().tolist()
                raise AssertionError(f"rank {rank} step {step} (T = {t}, {'eager' if use_eager else 'replay'}): "
                                     f"rows {bad[:8]} differ from NCCL's all_gather")
        busy.synchronize()
        dist.barrier()
        queue.put((rank, "ok", {"replays": replays, "eager": eager, "signal": gat.signal}))
        gat.close()
        dist.destroy_process_group()
    except BaseException:
        queue.put((rank, "error", traceback.format_exc()))


def sleeper(rank: int, world: int, port: int, signal: str, queue) -> None:
    """Replays go on, as SGLang's loop replays them (no check() after each), while one rank (the last) sleeps past
    timeout_s before replay 20. Each output is read back and compared with the reference; before each replay the
    error words are polled as the plugin polls them around the draft extend. The replay that cannot complete must
    end loudly on every rank: the waiting rank's kernel traps (its next read raises, and the error word says why),
    the sleeper's replay then waits for a peer that is gone and traps too. Never rows that differ: before the fix
    the waiting rank ran its next replay one gather behind, paired with the sleeper's late one."""
    try:
        import time

        _init(rank, world, port)
        from eagle3_capture import tp

        dev = torch.device("cuda", rank)
        k, h, t, timeout_s = 1, 4096, 8, 2.0
        gat = tp.PackedGatherer(None, num_taps=k, hidden_size=h, dtype=torch.bfloat16, max_rows_per_rank=t,
                                backend="p2p", device=dev, timeout_s=timeout_s, signal=signal)
        static = local_data(rank, t, k * h, torch.bfloat16, dev, 0)
        gat.gather(static)
        gat.check()
        s = torch.cuda.Stream(dev)
        s.wait_stream(torch.cuda.current_stream())
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=s):
            out = gat.gather(static)
        checked, outcome = 0, "no error"
        for i in range(1, 41):
            try:
                tp.raise_if_a_gather_failed()
                static.copy_(local_data(rank, t, k * h, torch.bfloat16, dev, i))
                if i == 20 and rank == world - 1:
                    time.sleep(3 * timeout_s)
                graph.replay()
                got = out.cpu()
            except tp.GatherTimeout as e:
                outcome = f"GatherTimeout at replay {i}: {e}"
                break
            except RuntimeError as e:
                why = gat.failure()
                outcome = (f"GatherTimeout at replay {i}: {why}" if why else
                           f"CUDA error at replay {i} without a gather error word: {e}")
                break
            want = tp.reference_gather([local_data(r, t, k * h, torch.bfloat16, "cpu", i) for r in range(world)],
                                       "rows", k, h)
            if not torch.equal(got, want):
                outcome = f"WRONG ROWS at replay {i}"
                break
            checked += 1
        store = _store()
        store.set(f"sleeper_done_{rank}", outcome)
        store.wait([f"sleeper_done_{r}" for r in range(world)])  # stay alive (peer memory mapped) until all are done
        queue.put((rank, "ok", (checked, outcome)))
    except BaseException:
        queue.put((rank, "error", traceback.format_exc()))
    os._exit(0)  # a trapped context cannot tear NCCL down


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
