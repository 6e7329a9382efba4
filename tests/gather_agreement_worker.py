"""Worker processes for the gather agreement tests (spawned: this module must import without side effects).

Each scenario gives each rank the arguments of one gather; the worker reports what its gather did (returned, or
raised which exception with which message) and how long it took, then -- where the scenario leaves the gatherer
usable -- a correct gather, checked against the reference."""
from __future__ import annotations

import os
import time
import traceback

import torch
import torch.distributed as dist

K, H = 2, 8
TIMEOUT_S = 2.0


def _local(rank: int, rows: int, cols: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(rank)
    return torch.randn(rows, cols, generator=g) + rank


# scenario -> (layout, per-rank (local rows, local cols or None for the right width, rows_per_rank))
SCENARIOS = {
    # rank 0 holds 2 rows, the others 3; rank 1 believes rank 0 holds 3
    "rows_per_rank_differ": ("rows", lambda r, w: (2 if r == 0 else 3, None,
                                                   [3] * w if r == 1 else [2] + [3] * (w - 1))),
    "uneven_rows_without_rows_per_rank": ("rows", lambda r, w: (2 + r, None, None)),
    "max_rows_differ": ("rows", lambda r, w: (3 if r == 0 else 1, None, [3] + [1] * (w - 1) if r == 0 else [1] * w)),
    "one_rank_passes_a_bad_local": ("rows", lambda r, w: (2, K * H + 1 if r == w - 1 else None, [2] * w)),
    "float_rows_per_rank": ("rows", lambda r, w: (2, None, [2.0] + [2] * (w - 1) if r == 0 else [2] * w)),
    "rows_per_rank_on_one_rank_only": ("rows", lambda r, w: (2, None, [2] * w if r == 0 else None)),
    "columns_uneven_rows": ("columns", lambda r, w: (2 + r, None, None)),
    "columns_with_other_rows_per_rank": ("columns", lambda r, w: (2, None, [2, 3] + [2] * (w - 2) if r == 0 else None)),
}


def _outcome(fn):
    t0 = time.monotonic()
    try:
        fn()
        return ("returned", "", time.monotonic() - t0)
    except Exception as e:  # the test wants to see which type
        return (type(e).__name__, str(e), time.monotonic() - t0)


def _init(rank, world, port, backend="gloo"):
    """gloo on CPU, or (backend "nccl" / "p2p") NCCL on GPU `rank`; returns the gatherer's device."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), NCCL_NVLS_ENABLE="0",
                      TORCH_SYMM_MEM_DISABLE_MULTICAST="1")
    if backend == "gloo":
        dist.init_process_group("gloo", rank=rank, world_size=world)
        return "cpu"
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device("cuda", rank))
    return f"cuda:{rank}"


def disagree(rank: int, world: int, port: int, scenario: str, backend: str, queue) -> None:
    try:
        dev = _init(rank, world, port, backend)
        from eagle3_capture.tp import PackedGatherer, reference_gather

        layout, args = SCENARIOS[scenario]
        dtype = torch.float32 if backend == "gloo" else torch.bfloat16
        gat = PackedGatherer(None, num_taps=K, hidden_size=H * world if layout == "columns" else H, dtype=dtype,
                             max_rows_per_rank=8, layout=layout, timeout_s=TIMEOUT_S, device=dev,
                             backend="auto" if backend == "gloo" else backend)
        width = gat.width if layout == "rows" else gat.width // world

        def local(r, rows, cols=None):
            return _local(r, rows, cols or width).to(dtype)

        rows, cols, rpr = args(rank, world)
        bad = _outcome(lambda: gat.gather(local(rank, rows, cols).to(dev), rows_per_rank=rpr))
        # the gatherer stays usable after a disagreement: a correct gather now
        good_rows = [1 + r for r in range(world)] if layout == "rows" else [3] * world
        out = gat.gather(local(rank, good_rows[rank]).to(dev), rows_per_rank=good_rows if layout == "rows" else None)
        gat.check()
        want = reference_gather([local(r, good_rows[r]) for r in range(world)], layout, K, gat.hidden_size)
        after = torch.equal(out.cpu(), want)
        dist.destroy_process_group()
        queue.put((rank, "ok", (bad, after)))
    except BaseException:
        queue.put((rank, "error", traceback.format_exc()))


def never_calls(rank: int, world: int, port: int, backend: str, queue) -> None:
    """The last rank skips gather #2; the others must give up within TIMEOUT_S naming it; when it comes later it
    raises too; a barrier afterwards shows the process group itself was left usable."""
    try:
        dev = _init(rank, world, port, backend)
        from eagle3_capture.tp import PackedGatherer

        dtype = torch.float32 if backend == "gloo" else torch.bfloat16
        gat = PackedGatherer(None, num_taps=K, hidden_size=H, dtype=dtype, max_rows_per_rank=4, device=dev,
                             timeout_s=TIMEOUT_S, backend="auto" if backend == "gloo" else backend)
        x = _local(rank, 2, K * H).to(dtype=dtype, device=dev)

        def gather_and_check():
            gat.gather(x)
            gat.check()

        first = _outcome(gather_and_check)
        late = rank == world - 1
        if not late:
            second = _outcome(gather_and_check)
            dist.barrier()  # now the late rank may come
        else:
            dist.barrier()
            second = _outcome(gather_and_check)
        third = _outcome(gather_and_check)
        dist.barrier()
        dist.destroy_process_group()
        queue.put((rank, "ok", (first, second, third)))
    except BaseException:
        queue.put((rank, "error", traceback.format_exc()))


LATE_S = 0.3  # how long after a collective completes the stand-in for gloo's worker lets go of it


def released_before_return(rank: int, world: int, port: int, queue) -> None:
    """gloo's worker thread lets go of a collective's tensors a moment after the caller sees it complete, and that
    release takes the GIL however many Python references the tensors have (gather_agreement: why a process that
    exits then aborts). First the torch behaviour: a tensor that a live gloo work holds has one Python reference
    more than the ones Python holds. Then every all_gather the gatherer makes hands its work to a thread that drops
    it LATE_S later, as a late worker would: the gatherer's set-up, a gather that ends in the disagreement's
    ValueError and a good gather must each return only after that drop -- no tensor they gave gloo is still
    referenced from C++ (use count 1: its Python object's own; one that is gone was let go of)."""
    import logging
    import sys
    import threading
    import weakref

    from torch.distributed import distributed_c10d as c10d

    try:
        _init(rank, world, port)
        real = c10d.all_gather
        t, outs = torch.full((2,), 1.5), [torch.zeros(2) for _ in range(world)]
        alone = sys.getrefcount(t)
        work = real(outs, t, async_op=True)
        work.wait()
        while_held = sys.getrefcount(t)
        del work

        given, late = [], []

        def late_release(tensor_list, tensor, group=None, async_op=False):
            assert not async_op
            held = [real(tensor_list, tensor, group=group, async_op=True)]
            held[0].wait()
            given.extend(weakref.ref(x) for x in [*tensor_list, tensor])  # no reference of the test's own
            timer = threading.Timer(LATE_S, held.clear)
            late.append(timer)
            timer.start()

        c10d.all_gather = dist.all_gather = late_release
        warnings = []  # the gatherer gave up waiting for a release (it must not: the stand-in lets go in LATE_S)
        handler = logging.Handler(logging.WARNING)
        handler.emit = lambda record: warnings.append(record.getMessage())
        logging.getLogger("eagle3_capture.tp").addHandler(handler)
        from eagle3_capture.tp import PackedGatherer

        def still_held():  # a tensor gone is released: while C++ held it, its Python object stayed alive
            return sum(r() is not None and r()._use_count() > 1 for r in given)

        gat = PackedGatherer(None, num_taps=K, hidden_size=H, dtype=torch.float32, max_rows_per_rank=8,
                             timeout_s=TIMEOUT_S, device="cpu")
        after_setup = (len(given), still_held())
        rows, _, rpr = SCENARIOS["rows_per_rank_differ"][1](rank, world)
        bad = _outcome(lambda: gat.gather(_local(rank, rows, K * H), rows_per_rank=rpr))
        after_error = (len(given), still_held())
        gat.gather(_local(rank, 2, K * H))
        after_gather = (len(given), still_held())
        for timer in late:
            timer.join()
        queue.put((rank, "ok", ((alone, while_held), after_setup, bad[0], after_error, after_gather, warnings)))
        dist.destroy_process_group()
    except BaseException:
        queue.put((rank, "error", traceback.format_exc()))


def error_then_exit(rank: int, world: int, port: int, queue) -> None:
    """The issue's script: the ranks disagree, both catch the ValueError, and the process ends at once."""
    try:
        _init(rank, world, port)
        from eagle3_capture.tp import PackedGatherer

        gat = PackedGatherer(None, num_taps=K, hidden_size=H, dtype=torch.float32, max_rows_per_rank=8,
                             timeout_s=TIMEOUT_S, device="cpu")
        rows, _, rpr = SCENARIOS["rows_per_rank_differ"][1](rank, world)
        queue.put((rank, "ok", _outcome(lambda: gat.gather(_local(rank, rows, K * H), rows_per_rank=rpr))[0]))
    except BaseException:
        queue.put((rank, "error", traceback.format_exc()))
