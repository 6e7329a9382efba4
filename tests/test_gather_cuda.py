"""PackedGatherer on every GPU of the machine, one rank each (marker multigpu: 2 on kind nvidia-h200-x2, 4 or 8 on the
larger kinds): the p2p kernel and the NCCL fallback against the reference for every layout case, CUDA-graph replay,
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


@pytest.mark.parametrize("backend", ["p2p", "nccl"])
def test_gpu_gather_matches_reference(backend, world):
    res = spawn(world, gather_worker.entry, "cuda", backend)
    errors = {r: p for r, (s, p) in res.items() if s != "ok"}
    assert not errors, "\n".join(f"rank {r}:\n{p}" for r, p in errors.items())
    for _, (_, results) in res.items():
        assert [b for _, _, b in results] == [backend] * len(gather_worker.CASES)


def test_graph_replay_and_peer_timeout(world):
    res = spawn(world, gather_worker.graph_and_timeout)
    errors = {r: p for r, (s, p) in res.items() if s != "ok"}
    assert not errors, "\n".join(f"rank {r}:\n{p}" for r, p in errors.items())
    msg = res[0][1]
    assert "rank 1" in msg and "enter" in msg and "timed out" in msg, msg
