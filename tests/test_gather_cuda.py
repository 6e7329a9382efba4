"""PackedGatherer on two GPUs (marker multigpu: kind nvidia-h200-x2): the p2p kernel and the NCCL fallback against
the reference for every layout case, CUDA-graph replay, and a peer that never arrives."""
from __future__ import annotations

import pytest
import torch

import gather_worker
from test_gather import spawn

pytestmark = [pytest.mark.cuda, pytest.mark.multigpu]


@pytest.fixture(autouse=True)
def two_gpus():
    if torch.cuda.device_count() < 2:
        pytest.fail("these tests need two GPUs (run them with -m multigpu on a two-GPU machine)")


@pytest.mark.parametrize("backend", ["p2p", "nccl"])
def test_two_gpu_gather_matches_reference(backend):
    res = spawn(2, gather_worker.entry, "cuda", backend)
    errors = {r: p for r, (s, p) in res.items() if s != "ok"}
    assert not errors, "\n".join(f"rank {r}:\n{p}" for r, p in errors.items())
    for _, (_, results) in res.items():
        assert [b for _, _, b in results] == [backend] * len(gather_worker.CASES)


def test_graph_replay_and_peer_timeout():
    res = spawn(2, gather_worker.graph_and_timeout)
    errors = {r: p for r, (s, p) in res.items() if s != "ok"}
    assert not errors, "\n".join(f"rank {r}:\n{p}" for r, p in errors.items())
    msg = res[0][1]
    assert "rank 1" in msg and "enter" in msg and "timed out" in msg, msg
