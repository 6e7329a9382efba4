"""PackedGatherer on every GPU of the machine, one rank each (marker multigpu: 2 on kind nvidia-h200-x2, 4 or 8 on the
larger kinds): the p2p kernel with each arrival signal (atomic: needs native peer atomics; flags: plain stores, the
PCIe protocol, forced on here) and the NCCL fallback against the reference for every layout case, CUDA-graph replay,
a peer that never arrives (the kernel traps, the GatherTimeout names it), thousands of graph replays against NCCL's
all_gather with another stream's kernels keeping SMs busy, and a rank sleeping past the timeout while replays go on
(loud on every rank, never wrong rows). The one-GPU versions with pretend ranks: tests/test_gather_graphs_cuda.py."""
from __future__ import annotations

import os

import pytest
import torch

import gather_worker
from test_gather import spawn

pytestmark = [pytest.mark.cuda, pytest.mark.multigpu]


@pytest.fixture
def world():
    n = torch.cuda.device_count()
    if n < 2:
        pytest.fail("these tests need at least two GPUs (run them with -m multigpu on a multi-GPU machine)")
    return n


@pytest.mark.parametrize("backend,signal", [("p2p", "atomic"), ("p2p", "flags"), ("nccl", "auto")])
def test_gpu_gather_matches_reference(backend, signal, world):
    res = spawn(world, gather_worker.entry, "cuda", backend, signal)
    errors = {r: p for r, (s, p) in res.items() if s != "ok"}
    assert not errors, "\n".join(f"rank {r}:\n{p}" for r, p in errors.items())
    want_signal = None if backend == "nccl" else signal
    for _, (_, results) in res.items():
        assert [(b, sg) for _, _, b, sg in results] == [(backend, want_signal)] * len(gather_worker.CASES)


@pytest.mark.parametrize("signal", ["atomic", "flags"])
def test_graph_replay_and_peer_timeout(signal, world):
    res = spawn(world, gather_worker.graph_and_timeout, signal)
    errors = {r: p for r, (s, p) in res.items() if s != "ok"}
    assert not errors, "\n".join(f"rank {r}:\n{p}" for r, p in errors.items())
    msg, cause = res[0][1]
    assert "rank 1" in msg and "enter" in msg and "timed out" in msg and "trapped" in msg, msg
    assert "CUDA" in cause or "launch failure" in cause, cause  # the trap's CUDA error, chained


@pytest.mark.parametrize("signal", ["atomic", "flags"])
def test_thousands_of_graph_replays_against_nccl_with_busy_sms(signal, world):
    """Column gathers at N = 7168 for batch sizes 1..16 x 4 rows in CUDA graphs (one pool, SGLang's capture order),
    replayed in random order interleaved with eager gathers while a 1024-block grid keeps SMs busy; each output
    equal to NCCL's all_gather of the same rows."""
    steps = int(os.environ.get("E3_GATHER_STRESS_STEPS", "3000"))
    res = spawn(world, gather_worker.graph_stress, signal, steps, timeout=600)
    errors = {r: p for r, (s, p) in res.items() if s != "ok"}
    assert not errors, "\n".join(f"rank {r}:\n{p}" for r, p in errors.items())
    for r, (_, rep) in res.items():
        assert rep["replays"] + rep["eager"] == steps and rep["replays"] > steps // 2 and rep["signal"] == signal, rep


@pytest.mark.parametrize("signal", ["atomic", "flags"])
def test_a_rank_sleeping_past_the_timeout_ends_loudly_never_with_wrong_rows(signal, world):
    res = spawn(world, gather_worker.sleeper, signal, timeout=300)
    errors = {r: p for r, (s, p) in res.items() if s != "ok"}
    assert not errors, "\n".join(f"rank {r}:\n{p}" for r, p in errors.items())
    for r, (_, (checked, outcome)) in res.items():
        assert checked == 19, (r, checked, outcome)  # every replay before the sleep was checked and right
        assert outcome.startswith("GatherTimeout at replay 20") and "trapped" in outcome, (r, outcome)
    assert "enter the gather" in res[0][1][1], res[0][1][1]  # rank 0 waited for the sleeper to enter


def test_a_failed_p2p_probe_on_one_rank_moves_every_rank_to_nccl(world):
    res = spawn(world, gather_worker.probe_failure)
    errors = {r: p for r, (s, p) in res.items() if s != "ok"}
    assert not errors, "\n".join(f"rank {r}:\n{p}" for r, p in errors.items())
    for r, (_, (backend, reason)) in res.items():
        assert backend == "nccl", (r, backend, reason)
        assert reason == "p2p probe failed: rank 1: simulated probe failure", reason
