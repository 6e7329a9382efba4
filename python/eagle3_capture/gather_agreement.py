"""Before each gather, the ranks of a `tp.PackedGatherer` agree on its arguments, host-side and within the
gatherer's `timeout_s`, so that a disagreement ends on every rank in a Python exception instead of a collective
of mismatched sizes (gloo aborts the process, NCCL and the p2p kernel return wrong rows) or a wait for the process
group's own timeout (30 minutes by default).

The exchange goes through the process group's key-value store (the one `init_process_group` set up), not through
a collective: a rank that never calls leaves nothing pending in the group, and the waiting ranks can tell which
rank is missing. Per call n every rank writes its header (its row count, the `rows_per_rank` it was given, and a
problem its own arguments have), waits for every rank's header, and then one atomic `compare_set` on the call's
outcome key decides "ok" or "gave up": the first rank to decide wins, so a rank that timed out and a rank that
saw every header a moment later cannot go different ways. A rank that arrives after the others gave up finds the
decision and raises too.
"""
from __future__ import annotations

import collections
import ctypes
import json
import pickle
import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import List, Optional, Sequence

import torch
import torch.distributed as dist

_OK = b"ok"
_GAVE_UP = "gave up: "


class AgreementTimeout(RuntimeError):
    """A rank did not reach the gather within the timeout (the gatherer cannot be used again)."""


@dataclass(frozen=True)
class Header:
    rows: int                        # this rank's local row count
    rows_per_rank: Optional[List[int]]  # as given (None: not given); entries that are not integers are a problem
    problem: Optional[str]           # what is wrong with this rank's own arguments, or None

    def encode(self) -> str:
        return json.dumps({"rows": self.rows, "rows_per_rank": self.rows_per_rank, "problem": self.problem})

    @staticmethod
    def decode(raw: bytes) -> "Header":
        d = json.loads(raw.decode())
        return Header(d["rows"], d["rows_per_rank"], d["problem"])


def group_store(group: Optional[dist.ProcessGroup]):
    """The key-value store of the process group (scoped to it by torch), or a RuntimeError saying why not."""
    from torch.distributed import distributed_c10d as c10d

    pg = group if group is not None else c10d._get_default_group()
    try:
        return c10d._get_process_group_store(pg)
    except (KeyError, AttributeError) as e:
        raise RuntimeError(f"the process group has no key-value store to agree on gather arguments through ({e})"
                           ) from None


# ----------------------------------------------------------------------------------------------------------------
# gloo collectives that a process can exit right after
# ----------------------------------------------------------------------------------------------------------------
#
# gloo runs a collective on one of its worker threads, and that thread drops its references to the call's tensors a
# moment after the caller has seen the call complete. When the caller's references are gone by then, the worker's
# drop frees the tensor, and a tensor made in Python frees its Python object there, which takes the GIL. A process
# that exits in that moment -- a script that ends right after a gather's ValueError, the gatherer's own set-up
# collectives a few milliseconds before -- is finalizing its interpreter, and CPython ends a thread that asks for the
# GIL then with pthread_exit; inside a C++ destructor that is std::terminate: SIGABRT, "terminate called without an
# active exception" (seen about once in 25 runs on a loaded two-core machine; `gloo all_gather, then exit` alone
# shows it too). The tensors of the gatherer's latest gloo collectives therefore keep one reference that the
# interpreter's teardown never drops, so a worker's late release is a plain decrement; a set is let go (in the
# caller's thread, holding the GIL) when newer collectives have replaced it.

_HELD_SETS = 4  # the set-up exchanges, then the latest gathers: a bounded few buffers, let go oldest first
_held: "collections.deque[List[object]]" = collections.deque()


def hold_collective_tensors(tensors: Sequence[object]) -> None:
    """Keep these tensors of a gloo collective referenced past interpreter teardown (see above); lets go of the
    oldest held set beyond the last few."""
    objs = [t for t in tensors if isinstance(t, torch.Tensor)]
    for t in objs:
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(t))
    _held.append(objs)
    while len(_held) > _HELD_SETS:
        for t in _held.popleft():
            ctypes.pythonapi.Py_DecRef(ctypes.py_object(t))


def all_gather_objects(group: Optional[dist.ProcessGroup], obj, world: int) -> list:
    """Every rank's picklable ``obj``, in rank order. Collective. ``dist.all_gather_object``, except that on gloo
    the tensors it exchanges stay held (hold_collective_tensors): it is the gatherer's last collective before its
    first gather, so a process that ends right after a gather's error would otherwise exit while gloo's worker
    still holds them."""
    if dist.get_backend(group) != "gloo":
        everyone: list = [None] * world
        dist.all_gather_object(everyone, obj, group=group)
        return everyone
    data = pickle.dumps(obj)
    size = torch.tensor([len(data)], dtype=torch.int64)
    sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(sizes, size, group=group)
    longest = max(int(s) for s in sizes)
    mine = torch.zeros(longest, dtype=torch.uint8)
    mine[:len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    outs = [torch.empty(longest, dtype=torch.uint8) for _ in range(world)]
    dist.all_gather(outs, mine, group=group)
    hold_collective_tensors([size, *sizes, mine, *outs])
    return [pickle.loads(bytes(o[:int(s)].tolist())) for o, s in zip(outs, sizes)]


def shared_prefix(group: Optional[dist.ProcessGroup], rank: int, world: int) -> str:
    """A key prefix unique to one gatherer, the same on every rank (rank 0 draws it). Collective."""
    mine = uuid.uuid4().hex if rank == 0 else None
    everyone = all_gather_objects(group, mine, world)
    return f"eagle3_capture/gather/{everyone[0]}"


class CallAgreement:
    """One gatherer's per-call exchange of headers (see the module docstring)."""

    def __init__(self, store, prefix: str, rank: int, world: int, timeout_s: float):
        self.store, self.prefix, self.rank, self.world = store, prefix, rank, world
        self.timeout = timedelta(seconds=float(timeout_s))
        self.timeout_s = float(timeout_s)
        self.calls = 0  # gathers agreed so far; the next one is number calls + 1

    def _hkey(self, n: int, r: int) -> str:
        return f"{self.prefix}/{n}/h/{r}"

    def _okey(self, n: int) -> str:
        return f"{self.prefix}/{n}/outcome"

    def exchange(self, header: Header) -> List[Header]:
        """Every rank's header of this call, in rank order; AgreementTimeout when a rank did not come in time."""
        n = self.calls + 1
        keys = [self._hkey(n, r) for r in range(self.world)]
        self.store.set(keys[self.rank], header.encode())
        waited = None
        try:
            self.store.wait(keys, self.timeout)
        except dist.DistStoreError:
            missing = [r for r, k in enumerate(keys) if not self.store.check([k])]
            waited = (f"rank {self.rank} waited {self.timeout_s:g} s (the gatherer's timeout_s) in gather #{n} for "
                      f"rank(s) {missing}, which did not call gather #{n}")
        outcome = self.store.compare_set(self._okey(n), "", _GAVE_UP + waited if waited else _OK.decode())
        if outcome != _OK:
            text = outcome.decode()[len(_GAVE_UP):]
            if waited is None:  # this rank came in after another one had given up
                text += f"; rank {self.rank} reached gather #{n} after that"
            raise AgreementTimeout(text)
        if waited is not None:  # another rank saw every header first: they are all there
            self.store.wait(keys, self.timeout)
        headers = [Header.decode(v) for v in self.store.multi_get(keys)]
        # Every rank has written call n's header, so each is done with call n-1: its keys can go.
        if n > 1:
            self.store.delete_key(self._hkey(n - 1, self.rank))
            if self.rank == 0:
                self.store.delete_key(self._okey(n - 1))
        self.calls = n
        return headers


    def give_up(self, reason: str) -> None:
        """Decide the next call as given up (this rank cannot take part any more), so that the peers' next gather
        raises with the reason instead of waiting out the timeout: this rank's header is there for them to find."""
        n = self.calls + 1
        self.store.set(self._hkey(n, self.rank), Header(-1, None, reason).encode())
        self.store.compare_set(self._okey(n), "", _GAVE_UP + f"rank {self.rank} cannot gather any more: "
                               + reason)


def disagreement(headers: Sequence[Header], n: int, layout_rows: bool) -> Optional[str]:
    """What the ranks' arguments of gather #n disagree on (or what one rank's are wrong in), None when they fit.
    Every rank computes it from the same headers, so every rank reaches the same verdict."""
    probs = [f"rank {r}: {h.problem}" for r, h in enumerate(headers) if h.problem]
    if probs:
        return f"gather #{n}: " + "; ".join(probs)
    rows = [h.rows for h in headers]
    given = [h.rows_per_rank for h in headers]
    if not layout_rows:
        if len(set(rows)) > 1:
            return (f"gather #{n}: layout 'columns' needs the same row count on every rank, got local rows "
                    + ", ".join(f"rank {r}: {v}" for r, v in enumerate(rows)))
        return None
    if all(g is None for g in given):
        if len(set(rows)) > 1:
            return (f"gather #{n}: rows_per_rank=None means every rank has the same row count, but the local rows are "
                    + ", ".join(f"rank {r}: {v}" for r, v in enumerate(rows))
                    + "; pass rows_per_rank (the same list on every rank)")
        return None
    if any(g != given[0] for g in given):
        return (f"gather #{n}: the ranks passed different rows_per_rank: "
                + ", ".join(f"rank {r}: {g}" for r, g in enumerate(given)))
    return None


__all__ = ["AgreementTimeout", "Header", "CallAgreement", "group_store", "shared_prefix", "disagreement",
           "all_gather_objects", "hold_collective_tensors"]
