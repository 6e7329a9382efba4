"""ops.gather_p2p_, the typed wrapper of the p2p gather op, and its fake: on meta tensors (what tracing sees) a call
the kernel would take is accepted and one it would refuse is refused, naming the argument; the fake's limits are
gather.h's. The op itself runs on GPUs only (tests/test_gather_protocol_cuda.py, test_gather_cuda.py)."""
from __future__ import annotations

import os
import re

import pytest
import torch

from eagle3_capture import native, ops
from eagle3_capture.native import build_info

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def args(**change):
    """A valid call for 2 ranks, rows layout, 4 rows of 64 columns each, on meta tensors."""
    a = dict(out=torch.empty(8, 64, device="meta"), local=torch.empty(4, 64, device="meta"), out_ptrs=[0, 1],
             flag_ptrs=[0, 1], flags=torch.empty(ops.GATHER_FLAG_WORDS, dtype=torch.int64, device="meta"),
             error=torch.empty(4, dtype=torch.int32, device="meta"), rank=1, dst_row_offset=4, src_cols=[0],
             dst_cols=[0], seg_len=64, blocks=4, timeout_s=1.0, signal=0, trap_on_timeout=True)
    a.update(change)
    return a


def test_a_call_the_kernel_takes_traces():
    assert ops.gather_p2p_(**args()) is None
    # columns layout: two taps, this rank's half of each
    assert ops.gather_p2p_(**args(local=torch.empty(8, 64, device="meta"), dst_row_offset=0, src_cols=[0, 32],
                                  dst_cols=[32, 96], seg_len=32, out=torch.empty(8, 128, device="meta"))) is None


REFUSED = [
    ({"out": torch.empty(8, device="meta")}, "expected out"),
    ({"local": torch.empty(4, 64, dtype=torch.float16, device="meta")}, "local dtype"),
    ({"out_ptrs": [], "flag_ptrs": []}, "expected 1..16 ranks"),
    ({"flag_ptrs": [0]}, "expected 2 flag pointers"),
    ({"rank": 2}, "rank 2 out of range for world 2"),
    ({"flags": torch.empty(16, dtype=torch.int64, device="meta")}, "flag area of at least"),
    ({"error": torch.empty(4, dtype=torch.int64, device="meta")}, "error must be an int32"),
    ({"src_cols": [0, 1]}, "column segments"),
    ({"seg_len": 0}, "segment length must be >= 1"),
    ({"src_cols": [1]}, "segment 0 reads local columns"),
    ({"dst_cols": [8]}, "segment 0 writes output columns"),
    ({"dst_row_offset": 5}, "do not fit the output's 8 rows"),
    ({"blocks": 0}, "blocks must be in 1..1024"),
    ({"signal": 2}, r"signal must be 0 \(atomic\) or 1 \(flags\), got 2"),
    ({"timeout_s": 0.0}, r"timeout must be in \(0, 1e6\]"),
]


@pytest.mark.parametrize("change,needle", REFUSED, ids=[n for _, n in REFUSED])
def test_a_call_the_kernel_refuses_is_refused_at_trace_time(change, needle):
    with pytest.raises(RuntimeError, match="eagle3_capture.gather_p2p_: .*" + needle):
        ops.gather_p2p_(**args(**change))


def test_the_fakes_limits_are_the_kernels():
    text = open(os.path.join(REPO, "csrc", "kernels", "gather.h")).read()

    def const(name):
        return int(re.search(rf"constexpr int {name} = (\d+);", text).group(1))

    assert (ops.GATHER_MAX_RANKS, ops.GATHER_MAX_SEGMENTS, ops.GATHER_MAX_BLOCKS) == (
        const("kGatherMaxRanks"), const("kGatherMaxSegments"), const("kGatherMaxBlocks"))
    assert ops.GATHER_FLAG_WORDS == const("kGatherFlagSlots") + ops.GATHER_MAX_RANKS * ops.GATHER_MAX_BLOCKS
    if "cuda" in build_info()["backends"]:  # a CPU-only build has no flag area
        assert ops.GATHER_FLAG_WORDS == int(native.load().gather_flag_words())
