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

import json
import logging
import pickle
import sys
import time
import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Callable, List, Optional, Sequence

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
# gloo runs a collective on one of its worker threads, and the work object that thread holds keeps a C++ reference
# to each of the call's tensors; the worker marks the work complete first and drops it a moment later, so the
# caller can see the call return before gloo has let go. torch keeps a tensor's Python object alive while a C++
# reference besides the object's own exists (PyObject preservation, c10/util/intrusive_ptr.h): the C++ count going
# from 2 to 1 decrefs the Python object, and that takes the GIL -- however many references Python itself holds. A
# process that is finalizing its interpreter in that moment (a script that ends right after a gather's ValueError,
# the gatherer's own set-up collectives a few milliseconds before) ends a thread that waits for the GIL with
# pthread_exit; inside that noexcept decrement it is std::terminate: SIGABRT, "terminate called without an active
# exception" (core dumps: gloo's worker in ~AsyncWork -> TensorImpl::decref_pyobject -> take_gil -> pthread_exit;
# docs/status.md has the rates). Keeping the tensors referenced from Python does not help: the decrement takes the
# GIL all the same. Not returning before gloo has let go does: each of the gatherer's gloo collectives waits, once
# complete, until its tensors' Python reference counts are back where they were before the call -- the worker's
# decrement has then run, under the GIL, which the wait gives up while it sleeps. Usually there is nothing to wait
# for; on a loaded machine a worker descheduled for a few milliseconds is.

_RELEASE_POLL_S = 0.0002  # between looks at the reference counts, the GIL is free for the worker's decrement
# A worker comes round to its decrement within milliseconds even on a loaded machine; a count still raised after
# this long is held by something else (a profiler, an in-flight-work registry): warn once and go on.
_RELEASE_WAIT_S = 5.0
_warned_unreleased = False


def _py_refs(tensors: Sequence[torch.Tensor]) -> List[int]:
    return [sys.getrefcount(t) for t in tensors]


def gloo_collective(run: Callable[[], object], tensors: Sequence[torch.Tensor]) -> None:
    """Runs ``run()``, a blocking gloo collective over ``tensors`` (made by the caller and referenced only by it),
    and returns once gloo's worker thread has let go of them (see above): a process may end right after."""
    global _warned_unreleased
    before = _py_refs(tensors)
    run()
    deadline = time.monotonic() + _RELEASE_WAIT_S
    while any(now > then for now, then in zip(_py_refs(tensors), before)):
        if time.monotonic() > deadline:
            if not _warned_unreleased:
                _warned_unreleased = True
                logging.getLogger("eagle3_capture.tp").warning(
                    "a gloo collective's tensors were still referenced from C++ %.0f s after it completed (something "
                    "other than gloo's worker holds them); a process that exits while that reference is dropped can "
                    "abort", _RELEASE_WAIT_S)
            return
        time.sleep(_RELEASE_POLL_S)


def all_gather_objects(group: Optional[dist.ProcessGroup], obj, world: int) -> list:
    """Every rank's picklable ``obj``, in rank order. Collective. ``dist.all_gather_object``, except that on gloo
    it returns only once gloo's worker has let go of the tensors it exchanged (gloo_collective): it is the
    gatherer's last collective before its first gather, and a process may end right after that gather's error."""
    if dist.get_backend(group) != "gloo":
        everyone: list = [None] * world
        dist.all_gather_object(everyone, obj, group=group)
        return everyone
    data = pickle.dumps(obj)
    size = torch.tensor([len(data)], dtype=torch.int64)
    sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
    gloo_collective(lambda: dist.all_gather(sizes, size, group=group), [size, *sizes])
    longest = max(int(s) for s in sizes)
    mine = torch.zeros(longest, dtype=torch.uint8)
    mine[:len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    outs = [torch.empty(longest, dtype=torch.uint8) for _ in range(world)]
    gloo_collective(lambda: dist.all_gather(outs, mine, group=group), [mine, *outs])
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
           "all_gather_objects", "gloo_collective"]
