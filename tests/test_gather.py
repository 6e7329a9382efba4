"""PackedGatherer on CPU with gloo: 2, 3 and 8 ranks; equal, uneven and empty rows; the column-sharded layout; the
configuration check across ranks."""
from __future__ import annotations

import multiprocessing as mp
import os
import traceback

import pytest
import torch
import torch.distributed as dist

import gather_worker
from free_ports import free_port


# The ranks' processes are forked from multiprocessing's fork server, which imports torch and the package once
# (a spawned rank spends seconds importing them; a test file starts dozens). A test about how a process ends asks for
# "spawn": a forked rank leaves with os._exit, skipping the interpreter's teardown it would be about.
PRELOAD = ["torch", "torch.distributed", "eagle3_capture", "eagle3_capture.tp"]


def spawn(world: int, target, *args, timeout: float = 240.0, exit_codes: list = None, method: str = "forkserver"):
    """Run target(rank, world, port, *args, queue) in `world` new processes (`method`: "forkserver", or "spawn"
    for a fresh interpreter); {rank: (status, payload)} from the queue. `exit_codes`: a list that gets each
    process's exit code, in rank order."""
    if method not in ("forkserver", "spawn"):
        raise ValueError(f"method must be 'forkserver' or 'spawn', got {method!r}")
    ctx = mp.get_context(method)
    if method == "forkserver":
        ctx.set_forkserver_preload(PRELOAD)
    q = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=target, args=(r, world, port, *args, q)) for r in range(world)]
    for p in procs:
        p.start()
    out = {}
    try:
        for _ in range(world):
            rank, status, payload = q.get(timeout=timeout)
            out[rank] = (status, payload)
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
                p.join()
        if exit_codes is not None:
            exit_codes.extend(p.exitcode for p in procs)
    return out


@pytest.mark.parametrize("world", [2, 3, 8])
def test_gloo_gather_matches_reference(world):
    res = spawn(world, gather_worker.entry, "cpu", "auto", "auto")
    errors = {r: p for r, (s, p) in res.items() if s != "ok"}
    assert not errors, "\n".join(f"rank {r}:\n{p}" for r, p in errors.items())
    for r, (_, results) in res.items():
        assert len(results) == len(gather_worker.CASES) and all(b == "gloo" for _, _, b, _ in results)


def _mismatch_entry(rank, world, port, queue):
    try:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=world)
        from eagle3_capture.tp import PackedGatherer

        try:
            PackedGatherer(None, num_taps=3, hidden_size=16 if rank else 32, dtype=torch.bfloat16,
                           max_rows_per_rank=4, device="cpu")
            queue.put((rank, "no error", ""))
        except ValueError as e:
            queue.put((rank, "ok", str(e)))
        dist.destroy_process_group()
    except BaseException:
        queue.put((rank, "error", traceback.format_exc()))


def test_mismatched_configuration_is_an_error_on_every_rank():
    res = spawn(2, _mismatch_entry)
    for r, (status, msg) in res.items():
        assert status == "ok", f"rank {r}: {status} {msg}"
        assert "differs across ranks" in msg and "hidden_size=32" in msg and "hidden_size=16" in msg


def test_reference_gather_columns_layout():
    from eagle3_capture.tp import reference_gather

    a = torch.arange(2 * 4).view(2, 4).float()       # rank 0: K=2 taps of H/2 = 2 columns
    b = 100 + torch.arange(2 * 4).view(2, 4).float()  # rank 1
    out = reference_gather([a, b], "columns", 2, 4)
    assert out[0].tolist() == [0, 1, 100, 101, 2, 3, 102, 103]


def test_timeout_defaults_to_torchs_nccl_timeout_and_is_checked():
    """The p2p gather's timeout is fatal when it fires (the kernel traps), so its default is the scale of NCCL's
    watchdog: torch's default NCCL process-group timeout, 10 minutes. Bad values are refused before anything
    collective runs."""
    from datetime import timedelta

    from torch.distributed.constants import default_pg_nccl_timeout

    from eagle3_capture.tp import PackedGatherer, default_timeout_s

    assert default_pg_nccl_timeout == timedelta(minutes=10)
    assert default_timeout_s() == 600.0
    for bad in (0, -1.0, float("nan"), float("inf"), 2e6, True, "10"):
        with pytest.raises(ValueError, match=r"timeout_s must be a number of seconds in \(0, 1e6\]"):
            PackedGatherer(None, num_taps=1, hidden_size=8, dtype=torch.bfloat16, max_rows_per_rank=1,
                           timeout_s=bad)


def _default_timeout_entry(rank, world, port, queue):
    try:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=world)
        from eagle3_capture.tp import PackedGatherer

        g = PackedGatherer(None, num_taps=1, hidden_size=8, dtype=torch.bfloat16, max_rows_per_rank=1, device="cpu")
        queue.put((rank, "ok", (g.timeout_s, g._agreement.timeout_s)))
        dist.destroy_process_group()
    except BaseException:
        queue.put((rank, "error", traceback.format_exc()))


def test_a_gatherer_without_timeout_uses_the_default_for_the_kernel_and_the_agreement():
    res = spawn(2, _default_timeout_entry)
    assert {r: v for r, v in res.items()} == {0: ("ok", (600.0, 600.0)), 1: ("ok", (600.0, 600.0))}
