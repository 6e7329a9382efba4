"""The p2p gather kernel's protocol on ONE GPU: 2-4 pretend ranks in one process, each with its own output buffer, flag
area and stream, so both arrival signals (atomic counters and per-block flags) run on a single H200; the two-GPU tests
(test_gather_cuda.py) need a second GPU.

Each rank's kernel is launched on its own stream with a small grid, so all of them are resident at once (a rank's
blocks wait for the others' signals). The sequential test instead pre-seeds one rank's flags as if its peer had
already entered and arrived, so the kernels run one after the other: that form also runs under compute-sanitizer,
which serialises kernels. The flag-area layout below mirrors csrc/kernels/gather.h."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from eagle3_capture import native
from eagle3_capture.tp import COLUMNS, ROWS, reference_gather

pytestmark = pytest.mark.cuda

SIGNALS = {"atomic": 0, "flags": 1}
ENTERED, ARRIVED, COMPLETED, TICKET, SLOTS = 0, 16, 32, 33, 64   # word offsets in a flag area (gather.h)
MAX_BLOCKS, SLOT_SHIFT, ARRIVE_UNIT = 1024, 16, 1 << 20
BROKEN = -(1 << 63)  # the ticket's broken bit, as an int64


def local_rows(rank: int, rows: int, cols: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(7919 * seed + rank)
    return (torch.randn(rows, cols, generator=g) + rank + 1).to(torch.bfloat16)  # never zeros


class Ranks:
    """`world` pretend ranks on the current GPU."""

    def __init__(self, world: int, out_rows: int, width: int):
        words = int(native.load().gather_flag_words())
        self.world = world
        self.outs = [torch.empty(max(out_rows, 1), width, dtype=torch.bfloat16, device="cuda") for _ in range(world)]
        self.flags = [torch.zeros(words, dtype=torch.int64, device="cuda") for _ in range(world)]
        self.errors = [torch.zeros(4, dtype=torch.int32).pin_memory() for _ in range(world)]
        self.streams = [torch.cuda.Stream() for _ in range(world)]
        self.out_ptrs = [o.data_ptr() for o in self.outs]
        self.flag_ptrs = [f.data_ptr() for f in self.flags]

    def poison(self) -> None:
        for o in self.outs:
            o.fill_(float("nan"))

    def launch(self, r: int, local: torch.Tensor, offset: int, src, dst, seg_len: int, blocks: int, signal: str,
               timeout_s: float = 20.0, trap: bool = False) -> None:
        """Rank r's gather on its stream. trap=False (report mode) by default: a timeout here must leave the process
        usable for the assertions; the served mode (trap) runs in test_gather_graphs_cuda.py's subprocesses."""
        s = self.streams[r]
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            self.gather(r, local, offset, src, dst, seg_len, blocks, signal, timeout_s, trap)

    def gather(self, r: int, local: torch.Tensor, offset: int, src, dst, seg_len: int, blocks: int, signal: str,
               timeout_s: float = 20.0, trap: bool = False) -> None:
        """Rank r's gather on the current stream (inside a CUDA-graph capture, too)."""
        torch.ops.eagle3_capture.gather_p2p_(self.outs[r], local, self.out_ptrs, self.flag_ptrs, self.flags[r],
                                             self.errors[r], r, offset, list(src), list(dst), seg_len, blocks,
                                             timeout_s, SIGNALS[signal], trap)

    def sync(self) -> None:
        for s in self.streams:
            s.synchronize()


def layout_args(layout: str, rank: int, world: int, rows: list[int], k: int, h: int):
    """(offset, src_cols, dst_cols, seg_len) as PackedGatherer computes them."""
    if layout == ROWS:
        return sum(rows[:rank]), [0], [0], k * h
    hs = h // world
    return 0, [t * hs for t in range(k)], [t * h + rank * hs for t in range(k)], hs


def run_gathers(world: int, layout: str, rows_per_call: list[list[int]], k: int, h: int, signal: str,
                blocks_per_call: list[list[int]]) -> None:
    cols = k * h if layout == ROWS else k * h // world
    cap = max(max(r) for r in rows_per_call) if rows_per_call else 1
    out_rows = world * cap if layout == ROWS else cap
    ranks = Ranks(world, out_rows, k * h)
    for call, (rows, blocks) in enumerate(zip(rows_per_call, blocks_per_call)):
        if layout == COLUMNS:
            rows = [rows[0]] * world
        locals_cpu = [local_rows(r, rows[r], cols, call) for r in range(world)]
        locals_dev = [t.cuda() for t in locals_cpu]
        ranks.poison()
        for r in range(world):
            off, src, dst, seg = layout_args(layout, r, world, rows, k, h)
            ranks.launch(r, locals_dev[r], off, src, dst, seg, blocks[r], signal)
        ranks.sync()
        want = reference_gather(locals_cpu, layout, k, h)
        for r in range(world):
            assert ranks.errors[r].tolist() == [0, 0, 0, 0], f"call {call} rank {r}: {ranks.errors[r].tolist()}"
            assert int(ranks.flags[r][COMPLETED]) == call + 1
            got = ranks.outs[r][: want.shape[0]].cpu()
            assert torch.equal(got, want), f"call {call}, rank {r}, {signal}, {layout}, rows {rows}, blocks {blocks}"


@pytest.mark.parametrize("signal", ["atomic", "flags"])
@pytest.mark.parametrize("world", [2, 3, 4])
def test_rows_uneven_and_grids_changing_between_calls(signal, world):
    # Rows differ per rank (zero included) and per call; each rank's grid differs from its peers' and between calls
    # (a flags-signal receiver reads each peer's grid from its slot 0 every call).
    rows = [[(3 * r + c) % 6 for r in range(world)] for c in range(5)]
    blocks = [[1 + (2 * r + 3 * c) % 8 for r in range(world)] for c in range(5)]
    run_gathers(world, ROWS, rows, 3, 64, signal, blocks)


@pytest.mark.parametrize("signal", ["atomic", "flags"])
def test_columns_layout(signal):
    run_gathers(4, COLUMNS, [[6] * 4, [1] * 4, [0] * 4, [9] * 4], 3, 256, signal, [[4, 2, 8, 1]] * 4)


@pytest.mark.parametrize("signal", ["atomic", "flags"])
def test_large_rows_many_blocks(signal):
    # T = 64 rows of K*H = 3 x 7168 per rank: every block of a 8-block grid has several units.
    run_gathers(2, ROWS, [[64, 64], [33, 31]], 3, 7168, signal, [[8, 8], [8, 3]])


@settings(max_examples=12, deadline=None)
@given(world=st.integers(2, 4), k=st.integers(1, 3), h8=st.integers(1, 40), calls=st.integers(1, 3),
       signal=st.sampled_from(["atomic", "flags"]), data=st.data())
def test_fuzz_rows(world, k, h8, calls, signal, data):
    rows = [[data.draw(st.integers(0, 9)) for _ in range(world)] for _ in range(calls)]
    blocks = [[data.draw(st.integers(1, 8)) for _ in range(world)] for _ in range(calls)]
    run_gathers(world, ROWS, rows, k, 8 * h8, signal, blocks)


def seed_peer_done(flags: torch.Tensor, peer: int, signal: str, n: int = 1, peer_blocks: int = 1) -> None:
    """Writes into `flags` what `peer` would have written by the end of its gather n."""
    flags[ENTERED + peer] = n
    if signal == "atomic":
        flags[ARRIVED + peer] = n * ARRIVE_UNIT
    else:
        for b in range(peer_blocks):
            flags[SLOTS + peer * MAX_BLOCKS + b] = (n << SLOT_SHIFT) | peer_blocks


@pytest.mark.parametrize("signal", ["atomic", "flags"])
def test_sequential_two_ranks(signal):
    """Rank 1 runs first against flags pre-seeded as if rank 0 had finished gather 1, then rank 0 runs alone: rank
    0's output must be whole (rank 1 pushed its rows before rank 0 started). No kernel waits on a concurrent one,
    so this test also runs under compute-sanitizer."""
    k, h, rows = 3, 512, [5, 7]
    ranks = Ranks(2, sum(rows), k * h)
    locals_cpu = [local_rows(r, rows[r], k * h, 0) for r in range(2)]
    locals_dev = [t.cuda() for t in locals_cpu]
    ranks.poison()
    seed_peer_done(ranks.flags[1], 0, signal)
    ranks.launch(1, locals_dev[1], rows[0], [0], [0], k * h, 4, signal)
    ranks.sync()
    ranks.launch(0, locals_dev[0], 0, [0], [0], k * h, 3, signal)
    ranks.sync()
    assert ranks.errors[0].tolist() == [0, 0, 0, 0] and ranks.errors[1].tolist() == [0, 0, 0, 0]
    assert int(ranks.flags[0][COMPLETED]) == 1 and int(ranks.flags[1][COMPLETED]) == 1
    want = reference_gather(locals_cpu, ROWS, k, h)
    assert torch.equal(ranks.outs[0].cpu(), want)
    assert torch.equal(ranks.outs[1].cpu(), want)  # rank 0 pushed its rows into rank 1's output too


@pytest.mark.parametrize("signal", ["atomic", "flags"])
def test_peer_never_enters_times_out(signal):
    ranks = Ranks(2, 8, 64)
    local = local_rows(0, 4, 64, 1).cuda()
    ranks.launch(0, local, 0, [0], [0], 64, 4, signal, timeout_s=0.2)
    ranks.sync()
    code, peer, step, n = ranks.errors[0].tolist()
    assert (code, peer, step, n) == (1, 1, 1, 1)
    assert int(ranks.flags[0][COMPLETED]) == 0  # the gather did not complete
    assert int(ranks.flags[0][TICKET]) == BROKEN + ARRIVE_UNIT  # its number taken, the rank marked broken


@pytest.mark.parametrize("signal", ["atomic", "flags"])
def test_peer_enters_but_never_arrives_times_out(signal):
    ranks = Ranks(2, 8, 64)
    ranks.flags[0][ENTERED + 1] = 1  # rank 1 "entered" and then wrote nothing
    local = local_rows(0, 4, 64, 2).cuda()
    ranks.launch(0, local, 0, [0], [0], 64, 4, signal, timeout_s=0.2)
    ranks.sync()
    assert ranks.errors[0].tolist() == [2, 1, 2, 1]
    assert int(ranks.flags[0][COMPLETED]) == 0


def test_flags_signal_rejects_a_malformed_slot():
    ranks = Ranks(2, 8, 64)
    ranks.flags[0][ENTERED + 1] = 1
    ranks.flags[0][SLOTS + 1 * MAX_BLOCKS] = 1 << SLOT_SHIFT  # gather 1 from a grid of 0 blocks: impossible
    local = local_rows(0, 4, 64, 3).cuda()
    ranks.launch(0, local, 0, [0], [0], 64, 4, "flags", timeout_s=0.5)
    ranks.sync()
    assert ranks.errors[0].tolist() == [3, 1, 3, 1]


def test_flags_signal_peer_already_past_the_gather():
    """A slot 0 holding a later gather than the one waited for means the peer finished this one (its grid then may
    differ): the receiver completes without polling the peer's other slots."""
    ranks = Ranks(2, 8, 64)
    ranks.flags[0][ENTERED + 1] = 2
    ranks.flags[0][SLOTS + 1 * MAX_BLOCKS] = (2 << SLOT_SHIFT) | 7  # slots 1..6 stay 0
    local = local_rows(0, 4, 64, 4).cuda()
    ranks.launch(0, local, 0, [0], [0], 64, 2, "flags", timeout_s=0.5)
    ranks.sync()
    assert ranks.errors[0].tolist() == [0, 0, 0, 0] and int(ranks.flags[0][COMPLETED]) == 1


def test_op_rejects_an_unknown_signal():
    ranks = Ranks(2, 8, 64)
    local = local_rows(0, 4, 64, 5).cuda()
    with pytest.raises(RuntimeError, match=r"signal must be 0 \(atomic\) or 1 \(flags\), got 2"):
        torch.ops.eagle3_capture.gather_p2p_(ranks.outs[0], local, ranks.out_ptrs, ranks.flag_ptrs, ranks.flags[0],
                                             ranks.errors[0], 0, 0, [0], [0], 64, 4, 1.0, 2)
