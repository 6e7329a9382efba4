"""PackedGatherer on every GPU of the machine, one rank each (marker multigpu: 2 on kind nvidia-h200-x2, 4 or 8 on the
larger kinds): the p2p kernel with each arrival signal (atomic: needs native peer atomics; flags: plain stores, the
PCIe protocol, forced on here) and the NCCL fallback against the reference for every layout case, CUDA-graph replay,
and a peer that never arrives."""
from __future__ import annotations

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
    msg = res[0][1]
    assert "rank 1" in msg and "enter" in msg and "timed out" in msg, msg


def test_a_failed_p2p_probe_on_one_rank_moves_every_rank_to_nccl(world):
    res = spawn(world, gather_worker.probe_failure)
    errors = {r: p for r, (s, p) in res.items() if s != "ok"}
    assert not errors, "\n".join(f"rank {r}:\n{p}" for r, p in errors.items())
    for r, (_, (backend, reason)) in res.items():
        assert backend == "nccl", (r, backend, reason)
        assert reason == "p2p probe failed: rank 1: simulated probe failure", reason
