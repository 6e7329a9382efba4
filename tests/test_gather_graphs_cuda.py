"""The p2p gather's protocol under CUDA graphs, a timeout, and busy SMs, on ONE GPU with pretend ranks (each rank its
own output, flag area and stream; tests/test_gather_protocol_cuda.py has the class). The two-GPU versions are in
tests/test_gather_cuda.py (marker multigpu).

- Blocks of one launch that start after block 0 has ended (SMs held by another stream's kernel) run the same gather
  as the rest: with one SM left free by a busy kernel, a 64-block grid runs a few blocks at a time.
- After a timeout no rank goes on as if gathered: in report mode the timed-out rank's later launches do nothing and
  its peer reports too; in the served mode (trap) a replayed graph whose peer never comes traps the context, and the
  host-mapped error word names the peer and the step (subprocess, tests/graph_workers.py).
- Graphs of both pretend ranks for batch sizes 1..16 x 4 rows (the draft's columns layout at N = 7168), captured as
  SGLang does and replayed hundreds of times in random order with new rows, interleaved with eager gathers, while a
  1024-block grid on another stream keeps SMs busy; each output against the reference.
- The Python side: a one-rank PackedGatherer's error word read without CUDA calls by failure(), check(), gather()
  and tp.raise_if_a_gather_failed() (what the SGLang plugin polls around the draft extend).
"""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time

import pytest
import torch

import busy_sms
from eagle3_capture.tp import COLUMNS, ROWS, reference_gather
from test_gather_protocol_cuda import (ARRIVE_UNIT, COMPLETED, TICKET, Ranks, layout_args, local_rows,
                                       seed_peer_done)

pytestmark = pytest.mark.cuda
HERE = os.path.dirname(os.path.abspath(__file__))


def _worker(*args: str, timeout: int = 240) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([HERE] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    proc = subprocess.run([sys.executable, os.path.join(HERE, "graph_workers.py"), *args], env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("signal", ["atomic", "flags"])
def test_blocks_starting_after_block_0_ended_run_the_same_gather(signal):
    """Rank 1 alone, its peer's gather 1 pre-seeded (so the kernels do not wait on each other: this test also runs
    under compute-sanitizer); a busy kernel holds all SMs but one, so its 256 blocks run a few at a time and most start
    after block 0 finished. Before the fix such a block read the `completed` word block 0 had just written and took
    gather 2. Every block must run gather 1: a block that took gather 2 would wait for rank 0 to enter
    it, time out, and leave its rows unwritten."""
    k, h, t = 3, 512, 256
    rows = [t, t]
    ranks = Ranks(2, 2 * t, k * h)
    mine = local_rows(1, t, k * h, 11)
    ranks.poison()
    seed_peer_done(ranks.flags[1], 0, signal)
    busy = torch.cuda.Stream()
    busy_sms.launch(busy, 2 * (busy_sms.sm_count() - 1), spin_ns=400_000_000)
    time.sleep(0.02)  # the busy blocks take their SMs first
    off, src, dst, seg = layout_args(ROWS, 1, 2, rows, k, h)
    ranks.launch(1, mine.cuda(), off, src, dst, seg, 256, signal, timeout_s=2.0)  # one block per row
    ranks.sync()
    busy.synchronize()
    assert ranks.errors[1].tolist() == [0, 0, 0, 0]
    assert int(ranks.flags[1][COMPLETED]) == 1 and int(ranks.flags[1][TICKET]) == ARRIVE_UNIT
    for r in range(2):  # rank 1's rows landed in both outputs, every block's share of them
        assert torch.equal(ranks.outs[r][t:].cpu(), mine), f"rank 1's rows in rank {r}'s output"


@pytest.mark.parametrize("signal", ["atomic", "flags"])
def test_after_a_timeout_no_rank_delivers_rows_report_mode(signal):
    """Gather 1 on both ranks; gather 2 on rank 0 alone times out; then both ranks launch three more times with new
    rows. A timed-out gather can be neither completed nor undone, so rank 0 must do nothing from then on (its rows
    appear in no output), its error word stays, and rank 1, left waiting for rank 0, reports too. Before the fix
    rank 0 ran gather 2 again, paired with rank 1's late gather 2, and both delivered rows as if nothing happened."""
    k, h, t = 3, 64, 4
    rows = [t, t]
    ranks = Ranks(2, 2 * t, k * h)
    args = [layout_args(ROWS, r, 2, rows, k, h) for r in range(2)]
    cpu = [local_rows(r, t, k * h, 0) for r in range(2)]
    for r in range(2):
        ranks.launch(r, cpu[r].cuda(), *args[r], 4, signal, timeout_s=20.0)
    ranks.sync()
    assert torch.equal(ranks.outs[0].cpu(), reference_gather(cpu, ROWS, k, h))
    ranks.launch(0, cpu[0].cuda(), *args[0], 4, signal, timeout_s=0.3)
    ranks.sync()
    assert ranks.errors[0].tolist() == [1, 1, 1, 2]
    for call in range(3):
        cpu = [local_rows(r, t, k * h, 10 + call) for r in range(2)]
        ranks.poison()
        for r in range(2):
            ranks.launch(r, cpu[r].cuda(), *args[r], 4, signal, timeout_s=0.3)
        ranks.sync()
        for r in range(2):
            assert ranks.outs[r][:t].isnan().all(), f"call {call}: rank 0's rows reached rank {r}'s output"
        assert ranks.errors[0].tolist() == [1, 1, 1, 2], f"call {call}"
        code, peer = ranks.errors[1].tolist()[:2]
        assert code != 0 and peer == 0, f"call {call}: rank 1 did not report: {ranks.errors[1].tolist()}"
        assert int(ranks.flags[0][COMPLETED]) == 1 and int(ranks.flags[1][COMPLETED]) == 1
    assert int(ranks.flags[0][TICKET]) < 0 and int(ranks.flags[1][TICKET]) < 0  # both broken


@pytest.mark.parametrize("signal", ["atomic", "flags"])
def test_a_timed_out_replay_traps_and_names_the_peer(signal):
    """The served mode: graphs of both ranks replayed 30 times (each output checked), then rank 0's graph replayed
    alone. Its kernel must trap after timeout_s (the CUDA context is lost, the next sync raises) and the error word,
    in host memory, must say rank 1 never entered gather 33 (2 warm-ups + 30 replays + 1)."""
    rep = _worker("gather_trap", signal)
    assert rep["replays"] == 30 and rep["completed_before"] == 32, rep
    assert rep["raised"], f"no CUDA error after the timed-out replay: {rep}"
    assert rep["error"] == [1, 1, 1, 33], rep


def test_packed_gatherer_error_word_raises_without_cuda_calls():
    rep = _worker("gatherer_poll")
    assert rep["backend"] == "p2p" and rep["replays_ok"], rep
    assert rep["timeout_s"] == 600.0, rep  # torch's default NCCL timeout
    for name in ("failure", "poll", "check", "gather"):
        text = rep[name]
        if name == "failure":
            assert "timed out after 600 s in gather #7" in text and "(rank 1)" in text, rep
            continue
        assert text.startswith("GatherTimeout:") and "gather #7" in text and "enter the gather" in text, (name, rep)


@pytest.mark.parametrize("signal", ["atomic", "flags"])
def test_graph_replays_random_order_with_busy_sms(signal):
    """Both pretend ranks' column gathers (N = 7168 over 2 ranks) captured for batch sizes 1..16 x 4 rows in one
    pool, replayed in random order with new rows, interleaved with eager gathers, while a 1024-block grid on
    another stream keeps SMs busy in waves; each output against the reference."""
    world, k, h = 2, 1, 7168
    sizes = [4 * bs for bs in range(1, 17)]
    cols = k * h // world
    ranks = Ranks(world, max(sizes), k * h)
    bufs = [torch.zeros(max(sizes), cols, dtype=torch.bfloat16, device="cuda") for _ in range(world)]
    args = [layout_args(COLUMNS, r, world, [0] * world, k, h) for r in range(world)]
    blocks = 264  # the H200's NVLink grid (2 x 132 SMs)

    def both(t: int, eager: bool) -> None:
        for r in range(world):
            ranks.launch(r, bufs[r][:t], *args[r], blocks, signal, timeout_s=20.0)
        ranks.sync()

    pool = torch.cuda.graph_pool_handle()
    graphs = {}
    for t in sorted(sizes, reverse=True):
        both(t, True)
        both(t, True)  # SGLang's two warm-ups
        for r in range(world):
            s = ranks.streams[r]
            s.wait_stream(torch.cuda.current_stream())
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=pool, stream=s):
                ranks.gather(r, bufs[r][:t], *args[r], blocks, signal, 20.0)
            graphs[t, r] = g
    torch.cuda.synchronize()
    rng = random.Random(5 + len(signal))
    busy = torch.cuda.Stream()
    steps = int(os.environ.get("E3_GATHER_GRAPH_STEPS", "300"))
    for step in range(steps):
        t = rng.choice(sizes)
        cpu = [local_rows(r, t, cols, 1000 * step + t) for r in range(world)]
        for r in range(world):
            bufs[r][:t].copy_(cpu[r])
        ranks.poison()
        torch.cuda.synchronize()
        if step % 3 == 0:
            busy_sms.launch(busy, 1024, spin_ns=20_000)  # waves of SM-filling blocks while the gathers run
        if rng.random() < 0.2:
            both(t, True)  # an eager gather between replays
        else:
            for r in rng.sample(range(world), world):
                with torch.cuda.stream(ranks.streams[r]):
                    graphs[t, r].replay()
            ranks.sync()
        want = reference_gather(cpu, COLUMNS, k, h)
        for r in range(world):
            assert ranks.errors[r].tolist() == [0, 0, 0, 0], f"step {step} rank {r}: {ranks.errors[r].tolist()}"
            assert torch.equal(ranks.outs[r][:t].cpu(), want), f"step {step} (T = {t}), rank {r}"
    busy.synchronize()
    done = int(ranks.flags[0][COMPLETED])
    assert done == int(ranks.flags[1][COMPLETED]) == 2 * len(sizes) + steps
