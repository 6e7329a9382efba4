"""Which backend (p2p kernel or NCCL) and which arrival signal the TP gather uses, from what the devices report.

The p2p kernel (csrc/kernels/gather.h) orders ranks either with system-scope atomics into one counter per peer
(signal "atomic": needs native peer atomics on every link, which NVLink gives and PCIe may not) or with one
plain-store flag per block and peer (signal "flags": needs only ordered stores). `plan()` decides, per machine, from
every rank's `RankReport`:

- NCCL when a rank asks for it, the ranks are on different hosts, the extension has no CUDA, torch symmetric memory
  is missing, NCCL_P2P_DISABLE is set on a rank (the machine's owner found peer-to-peer broken there), or any pair of
  the group's GPUs lacks peer access;
- otherwise p2p, with the atomic signal where every pair reports native atomics (cudaDevP2PAttrNativeAtomicSupported,
  and not only a partial set), the flags signal where any pair does not.

Overrides, for a process: EAGLE3_CAPTURE_GATHER_BACKEND = auto | p2p | nccl (a PackedGatherer's own `backend`
argument, when not "auto", wins) and EAGLE3_CAPTURE_GATHER_SIGNAL = auto | atomic | flags (likewise its `signal`):
"flags" forces the non-atomic protocol on NVLink (to test it on an H200 pair); "atomic" where a pair lacks native
atomics is refused, since arrivals could be lost. The decision is logged once per process and configuration
(logger "eagle3_capture.tp", INFO).
"""
from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass, field
from typing import Mapping, Optional, Sequence

logger = logging.getLogger("eagle3_capture.tp")

P2P, NCCL = "p2p", "nccl"
ATOMIC, FLAGS = "atomic", "flags"
SIGNAL_CODES = {ATOMIC: 0, FLAGS: 1}  # e3::kGatherSignalAtomic / kGatherSignalFlags
BACKEND_ENV = "EAGLE3_CAPTURE_GATHER_BACKEND"
SIGNAL_ENV = "EAGLE3_CAPTURE_GATHER_SIGNAL"
NVLINK, PCIE = "nvlink", "pcie"


@dataclass(frozen=True)
class PeerLink:
    """What one rank's runtime says about the link from its GPU to another GPU of the host."""
    access: bool
    native_atomics: bool
    partial_atomics: bool = False  # only some atomic operations over the link (CUDA 13)
    performance_rank: int = 0      # 0 = the host's best link class
    nvlink: Optional[bool] = None  # from NVML when it can say, else None
    error: int = 0                 # a failed cudaDeviceGetP2PAttribute query (cudaError_t)


@dataclass(frozen=True)
class RankReport:
    """What one rank knows about itself, gathered from every rank before the decision."""
    host: str
    pci_bus_id: str
    cuda_build: bool
    symmetric_memory: str = ""                            # "" when torch symmetric memory imports, else why not
    nccl_p2p_disable: str = ""                            # the rank's NCCL_P2P_DISABLE, as set
    links: Mapping[str, PeerLink] = field(default_factory=dict)  # by the other GPU's PCI bus id
    backend: str = "auto"                                 # what this rank asks for (argument, else environment)
    signal: str = "auto"
    backend_from: str = ""                                # where the request came from, in words
    signal_from: str = ""
    request_error: str = ""                               # a malformed request (raised on every rank by plan)


@dataclass(frozen=True)
class GatherPlan:
    backend: str              # P2P or NCCL
    signal: Optional[str]     # ATOMIC or FLAGS with P2P
    link_class: Optional[str] # NVLINK or PCIE with P2P: which tuned grid the kernel launches with
    reason: str               # why, in words
    pairs: str = ""           # every pair's report, for the log line

    def describe(self, world: int) -> str:
        what = f"p2p kernel, {self.signal} signal, {self.link_class} grid" if self.backend == P2P else "NCCL"
        return f"eagle3_capture gather ({world} ranks): {what}: {self.reason}" + (
            f" | links {self.pairs}" if self.pairs else "")


def _truthy(value: str) -> bool:
    return value.strip().lower() not in ("", "0", "false", "no", "off")


BACKENDS = ("auto", P2P, NCCL)
SIGNALS = ("auto", ATOMIC, FLAGS)


def requested(arg: str, env: Mapping[str, str], name: str, allowed: Sequence[str]) -> tuple[str, str]:
    """(request, where it came from): the constructor argument when it is not "auto", else the environment variable
    `name`, else "auto"."""
    what = name.split("_")[-1].lower()
    if arg not in allowed:
        raise ValueError(f"{what} must be one of {list(allowed)}, got {arg!r}")
    if arg != "auto":
        return arg, f"{what}={arg!r} argument"
    raw = env.get(name, "")
    value = raw.strip().lower() or "auto"
    if value not in allowed:
        raise ValueError(f"{name} must be one of {list(allowed)}, got {raw!r}")
    return value, (f"{name}={raw}" if raw.strip() else "default")


def _pair_text(r: int, q: int, link: Optional[PeerLink]) -> str:
    if link is None:
        return f"{r}->{q} not visible"
    kind = "nvlink" if link.nvlink else ("pcie" if link.nvlink is False else "link ?")
    atom = "atomics" if link.native_atomics and not link.partial_atomics else (
        "partial atomics" if link.partial_atomics else "no atomics")
    acc = "access" if link.access else "NO ACCESS"
    err = f" err {link.error}" if link.error else ""
    return f"{r}->{q} {acc} {atom} rank {link.performance_rank} {kind}{err}"


def plan(reports: Sequence[RankReport]) -> GatherPlan:
    """The backend and signal for a group whose rank r reported reports[r]; every rank computes the same plan from
    the same reports. Raises ValueError for requests that differ across ranks (the ranks would run different
    protocols) or that the machine cannot honour (backend 'p2p' where it is not possible, signal 'atomic' where a
    pair lacks native atomics)."""
    world = len(reports)
    bad = [(i, r.request_error) for i, r in enumerate(reports) if r.request_error]
    if bad:
        raise ValueError(f"rank {bad[0][0]}: {bad[0][1]}")
    for what in ("backend", "signal"):
        asked = [getattr(r, what) for r in reports]
        if len(set(asked)) > 1:
            raise ValueError(f"the gather {what} requested differs across ranks: "
                             + ", ".join(f"rank {i} {a!r} ({getattr(reports[i], what + '_from')})"
                                         for i, a in enumerate(asked)))
    want_backend, want_signal = reports[0].backend, reports[0].signal

    def refuse(why: str) -> GatherPlan:
        if want_backend == P2P:
            raise ValueError(f"gather backend 'p2p' requested but not possible: {why}")
        return GatherPlan(NCCL, None, None, why)

    if want_backend == NCCL:
        return GatherPlan(NCCL, None, None, f"requested ({reports[0].backend_from})")
    hosts = sorted({r.host for r in reports})
    if len(hosts) > 1:
        return refuse(f"the ranks are on {len(hosts)} hosts ({', '.join(hosts)}); peer memory is one host's")
    if not all(r.cuda_build for r in reports):
        return refuse("the extension was built without CUDA")
    missing = [(i, r.symmetric_memory) for i, r in enumerate(reports) if r.symmetric_memory]
    if missing:
        return refuse(f"torch symmetric memory unavailable on rank {missing[0][0]} ({missing[0][1]})")
    disabled = [i for i, r in enumerate(reports) if _truthy(r.nccl_p2p_disable)]
    if disabled:
        return refuse(f"NCCL_P2P_DISABLE={reports[disabled[0]].nccl_p2p_disable} on ranks {disabled}: peer-to-peer "
                      "is declared broken on this machine")
    buses = [r.pci_bus_id for r in reports]
    if len(set(buses)) != world or not all(buses):
        return refuse(f"the ranks' GPUs are not {world} distinct devices with PCI bus ids ({buses})")
    links = {(i, j): reports[i].links.get(buses[j]) for i in range(world) for j in range(world) if i != j}
    pairs = "; ".join(_pair_text(i, j, link) for (i, j), link in links.items())
    no_access = [(i, j) for (i, j), link in links.items() if link is None or not link.access]
    if no_access:
        p = refuse(f"no peer access between ranks {no_access[:6]}{' ...' if len(no_access) > 6 else ''}")
        return GatherPlan(p.backend, None, None, p.reason, pairs)
    no_atomics = [(i, j) for (i, j), link in links.items() if not link.native_atomics or link.partial_atomics]
    if want_signal == ATOMIC and no_atomics:
        raise ValueError(f"gather signal 'atomic' requested, but ranks {no_atomics[:6]} have no native peer atomics "
                         "(arrivals could be lost); use 'flags' or 'auto'")
    if want_signal == FLAGS:
        sig, why = FLAGS, f"flags signal requested ({reports[0].signal_from})"
    elif no_atomics:
        sig, why = FLAGS, f"peer access everywhere, no native peer atomics between ranks {no_atomics[:6]}"
    else:
        sig, why = ATOMIC, "peer access and native peer atomics between every pair"
    # The grid: NVLink-class where NVML says every link is NVLink, or cannot say and every link has native atomics
    # (what NVLink gives); PCIe-class otherwise.
    nv = [link.nvlink for link in links.values()]
    nvlink = all(nv) if all(v is not None for v in nv) else not no_atomics
    return GatherPlan(P2P, sig, NVLINK if nvlink else PCIE, why, pairs)


def _nvlink_between(bus_a: str, bus_b: str) -> Optional[bool]:
    """Whether NVML says two GPUs are linked by NVLink; None when NVML (pynvml) is not there or cannot say."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        a = pynvml.nvmlDeviceGetHandleByPciBusId(bus_a)
        b = pynvml.nvmlDeviceGetHandleByPciBusId(bus_b)
        status = pynvml.nvmlDeviceGetP2PStatus(a, b, pynvml.NVML_P2P_CAPS_INDEX_NVLINK)
        return status == pynvml.NVML_P2P_STATUS_OK
    except Exception:  # noqa: BLE001 - any NVML failure means "cannot say"
        return None


def local_report(device_index: int, backend: str = "auto", signal: str = "auto",
                 env: Optional[Mapping[str, str]] = None, tuning_error: str = "") -> RankReport:
    """This rank's report: its requests (argument, else environment), its GPU's PCI bus id, the runtime's link
    attributes to every other visible GPU (eagle3_capture._C.device_report), torch symmetric memory,
    NCCL_P2P_DISABLE. `tuning_error`: a malformed tuning override on this rank, raised by plan() on every rank."""
    import importlib
    import json

    from .native import build_info, load

    env = os.environ if env is None else env
    try:  # a malformed request travels in the report, so every rank raises (not only this one, leaving the rest
        # waiting in the collective)
        b, b_from = requested(backend, env, BACKEND_ENV, BACKENDS)
        sg, s_from = requested(signal, env, SIGNAL_ENV, SIGNALS)
        asks = dict(backend=b, signal=sg, backend_from=b_from, signal_from=s_from)
    except ValueError as e:
        asks = dict(request_error=str(e))
    if tuning_error:
        asks = dict(request_error=tuning_error)
    host = socket.gethostname()
    disable = env.get("NCCL_P2P_DISABLE", "")
    if "cuda" not in build_info()["backends"]:
        return RankReport(host, f"device {device_index}", False, nccl_p2p_disable=disable, **asks)
    try:
        importlib.import_module("torch.distributed._symmetric_memory")
        symm = ""
    except ImportError as e:
        symm = str(e)
    rep = json.loads(load().device_report(int(device_index)))
    links = {}
    for link in rep["links"]:
        if not link["pci_bus_id"]:
            continue
        links[link["pci_bus_id"]] = PeerLink(
            access=bool(link["access"]), native_atomics=bool(link["native_atomics"]),
            partial_atomics=bool(link["partial_atomics"]), performance_rank=int(link["performance_rank"]),
            nvlink=_nvlink_between(rep["pci_bus_id"], link["pci_bus_id"]), error=int(link["error"]))
    return RankReport(host, rep["pci_bus_id"], True, symm, disable, links, **asks)


_LOGGED: set = set()


def log_once(p: GatherPlan, world: int) -> None:
    """One INFO line per process and distinct decision."""
    line = p.describe(world)
    if line not in _LOGGED:
        _LOGGED.add(line)
        logger.info("%s", line)
