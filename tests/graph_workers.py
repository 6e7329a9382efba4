"""Test-only subprocess bodies for the CUDA-graph tests that need a fresh process: `python graph_workers.py MODE`,
with tests/ on PYTHONPATH. Each prints one JSON line last (the test reads it).

- workspace (test_graphs_draft_fc_cuda.py): the draft fc decode workspace first needed inside a capture, shared by a
  graph captured later and replayed first, on memory the process used before (filled with 0xff, freed, returned to
  the driver) in a pool whose earlier graph scribbles over the scratch it freed.
- gather_trap SIGNAL (test_gather_graphs_cuda.py): two pretend ranks' gathers captured in graphs with the served
  (trap) mode, replayed together, then one rank's graph replayed alone: the kernel must trap (the context is lost,
  the next synchronising call raises) and the host-mapped error word must name the peer and the step.
- gatherer_poll (test_gather_graphs_cuda.py): a one-rank PackedGatherer (p2p kernel, no peers) inside a CUDA graph;
  then its error word set as a timed-out kernel sets it: failure(), check(), gather() and
  tp.raise_if_a_gather_failed() all raise GatherTimeout with the peer and the step, with no CUDA call needed.
"""
from __future__ import annotations

import json
import os
import sys

import torch


def workspace() -> dict:
    from eagle3_capture import ops, reference
    from graph_protocol import random_order

    ops._set_draft_fc_decode_kernel("split")  # the kernel with the workspace (auto would take the cluster kernel)
    K, H, N, eps, dt = 3, 7168, 896, 1e-6, torch.bfloat16
    g = torch.Generator(device="cuda").manual_seed(5)
    w = (torch.randn(N, K * H, generator=g, device="cuda") / (K * H) ** 0.5).to(dt)
    b = torch.randn(N, generator=g, device="cuda").to(dt)
    gw = (1 + 0.2 * torch.randn(K, H, generator=g, device="cuda")).to(dt)
    x = {bs: torch.randn(bs, K * H, generator=g, device="cuda").to(dt) for bs in (2, 4)}
    # Memory that held other data earlier in the process: the driver zeroes fresh memory only across processes.
    dirt = torch.full((256 << 20,), 0xFF, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    del dirt
    torch.cuda.empty_cache()
    pool, stream = torch.cuda.graph_pool_handle(), torch.cuda.Stream()
    graphs, outs = {}, {}
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        graphs["scratch"] = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graphs["scratch"], pool=pool, stream=stream):
            scratch = torch.empty(8 << 20, dtype=torch.uint8, device="cuda")
            scratch.fill_(0xFF)
            del scratch  # freed inside the pool: later captures of the pool may take its memory
        for bs in (4, 2):  # A (bs 4) needs the workspace first; B (bs 2) is captured later and shares it
            graphs[bs] = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graphs[bs], pool=pool, stream=stream):
                outs[bs] = ops.draft_fc(x[bs], w, gw, eps, b)
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    order = ["scratch", 2] + random_order(["scratch", 2, 4], 24, seed=7)
    worst, replays = 0.0, 0
    for i, key in enumerate(order):
        if key != "scratch":
            x[key].copy_(torch.randn(key, K * H, generator=g, device="cuda").to(dt))
            outs[key].fill_(float("nan"))
        graphs[key].replay()
        torch.cuda.synchronize()
        if key == "scratch":
            continue
        want = reference.draft_fc(x[key].double().cpu(), w.double().cpu(), gw.double().cpu(), eps,
                                  b.double().cpu(), round_normed_to=dt)
        got = outs[key].double().cpu()
        if torch.isnan(got).any():
            raise AssertionError(f"replay {i} (bs {key}, order {order[:i + 1]}): the output was never written")
        err = float((got - want).norm() / want.norm())
        worst, replays = max(worst, err), replays + 1
    return {"replays": replays, "expected": sum(1 for k in order if k != "scratch"), "max_rel": worst}


def gather_trap(signal: str) -> dict:
    from eagle3_capture.tp import reference_gather
    from test_gather_protocol_cuda import Ranks, layout_args, local_rows

    world, k, h, t = 2, 3, 256, 4
    rows = [t] * world
    ranks = Ranks(world, world * t, k * h)
    locals_dev = [local_rows(r, t, k * h, 0).cuda() for r in range(world)]
    args = [layout_args("rows", r, world, rows, k, h) for r in range(world)]

    def both_eager():
        for r in range(world):
            ranks.launch(r, locals_dev[r], *args[r], 4, signal, timeout_s=20.0, trap=True)
        ranks.sync()

    both_eager()
    both_eager()  # two warm-ups, as SGLang runs before a capture
    pool = torch.cuda.graph_pool_handle()
    graphs = []
    for r in range(world):
        s = ranks.streams[r]
        s.wait_stream(torch.cuda.current_stream())
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool, stream=s):
            ranks.gather(r, locals_dev[r], *args[r], 4, signal, 0.5, True)
        graphs.append(graph)
    torch.cuda.synchronize()
    replays = 0
    for i in range(1, 31):
        cpu = [local_rows(r, t, k * h, i) for r in range(world)]
        for r in range(world):
            locals_dev[r].copy_(cpu[r])
        ranks.poison()
        torch.cuda.synchronize()
        for r in range(world):
            with torch.cuda.stream(ranks.streams[r]):
                graphs[r].replay()
        ranks.sync()
        want = reference_gather(cpu, "rows", k, h)
        for r in range(world):
            if not torch.equal(ranks.outs[r].cpu(), want):
                raise AssertionError(f"replay {i}: rank {r}'s output differs")
        replays += 1
    before = int(ranks.flags[0][32])  # COMPLETED
    with torch.cuda.stream(ranks.streams[0]):
        graphs[0].replay()  # rank 1 does not take part: rank 0 times out after 0.5 s
    raised = ""
    try:
        ranks.streams[0].synchronize()
        torch.cuda.synchronize()
    except RuntimeError as e:
        raised = str(e).splitlines()[0]
    return {"replays": replays, "completed_before": before, "raised": raised,
            "error": [int(v) for v in ranks.errors[0].tolist()]}


def gatherer_poll() -> dict:
    import torch.distributed as dist

    from eagle3_capture import tp

    store = dist.HashStore()
    dist.init_process_group("nccl", store=store, rank=0, world_size=1, device_id=torch.device("cuda", 0))
    gat = tp.PackedGatherer(None, num_taps=1, hidden_size=256, dtype=torch.bfloat16, max_rows_per_rank=8,
                            layout=tp.COLUMNS, backend="p2p", device="cuda:0")
    out: dict = {"backend": gat.backend, "timeout_s": gat.timeout_s}
    local = torch.randn(8, 256, device="cuda").to(torch.bfloat16)
    gat.gather(local)  # eager warm-up
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=s):
        got = gat.gather(local)
    for _ in range(5):
        local.copy_(torch.randn(8, 256, device="cuda").to(torch.bfloat16))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(got.cpu(), local.cpu())
    tp.raise_if_a_gather_failed()  # nothing failed: no raise
    out["replays_ok"] = True
    gat._error.copy_(torch.tensor([1, 1, 1, 7], dtype=torch.int32))  # what a kernel that timed out writes
    for name, call in (("failure", lambda: gat.failure()), ("poll", tp.raise_if_a_gather_failed),
                       ("check", gat.check), ("gather", lambda: gat.gather(local))):
        try:
            r = call()
            out[name] = f"returned {r!r}"
        except tp.GatherTimeout as e:
            out[name] = "GatherTimeout: " + str(e)
    dist.destroy_process_group()
    return out


if __name__ == "__main__":
    mode = sys.argv[1]
    torch.cuda.set_device(0)
    if mode == "workspace":
        result = workspace()
    elif mode == "gather_trap":
        result = gather_trap(sys.argv[2])
    elif mode == "gatherer_poll":
        result = gatherer_poll()
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    print(json.dumps(result), flush=True)
    os._exit(0)  # after a trap the context is lost: skip the CUDA teardown
