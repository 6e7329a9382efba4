"""The gather's backend and signal choice (eagle3_capture.gather_backend.plan) for machines described by fake device
reports: an H200 pair over NVLink, RTX PRO 6000 (sm_120) pairs and an 8-GPU box over PCIe without native peer
atomics, and the refusals and overrides. Runs on the CPU: every branch of the decision is here."""
from __future__ import annotations

import logging
import sys
import types

import pytest

from eagle3_capture import gather_backend as gb
from eagle3_capture.gather_backend import ATOMIC, FLAGS, NCCL, NVLINK, P2P, PCIE, PeerLink, RankReport

NVLINK_H200 = PeerLink(access=True, native_atomics=True, performance_rank=0, nvlink=True)
PCIE_NO_ATOMICS = PeerLink(access=True, native_atomics=False, performance_rank=0, nvlink=False)


def bus(i: int) -> str:
    return f"00000000:{0x17 + 16 * i:02X}:00.0"


def machine(world: int, link_for=lambda i, j: NVLINK_H200, host=lambda i: "node0", **report) -> list[RankReport]:
    """One report per rank: GPU i at bus(i), its link to every other GPU from link_for(i, j) (None: not visible)."""
    out = []
    for i in range(world):
        links = {bus(j): link_for(i, j) for j in range(world) if j != i and link_for(i, j) is not None}
        out.append(RankReport(host=host(i), pci_bus_id=bus(i), cuda_build=True, links=links, **report))
    return out


def test_h200_pair_over_nvlink_uses_the_atomic_signal():
    p = gb.plan(machine(2))
    assert (p.backend, p.signal, p.link_class) == (P2P, ATOMIC, NVLINK)
    assert "native peer atomics between every pair" in p.reason
    assert "0->1 access atomics rank 0 nvlink" in p.pairs


def test_h200_pair_without_nvml_is_still_the_nvlink_grid():
    # NVML (pynvml) absent: nvlink None on every link; native atomics stand for NVLink-class links.
    p = gb.plan(machine(2, lambda i, j: PeerLink(True, True, nvlink=None)))
    assert (p.backend, p.signal, p.link_class) == (P2P, ATOMIC, NVLINK)
    assert "link ?" in p.pairs


def test_rtx_pro_6000_pair_over_pcie_uses_the_flags_signal():
    p = gb.plan(machine(2, lambda i, j: PCIE_NO_ATOMICS))
    assert (p.backend, p.signal, p.link_class) == (P2P, FLAGS, PCIE)
    assert "no native peer atomics between ranks [(0, 1), (1, 0)]" in p.reason


def test_eight_gpu_pcie_box_without_peer_atomics():
    p = gb.plan(machine(8, lambda i, j: PCIE_NO_ATOMICS))
    assert (p.backend, p.signal, p.link_class) == (P2P, FLAGS, PCIE)
    assert p.pairs.count("no atomics") == 56  # every ordered pair reported


def test_eight_gpu_pcie_box_with_native_atomics_but_no_nvlink():
    # PCIe AtomicOps routed everywhere: atomics are safe; NVML says PCIe, so the PCIe grid.
    p = gb.plan(machine(8, lambda i, j: PeerLink(True, True, nvlink=False)))
    assert (p.backend, p.signal, p.link_class) == (P2P, ATOMIC, PCIE)


def test_two_sockets_without_peer_access_across_them_fall_back_to_nccl():
    # GPUs 0-3 and 4-7 on two root complexes: no peer access between the halves.
    def link(i, j):
        return PCIE_NO_ATOMICS if (i < 4) == (j < 4) else PeerLink(False, False, nvlink=False)

    p = gb.plan(machine(8, link))
    assert p.backend == NCCL and p.signal is None
    assert p.reason.startswith("no peer access between ranks [(0, 4), (0, 5)")


def test_one_pair_with_partial_atomics_takes_flags():
    def link(i, j):
        return PeerLink(True, True, partial_atomics=(i, j) == (1, 0), nvlink=True)

    p = gb.plan(machine(2, link))
    assert (p.signal, p.link_class) == (FLAGS, NVLINK)
    assert "partial atomics" in p.pairs


def test_a_peer_gpu_this_rank_cannot_see_means_nccl():
    p = gb.plan(machine(3, lambda i, j: None if (i, j) == (2, 0) else NVLINK_H200))
    assert p.backend == NCCL and "(2, 0)" in p.reason and "2->0 not visible" in p.pairs


def test_two_ranks_on_one_gpu_means_nccl():
    reps = machine(2)
    reps[1] = RankReport("node0", bus(0), True, links={bus(1): NVLINK_H200})
    p = gb.plan(reps)
    assert p.backend == NCCL and "distinct devices" in p.reason


@pytest.mark.parametrize("report, words", [
    (dict(host=lambda i: f"node{i}"), "2 hosts"),
    (dict(nccl_p2p_disable="1"), "NCCL_P2P_DISABLE=1"),
    (dict(symmetric_memory="No module named x"), "symmetric memory unavailable on rank 0"),
])
def test_refusals(report, words):
    host = report.pop("host", lambda i: "node0")
    p = gb.plan(machine(2, host=host, **report))
    assert p.backend == NCCL and words in p.reason
    with pytest.raises(ValueError, match="backend 'p2p' requested but not possible"):
        reps = machine(2, host=host, **report, backend=P2P, backend_from="backend='p2p' argument")
        gb.plan(reps)


def test_nccl_p2p_disable_zero_does_not_refuse():
    assert gb.plan(machine(2, nccl_p2p_disable="0")).backend == P2P


def test_no_cuda_build_means_nccl():
    reps = [RankReport("node0", bus(i), False) for i in range(2)]
    assert gb.plan(reps).reason == "the extension was built without CUDA"


def test_requests_from_argument_and_environment():
    env = {gb.BACKEND_ENV: "nccl", gb.SIGNAL_ENV: "Flags"}
    assert gb.requested("auto", env, gb.BACKEND_ENV, gb.BACKENDS) == ("nccl", "EAGLE3_CAPTURE_GATHER_BACKEND=nccl")
    assert gb.requested("p2p", env, gb.BACKEND_ENV, gb.BACKENDS) == ("p2p", "backend='p2p' argument")
    assert gb.requested("auto", env, gb.SIGNAL_ENV, gb.SIGNALS) == ("flags", "EAGLE3_CAPTURE_GATHER_SIGNAL=Flags")
    assert gb.requested("auto", {}, gb.SIGNAL_ENV, gb.SIGNALS) == ("auto", "default")
    with pytest.raises(ValueError, match=r"EAGLE3_CAPTURE_GATHER_SIGNAL must be one of \['auto', 'atomic', 'flags'\], "
                                         r"got 'sometimes'"):
        gb.requested("auto", {gb.SIGNAL_ENV: "sometimes"}, gb.SIGNAL_ENV, gb.SIGNALS)


def test_nccl_requested():
    p = gb.plan(machine(2, backend=NCCL, backend_from="EAGLE3_CAPTURE_GATHER_BACKEND=nccl"))
    assert p.backend == NCCL and p.reason == "requested (EAGLE3_CAPTURE_GATHER_BACKEND=nccl)"


def test_flags_forced_on_nvlink_for_testing():
    p = gb.plan(machine(2, signal=FLAGS, signal_from="EAGLE3_CAPTURE_GATHER_SIGNAL=flags"))
    assert (p.backend, p.signal, p.link_class) == (P2P, FLAGS, NVLINK)
    assert "flags signal requested (EAGLE3_CAPTURE_GATHER_SIGNAL=flags)" in p.reason


def test_atomic_forced_without_native_atomics_is_refused():
    with pytest.raises(ValueError, match=r"signal 'atomic' requested, but ranks \[\(0, 1\), \(1, 0\)\] have no native"):
        gb.plan(machine(2, lambda i, j: PCIE_NO_ATOMICS, signal=ATOMIC))


def test_requests_that_differ_across_ranks_are_refused_on_every_rank():
    reps = machine(2)
    reps[1] = RankReport(reps[1].host, reps[1].pci_bus_id, True, links=reps[1].links, signal=FLAGS,
                         signal_from="EAGLE3_CAPTURE_GATHER_SIGNAL=flags")
    with pytest.raises(ValueError, match=r"signal requested differs across ranks: rank 0 'auto' \(\), rank 1 'flags'"):
        gb.plan(reps)


def test_a_malformed_request_on_one_rank_is_raised_by_every_rank():
    reps = machine(2)
    reps[1] = RankReport(reps[1].host, reps[1].pci_bus_id, True, request_error="EAGLE3_CAPTURE_GATHER_BACKEND must be")
    with pytest.raises(ValueError, match="rank 1: EAGLE3_CAPTURE_GATHER_BACKEND must be"):
        gb.plan(reps)


def test_local_report_carries_a_malformed_environment_instead_of_raising():
    rep = gb.local_report(0, env={gb.BACKEND_ENV: "fastest"})
    assert "EAGLE3_CAPTURE_GATHER_BACKEND must be one of" in rep.request_error


def test_local_report_carries_a_tuning_error():
    rep = gb.local_report(0, tuning_error="EAGLE3_CAPTURE_GATHER_BLOCKS must be an integer in 1..1024, got '0'")
    with pytest.raises(ValueError, match="rank 0: EAGLE3_CAPTURE_GATHER_BLOCKS must be"):
        gb.plan([rep, rep])


def test_local_report_reads_requests_and_nccl_p2p_disable():
    rep = gb.local_report(0, signal="flags", env={gb.BACKEND_ENV: "p2p", "NCCL_P2P_DISABLE": "1"})
    assert (rep.backend, rep.signal, rep.nccl_p2p_disable) == (P2P, FLAGS, "1")
    assert rep.backend_from == "EAGLE3_CAPTURE_GATHER_BACKEND=p2p" and rep.signal_from == "signal='flags' argument"


def test_log_once_per_decision(caplog):
    p = gb.plan(machine(2, lambda i, j: PCIE_NO_ATOMICS))
    gb._LOGGED.clear()
    with caplog.at_level(logging.INFO, logger="eagle3_capture.tp"):
        gb.log_once(p, 2)
        gb.log_once(p, 2)
    lines = [r.getMessage() for r in caplog.records if r.name == "eagle3_capture.tp"]
    assert len(lines) == 1
    assert lines[0].startswith("eagle3_capture gather (2 ranks): p2p kernel, flags signal, pcie grid: peer access")


def test_nvml_link_type(monkeypatch):
    calls = []
    fake = types.SimpleNamespace(
        NVML_P2P_CAPS_INDEX_NVLINK=2, NVML_P2P_STATUS_OK=0, nvmlInit=lambda: calls.append("init"),
        nvmlDeviceGetHandleByPciBusId=lambda b: b,
        nvmlDeviceGetP2PStatus=lambda a, b, idx: 0 if {a, b} == {bus(0), bus(1)} and idx == 2 else 5)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    assert gb._nvlink_between(bus(0), bus(1)) is True
    assert gb._nvlink_between(bus(0), bus(2)) is False

    def broken(_):
        raise RuntimeError("NVML not supported")

    monkeypatch.setattr(fake, "nvmlDeviceGetHandleByPciBusId", broken)
    assert gb._nvlink_between(bus(0), bus(1)) is None
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    assert gb._nvlink_between(bus(0), bus(1)) is None
