"""The device-derived tuning table (csrc/kernels/tuning.h through eagle3_capture.tuning) for fake devices: the H200's
measured entries, the RTX PRO 6000's reasoned ones, a B200, the overrides and their errors. CPU only."""
from __future__ import annotations

import json

import pytest

from eagle3_capture import native, tuning
from eagle3_capture.tuning import DeviceFacts

H200 = DeviceFacts(9, 0, 132, 2048, 32, 233472, 232448, 1024, 60 << 20)
RTX_PRO_6000 = DeviceFacts(12, 0, 188, 1536, 32, 102400, 101376, 1024, 128 << 20)
B200 = DeviceFacts(10, 0, 148, 2048, 32, 233472, 232448, 1024, 126 << 20)
DGX_SPARK = DeviceFacts(12, 1, 48, 1536, 32, 102400, 101376, 1024, 24 << 20)
MB = 1 << 20


@pytest.fixture(autouse=True)
def no_overrides(monkeypatch):
    for name in tuning.OVERRIDE_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def test_h200_entries_are_the_measured_ones():
    t = tuning.tuning_for(H200)
    assert (t["decode_max_rows"], t["cluster_min_splits"], t["gather_blocks_nvlink"], t["gather_blocks_pcie"],
            t["fused_norm_threads"], t["bench_rotation_bytes"]) == (8, 4, 264, 64, 0, 256 * MB)
    assert t["basis"] == "sm_90: measured on the H200" and t["overridden"] == [] and t["error"] == ""


def test_rtx_pro_6000_entries_are_reasoned():
    t = tuning.tuning_for(RTX_PRO_6000)
    assert (t["decode_max_rows"], t["cluster_min_splits"], t["gather_blocks_nvlink"], t["gather_blocks_pcie"],
            t["bench_rotation_bytes"]) == (16, 6, 376, 64, 512 * MB)
    assert "reasoned" in t["basis"] and "not measured" in t["basis"]


def test_other_architectures():
    b = tuning.tuning_for(B200)
    assert (b["decode_max_rows"], b["cluster_min_splits"], b["bench_rotation_bytes"]) == (8, 4, 504 * MB)
    assert b["basis"].startswith("sm_10x")
    s = tuning.tuning_for(DGX_SPARK)  # 12.1: the sm_12x row; few SMs keep at least 2 pieces and a small grid
    assert (s["decode_max_rows"], s["cluster_min_splits"], s["gather_blocks_nvlink"], s["gather_blocks_pcie"]) == \
        (16, 2, 96, 64)
    assert tuning.tuning_for(DeviceFacts(8, 0, 108, 2048, 32, 167936, 166912, 1024, 40 << 20))["basis"].startswith(
        "unlisted architecture")




@pytest.mark.cuda_build  # the split tiling is host code of the CUDA sources
@pytest.mark.parametrize("facts", [H200, RTX_PRO_6000], ids=["h200", "rtx_pro_6000"])
def test_cluster_switch_stays_at_the_n_measured_on_the_h200(facts):
    """The split grid's pieces per tap grow with the SM count; the scaled threshold keeps auto's cluster kernel at
    N <= 1792 (H = 7168, K = 3, the tp = 8 and 4 shards) and the split kernel at N = 3584 and 7168, as measured on
    the H200. With the H200's fixed 4, the RTX PRO 6000 would have moved N = 3584 to the cluster kernel."""
    min_splits = tuning.tuning_for(facts)["cluster_min_splits"]
    pieces = {n: native.load().draft_fc_split_pieces(facts.sms, 3, 7168, n, 1, True) for n in (896, 1792, 3584, 7168)}
    assert [n for n, p in pieces.items() if p >= min_splits] == [896, 1792], (pieces, min_splits)
    if facts is RTX_PRO_6000:
        assert pieces[3584] >= 4  # what the unscaled H200 constant would have switched


@pytest.mark.parametrize("facts, rows, want", [
    (H200, 8, 896), (H200, 8192, 896),                  # H = 7168 bf16: 896 vectors; 2 blocks of 896 fill 87.5%
    (RTX_PRO_6000, 8, 896), (RTX_PRO_6000, 8192, 448),  # 1536 threads per SM: 896 leaves 58%, 448 x 3 = 87.5%
])
def test_fused_norm_block_size(facts, rows, want):
    smem = (32 + 7168) * 4
    assert tuning.fused_norm_threads(facts, 896, rows, smem) == want
    assert tuning.fused_norm_threads(facts, 896, rows, smem, override=256) == 256


def test_fused_norm_block_size_respects_shared_memory():
    # fp32 rows of H = 24576 on sm_120: 6144 vectors, ~97 KB of shared memory per block: one block per SM whatever
    # its size, so the largest block (fewest rounds per row) is kept.
    assert tuning.fused_norm_threads(RTX_PRO_6000, 6144, 8192, (32 + 24576) * 4) == 1024
    # Small rows: the 64-thread floor.
    assert tuning.fused_norm_threads(H200, 3, 8192, (32 + 24) * 4) == 64


def test_fused_norm_block_size_unchanged_on_the_h200_for_common_widths():
    # Many rows on the H200: the occupancy rule keeps one vector per thread at these H (what ran before the table).
    for h in (2048, 4096, 5120, 6144, 7168, 8192):
        chunks = h // 8
        assert tuning.fused_norm_threads(H200, chunks, 8192, (32 + h) * 4) == min(1024, max(64, -(-chunks // 32) * 32))


def test_overrides(monkeypatch):
    monkeypatch.setenv("EAGLE3_CAPTURE_DECODE_MAX_ROWS", "12")
    monkeypatch.setenv("EAGLE3_CAPTURE_CLUSTER_MIN_SPLITS", "3")
    monkeypatch.setenv("EAGLE3_CAPTURE_GATHER_BLOCKS", "100")
    monkeypatch.setenv("EAGLE3_CAPTURE_FUSED_NORM_THREADS", "512")
    t = tuning.tuning_for(RTX_PRO_6000)
    assert (t["decode_max_rows"], t["cluster_min_splits"], t["gather_blocks_nvlink"], t["gather_blocks_pcie"],
            t["fused_norm_threads"]) == (12, 3, 100, 100, 512)
    assert t["overridden"] == ["decode_max_rows", "cluster_min_splits", "gather_blocks", "fused_norm_threads"]
    assert t["error"] == ""


@pytest.mark.parametrize("name, value, words", [
    ("EAGLE3_CAPTURE_DECODE_MAX_ROWS", "17", "EAGLE3_CAPTURE_DECODE_MAX_ROWS must be an integer in 0..16, got '17'"),
    ("EAGLE3_CAPTURE_DECODE_MAX_ROWS", "8 rows", "got '8 rows'"),
    ("EAGLE3_CAPTURE_GATHER_BLOCKS", "0", "EAGLE3_CAPTURE_GATHER_BLOCKS must be an integer in 1..1024, got '0'"),
    ("EAGLE3_CAPTURE_FUSED_NORM_THREADS", "100", "a multiple of 32 (0 = derived), got '100'"),
    ("EAGLE3_CAPTURE_CLUSTER_MIN_SPLITS", "-1", "EAGLE3_CAPTURE_CLUSTER_MIN_SPLITS must be an integer in 1..1048576"),
])
def test_malformed_overrides_name_the_variable(monkeypatch, name, value, words):
    monkeypatch.setenv(name, value)
    t = tuning.tuning_for(H200)
    assert words in t["error"]
    assert t["overridden"] == []
    assert (t["decode_max_rows"], t["gather_blocks_nvlink"]) == (8, 264)  # the table's values stay


def test_the_facts_round_trip():
    doc = json.loads(native.load().tuning_for(*RTX_PRO_6000.__dict__.values()))
    assert DeviceFacts(**doc["facts"]) == RTX_PRO_6000


@pytest.mark.cuda
def test_cuda_device_tuning_is_the_table_for_its_facts():
    """What the launchers use on the GPU present (queried once) is the table's row for the facts it reports."""
    import torch

    doc = tuning.for_device(torch.cuda.current_device())
    assert doc["facts_error"] == 0
    facts = DeviceFacts(**doc["facts"])
    p = torch.cuda.get_device_properties(torch.cuda.current_device())
    assert (facts.cc_major, facts.cc_minor, facts.sms, facts.l2_bytes) == (p.major, p.minor, p.multi_processor_count,
                                                                            p.L2_cache_size)
    assert doc["tuning"] == tuning.tuning_for(facts)
    if facts.cc_major == 9:  # the H200 the table was measured on: its entries must not have moved
        t = doc["tuning"]
        assert (t["decode_max_rows"], t["cluster_min_splits"], t["gather_blocks_nvlink"]) == (8, 4, 2 * facts.sms)
