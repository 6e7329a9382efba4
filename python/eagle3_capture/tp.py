"""TP-aware gathering of the packed capture buffer over a torch.distributed process group.

One file over 400 lines: PackedGatherer's backends (p2p, NCCL, gloo), its probe and its agreement round share the
gatherer's state and one public gather(); split, each part would reach into the others' private fields.

Under tensor parallelism with scattered rows (attention data parallel, a reduce-scattered residual) each rank holds
only its own tokens' taps, yet the draft's fc needs every token's. `PackedGatherer` puts every rank's rows into
every rank's packed [rows, K*H] buffer:

- backend "p2p" (CUDA, every pair of GPUs peer-accessible): one kernel per rank pushes its rows into every rank's
  registered output over peer-mapped memory (torch symmetric memory, multicast never used) and orders ranks with
  signals in peer memory, not host syncs: atomic counters where every link has native peer atomics (NVLink), one
  plain-store flag per block otherwise (PCIe); CUDA-graph capturable. A peer that does not arrive within
  `timeout_s` is fatal, as a collective timeout under NCCL's watchdog is: the kernel writes the error word (which
  peer, which step) and executes a device trap, so the CUDA context is lost and no rank ever goes on with rows that
  only look gathered (a timed-out gather cannot be undone from the device: the ranks' gather numbers no longer pair
  up). `check()` and `failure()` turn the error word into a GatherTimeout naming the rank and the step, and
  `raise_if_a_gather_failed()` polls every live p2p gatherer of the process without a CUDA call (the SGLang plugin
  runs it around the EAGLE worker's draft extend, outside the captured region, since a graph replay runs no
  Python). The default timeout is torch's default NCCL process-group timeout (10 minutes; SGLang passes its
  `--dist-timeout` when set).
- backend "nccl" (CUDA otherwise) and "gloo" (CPU tensors): the same API and results through all_gather.
Which CUDA backend and signal a machine gets is `gather_backend.plan`'s decision (logged once), from what every
rank's devices report; EAGLE3_CAPTURE_GATHER_BACKEND / EAGLE3_CAPTURE_GATHER_SIGNAL override it. A p2p gatherer
runs one probe gather of known rows before its first use and moves every rank to NCCL (same results, one warning)
if any rank's rows did not arrive.

Layouts: "rows" — each rank holds [T_r, K*H] (uneven T_r allowed, given as rows_per_rank), rank r's rows land at
row offset sum(T_q, q < r). "columns" — each rank holds H/tp columns of every tap, [T, K*H/tp], and the gather
fills the strided column slots: out[:, k*H + r*H/tp : k*H + (r+1)*H/tp] = local[:, k*H/tp : (k+1)*H/tp].

Every gather first agrees its arguments across the ranks (`gather_agreement`): ranks that pass different
`rows_per_rank`, uneven local rows without it, or arguments one rank refuses get a ValueError on every rank naming
the rank and what differed; a rank that does not call gather within `timeout_s` gets the others a GatherTimeout
naming it (and itself one when it comes later). The exchange is host-side, so it runs when a CUDA graph is
captured, not at its replays.
"""
from __future__ import annotations

import importlib
import operator
import os
import weakref
from dataclasses import dataclass
from typing import Optional, Sequence

import torch
import torch.distributed as dist

from . import gather_agreement, gather_backend

ROWS = "rows"
COLUMNS = "columns"
_STEPS = {1: "waiting for the peer to enter the gather", 2: "waiting for the peer's rows to arrive",
          3: "reading a malformed arrival flag of the peer"}
_ERR_BROKEN = 4  # e3::kGatherErrBroken


class GatherTimeout(RuntimeError):
    """A peer did not reach the gather within the timeout; the gatherer cannot be used again."""


def default_timeout_s() -> float:
    """torch's default NCCL process-group timeout in seconds (10 minutes): the scale at which NCCL's watchdog ends a
    collective that does not complete, and what SGLang's groups get unless `--dist-timeout` says otherwise."""
    try:
        from torch.distributed.constants import default_pg_nccl_timeout

        if default_pg_nccl_timeout is not None:
            return float(default_pg_nccl_timeout.total_seconds())
    except ImportError:
        pass
    return 600.0


# Every p2p gatherer in use in this process (its probe passed), for raise_if_a_gather_failed().
_LIVE_P2P: "weakref.WeakSet[PackedGatherer]" = weakref.WeakSet()


def raise_if_a_gather_failed() -> None:
    """Raises GatherTimeout if a p2p gather of this process gave up (its kernel wrote the error word). Reads only
    the host-mapped error words: no CUDA call, no sync, so it costs microseconds and works after the kernel's trap
    has lost the CUDA context. Run it where Python runs between graph replays that contain gathers."""
    if not _LIVE_P2P:  # the common case (no p2p gatherer in this process): no copy of the set
        return
    for g in list(_LIVE_P2P):
        why = g.failure()
        if why:
            raise GatherTimeout(why)


@dataclass(frozen=True)
class _Config:
    world: int
    dtype: str
    num_taps: int
    hidden_size: int
    max_rows_per_rank: int
    layout: str
    device_type: str


def _no_multicast_env() -> None:
    # NVLink multicast can take a shared host's GPUs out of service: never let torch or NCCL use it.
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")


class PackedGatherer:
    """Gathers every rank's packed taps into every rank's [rows, K*H] buffer. Collective: construct on all ranks."""

    def __init__(self, group: Optional[dist.ProcessGroup], *, num_taps: int, hidden_size: int, dtype: torch.dtype,
                 max_rows_per_rank: int, device: Optional[torch.device] = None, layout: str = ROWS,
                 timeout_s: Optional[float] = None, backend: str = "auto", blocks: Optional[int] = None,
                 signal: str = "auto"):
        if layout not in (ROWS, COLUMNS):
            raise ValueError(f"layout must be {ROWS!r} or {COLUMNS!r}, got {layout!r}")
        if num_taps < 1 or hidden_size < 1 or max_rows_per_rank < 0:
            raise ValueError(f"num_taps and hidden_size must be >= 1 and max_rows_per_rank >= 0, got "
                             f"{num_taps}, {hidden_size}, {max_rows_per_rank}")
        if timeout_s is None:
            timeout_s = default_timeout_s()
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not 0 < timeout_s <= 1e6:
            raise ValueError(f"timeout_s must be a number of seconds in (0, 1e6], got {timeout_s!r}")
        if signal not in gather_backend.SIGNALS:
            raise ValueError(f"signal must be one of {list(gather_backend.SIGNALS)}, got {signal!r}")
        self.group = group
        self.world = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        if self.world > 16:
            raise ValueError(f"at most 16 ranks are supported, the group has {self.world}")
        self.device = torch.device(device) if device is not None else (
            torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() and
            dist.get_backend(group) != "gloo" else torch.device("cpu"))
        if layout == COLUMNS and hidden_size % self.world:
            raise ValueError(f"layout 'columns' needs hidden_size {hidden_size} divisible by the world size {self.world}")
        self.num_taps, self.hidden_size, self.dtype, self.layout = num_taps, hidden_size, dtype, layout
        self.max_rows_per_rank = max_rows_per_rank
        self.width = num_taps * hidden_size
        if blocks is not None and not 1 <= int(blocks) <= 1024:
            raise ValueError(f"blocks must be in 1..1024 (or None for the device's tuned grid), got {blocks}")
        self.timeout_s = float(timeout_s)
        self._check_same_config()
        self._agreement = self._setup_agreement()
        self.plan: Optional[gather_backend.GatherPlan] = None
        self.backend = self._choose_backend(backend, signal)
        self.signal = self.plan.signal if self.plan is not None else None
        # p2p grid: the device's tuned grid for the link class (eagle3_capture.tuning: twice the SM count over
        # NVLink, measured on the H200; 64 blocks over PCIe, reasoned), unless `blocks` says otherwise.
        self.blocks = int(blocks) if blocks is not None else self._tuned_blocks()
        self._broken: Optional[str] = None
        if self.backend == "p2p":
            self._setup_p2p()
            self._fall_back_unless_probe_passes()

    # ------------------------------------------------------------------ setup

    def _check_same_config(self) -> None:
        mine = _Config(self.world, str(self.dtype), self.num_taps, self.hidden_size, self.max_rows_per_rank,
                       self.layout, self.device.type)
        everyone = gather_agreement.all_gather_objects(self.group, mine, self.world)  # gloo: released
        bad = [(r, c) for r, c in enumerate(everyone) if c != mine]
        if bad:
            diffs = "; ".join(f"rank {r}: {c}" for r, c in bad)
            raise ValueError(f"PackedGatherer configuration differs across ranks (rank {self.rank} has {mine}); {diffs}")

    def _setup_agreement(self) -> gather_agreement.CallAgreement:
        store = gather_agreement.group_store(self.group)
        prefix = gather_agreement.shared_prefix(self.group, self.rank, self.world)
        return gather_agreement.CallAgreement(store, prefix, self.rank, self.world, self.timeout_s)

    def _choose_backend(self, backend: str, signal: str) -> str:
        if self.device.type == "cpu":
            if backend not in ("auto", "gloo"):
                raise ValueError(f"backend {backend!r} needs CUDA tensors; this gatherer is on CPU (gloo)")
            return "gloo"
        if backend not in ("auto", "p2p", "nccl"):
            raise ValueError(f"backend must be 'auto', 'p2p', 'nccl' or 'gloo', got {backend!r}")
        from . import tuning

        index = torch.cuda.current_device() if self.device.index is None else self.device.index
        self._tuning = tuning.for_device(index)["tuning"]
        # A malformed tuning override travels in the report, so every rank raises, not this one alone.
        mine = gather_backend.local_report(index, backend, signal, tuning_error=self._tuning["error"])
        reports: list = [None] * self.world
        dist.all_gather_object(reports, mine, group=self.group)
        try:
            self.plan = gather_backend.plan(reports)
        except ValueError as e:
            raise RuntimeError(str(e)) from None
        gather_backend.log_once(self.plan, self.world)
        return self.plan.backend

    def _tuned_blocks(self) -> int:
        if self.device.type != "cuda" or self.backend != "p2p":
            return 1
        t = self._tuning
        return int(t["gather_blocks_nvlink"] if self.plan.link_class == gather_backend.NVLINK
                   else t["gather_blocks_pcie"])

    def _setup_p2p(self) -> None:
        _no_multicast_env()
        symm_mem = importlib.import_module("torch.distributed._symmetric_memory")

        from . import native

        native.load()
        try:
            symm_mem.set_backend("CUDA")
        except Exception:  # older torch: the CUDA backend is the only one
            pass
        out_rows = self.world * self.max_rows_per_rank if self.layout == ROWS else self.max_rows_per_rank
        es = torch.tensor([], dtype=self.dtype).element_size()
        data_bytes = max(out_rows, 1) * self.width * es
        data_bytes = (data_bytes + 255) // 256 * 256
        flag_words = int(native.load().gather_flag_words())  # e3::kGatherFlagWords
        buf = symm_mem.empty(data_bytes + flag_words * 8, dtype=torch.uint8, device=self.device)
        self._flags = buf[data_bytes:].view(torch.int64)
        self._flags.zero_()
        torch.cuda.synchronize(self.device)
        handle = symm_mem.rendezvous(buf, self.group if self.group is not None else dist.group.WORLD)
        base = buf.data_ptr()
        self._buf, self._handle = buf, handle
        self._out = buf[:data_bytes].view(self.dtype)[: max(out_rows, 1) * self.width].view(max(out_rows, 1), self.width)
        self._out_ptrs = [int(p) for p in handle.buffer_ptrs]
        self._flag_ptrs = [p + data_bytes for p in self._out_ptrs]
        if self._out_ptrs[self.rank] != base:
            raise RuntimeError("symmetric memory returned a local pointer that differs from the buffer")
        self._error = torch.zeros(4, dtype=torch.int32).pin_memory()
        dist.barrier(group=self.group)  # every rank's flags are zero before anyone signals

    _PROBE_TIMEOUT_S = 5.0

    def _probe_p2p(self) -> Optional[str]:
        """One gather of known rows before first use, with a short timeout: peer writes that never land (a PCIe
        switch routing them elsewhere, an IOMMU) or a protocol that cannot complete on this machine show here, as a
        reason, instead of as a GatherTimeout in the first served batch. None when every row arrived."""
        rows = min(self.max_rows_per_rank, 2)
        cols = self.width if self.layout == ROWS else self.width // self.world
        local = torch.full((rows, cols), float(self.rank + 1), dtype=self.dtype, device=self.device)  # never 0
        counts = [rows] * self.world
        total = rows if self.layout == COLUMNS else rows * self.world
        self._out[:total].fill_(float("nan"))
        # Report mode: a probe that times out writes the error word and leaves this flag area inert (no trap).
        got = self._gather_p2p(local, None, counts, total, timeout_s=min(self.timeout_s, self._PROBE_TIMEOUT_S),
                               trap=False)
        torch.cuda.current_stream(self.device).synchronize()
        code, peer, step, n = (int(v) for v in self._error.tolist())
        if code:
            return f"rank {self.rank}: the probe gather timed out {_STEPS.get(step, f'at step {step}')} (rank {peer})"
        want = reference_gather([torch.full((rows, cols), float(r + 1), dtype=self.dtype) for r in range(self.world)],
                                self.layout, self.num_taps, self.hidden_size)
        if not torch.equal(got.cpu(), want):
            return f"rank {self.rank}: the probe gather completed but its rows differ from what the peers sent"
        return None

    def _fall_back_unless_probe_passes(self) -> None:
        why = self._probe_p2p()
        votes: list = [None] * self.world
        dist.all_gather_object(votes, why, group=self.group)
        failed = [v for v in votes if v]
        if not failed:
            _LIVE_P2P.add(self)
            return
        # NCCL gives the same results. The p2p buffers stay referenced: a late peer write must not land in freed
        # memory.
        self._abandoned = (self._buf, self._handle, self._flags, self._error)
        self.backend, self.signal = "nccl", None
        self.plan = gather_backend.GatherPlan("nccl", None, None, "p2p probe failed: " + "; ".join(failed))
        gather_backend.logger.warning("%s", self.plan.describe(self.world))

    # ------------------------------------------------------------------ use

    def output(self, total_rows: Optional[int] = None) -> torch.Tensor:
        """The gathered buffer: for p2p, a view of the registered output (peers write into it directly)."""
        if self.backend != "p2p":
            raise RuntimeError("output() is the registered buffer of the p2p backend; with nccl/gloo pass any out")
        rows = self._out.shape[0] if total_rows is None else total_rows
        return self._out[:rows]

    def _layout_rows(self, local: torch.Tensor, rows_per_rank: Optional[Sequence[int]]) -> tuple[list[int], int]:
        if self.layout == COLUMNS:
            rows = [local.shape[0]] * self.world
            if rows_per_rank is not None and _int_list(rows_per_rank) != rows:
                raise ValueError(f"layout 'columns' gathers the same rows from every rank: rows_per_rank must be "
                                 f"None or {rows}, got {list(rows_per_rank)}")
        elif rows_per_rank is None:
            rows = [local.shape[0]] * self.world
        else:
            rows = _int_list(rows_per_rank)
            if len(rows) != self.world:
                raise ValueError(f"rows_per_rank has {len(rows)} entries for {self.world} ranks")
            if rows[self.rank] != local.shape[0]:
                raise ValueError(f"rows_per_rank[{self.rank}] = {rows[self.rank]} but the local tensor has "
                                 f"{local.shape[0]} rows")
        if any(r < 0 or r > self.max_rows_per_rank for r in rows):
            raise ValueError(f"rows_per_rank {rows} outside 0..max_rows_per_rank={self.max_rows_per_rank}")
        total = rows[0] if self.layout == COLUMNS else sum(rows)
        return rows, total

    def _check_local(self, local: torch.Tensor) -> None:
        want_cols = self.width if self.layout == ROWS else self.width // self.world
        if not isinstance(local, torch.Tensor):
            raise ValueError(f"local must be a tensor [rows, {want_cols}], got {type(local).__name__}")
        if local.dim() != 2 or local.shape[1] != want_cols:
            raise ValueError(f"local must be [rows, {want_cols}] for layout {self.layout!r} (K={self.num_taps}, "
                             f"H={self.hidden_size}, world={self.world}), got {tuple(local.shape)}")
        if local.dtype != self.dtype or local.device.type != self.device.type:
            raise ValueError(f"local must be {self.dtype} on {self.device}, got {local.dtype} on {local.device}")

    def gather(self, local: torch.Tensor, out: Optional[torch.Tensor] = None,
               rows_per_rank: Optional[Sequence[int]] = None) -> torch.Tensor:
        """Every rank's rows (or column shards) into `out` ([total_rows, K*H]); returns out.

        rows_per_rank: every rank's row count (layout "rows"); None means all equal to this rank's. With p2p,
        `out` must be None or `output(...)`: peers write straight into the registered buffer.
        """
        if not self._broken:
            why = self.failure()  # an earlier gather gave up: raise now rather than hang on a broken protocol
            if why:
                self._agreement.give_up(why)  # the peers' next gather ends with this reason too
                raise GatherTimeout(why)
        if self._broken:
            raise GatherTimeout(f"this gatherer is unusable after an earlier failure: {self._broken}")
        self._agree(local, out, rows_per_rank)
        rows, total = self._layout_rows(local, rows_per_rank)
        if self.backend == "p2p":
            return self._gather_p2p(local, out, rows, total)
        if out is None:
            out = torch.empty(total, self.width, dtype=self.dtype, device=self.device)
        return self._gather_collective(local, out, rows)

    # ------------------------------------------------------------------ argument agreement

    def _argument_problem(self, local, out, rows_per_rank) -> Optional[str]:
        """What is wrong with this rank's own gather arguments (None: nothing), without raising."""
        try:
            self._check_local(local)
            _, total = self._layout_rows(local, rows_per_rank)
            self._check_out(out, total)
        except (ValueError, TypeError) as e:
            return str(e)
        return None

    def _check_out(self, out: Optional[torch.Tensor], total: int) -> None:
        if out is None:
            return
        if self.backend == "p2p":
            view = self._out[:total]
            if not isinstance(out, torch.Tensor) or out.data_ptr() != view.data_ptr() or out.shape != view.shape:
                raise ValueError("with the p2p backend, out must be gatherer.output(total_rows): peers write into "
                                 "the registered buffer directly")
            return
        if not isinstance(out, torch.Tensor) or out.shape != (total, self.width):
            got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            raise ValueError(f"out must be [{total}, {self.width}], got {got}")
        if out.dtype != self.dtype or out.device.type != self.device.type:
            raise ValueError(f"out must be {self.dtype} on {self.device}, got {out.dtype} on {out.device}")

    def _agree(self, local, out, rows_per_rank) -> None:
        """Every rank's arguments of this gather, compared on every rank: ValueError on a disagreement (the gatherer
        stays usable), GatherTimeout when a rank does not come within timeout_s (it does not)."""
        problem = self._argument_problem(local, out, rows_per_rank)
        rows = int(local.shape[0]) if isinstance(local, torch.Tensor) and local.dim() >= 1 else -1
        given = None
        if rows_per_rank is not None:
            try:
                given = _int_list(rows_per_rank)
            except (TypeError, ValueError):
                given = None  # the problem above says why
        header = gather_agreement.Header(rows, given, problem)
        try:
            headers = self._agreement.exchange(header)
        except gather_agreement.AgreementTimeout as e:
            self._broken = str(e)
            raise GatherTimeout(str(e)) from None
        bad = gather_agreement.disagreement(headers, self._agreement.calls, self.layout == ROWS)
        if bad:
            raise ValueError(f"PackedGatherer on rank {self.rank} of {self.world}: {bad}")

    def _segments(self) -> tuple[list[int], list[int], int]:
        if self.layout == ROWS:
            return [0], [0], self.width
        hs = self.hidden_size // self.world
        return ([k * hs for k in range(self.num_taps)],
                [k * self.hidden_size + self.rank * hs for k in range(self.num_taps)], hs)

    def _gather_p2p(self, local, out, rows, total, timeout_s: Optional[float] = None,
                    trap: bool = True) -> torch.Tensor:
        view = self._out[:total]
        if out is not None and (out.data_ptr() != view.data_ptr() or out.shape != view.shape):
            raise ValueError("with the p2p backend, out must be gatherer.output(total_rows): peers write into the "
                             "registered buffer directly")
        if self.layout == ROWS:
            offset = sum(rows[: self.rank])
        else:
            offset = 0
        from . import ops  # the p2p backend only: the collective ones need no extension

        src, dst, seg_len = self._segments()
        local = local if local.stride(-1) == 1 else local.contiguous()
        ops.gather_p2p_(self._out, local, self._out_ptrs, self._flag_ptrs, self._flags, self._error, self.rank, offset,
                        src, dst, seg_len, self.blocks, self.timeout_s if timeout_s is None else timeout_s,
                        gather_backend.SIGNAL_CODES[self.signal], trap)
        return view

    def _gather_collective(self, local, out, rows) -> torch.Tensor:
        m = max(rows) if rows else 0
        if m == 0:
            return out  # nobody has rows: nothing to exchange
        padded = local
        if local.shape[0] != m or self.backend == "gloo":  # gloo: a buffer only this call references (see below)
            padded = torch.zeros(m, local.shape[1], dtype=local.dtype, device=local.device)
            padded[: local.shape[0]] = local
        padded = padded.contiguous()
        staging = torch.empty(self.world * m, local.shape[1], dtype=local.dtype, device=local.device)
        if self.backend == "nccl":
            dist.all_gather_into_tensor(staging, padded, group=self.group)
        else:
            # Returns once gloo's worker has let go of the buffers, so the process may end right after this gather
            # (gather_agreement.gloo_collective says why it must).
            chunks = list(staging.chunk(self.world))
            gather_agreement.gloo_collective(lambda: dist.all_gather(chunks, padded, group=self.group),
                                             [padded, *chunks])
        parts = staging.view(self.world, m, local.shape[1])
        if self.layout == ROWS:
            start = 0
            for r, n in enumerate(rows):
                out[start:start + n].copy_(parts[r, :n])
                start += n
        else:
            hs = self.hidden_size // self.world
            out.view(m, self.num_taps, self.world, hs).copy_(
                parts.view(self.world, m, self.num_taps, hs).permute(1, 2, 0, 3))
        return out

    def failure(self) -> Optional[str]:
        """Why a p2p gather of this gatherer gave up (None if none did), from the host-mapped error word: no CUDA
        call, so it answers after the kernel's trap too. Once it has answered, the gatherer refuses further use."""
        error = getattr(self, "_error", None)
        if self.backend != "p2p" or error is None:
            return None
        code, peer, step, n = (int(v) for v in error.tolist())
        if not code:
            return None
        if not self._broken:
            what = (f"{_STEPS.get(step, f'step {step}')} (rank {peer})" if code != _ERR_BROKEN else
                    "launched after an earlier gather of this rank gave up")
            self._broken = (f"rank {self.rank} timed out after {self.timeout_s:g} s in gather #{n}, {what}; the "
                            "gather kernel trapped, so this process's CUDA context is lost: restart the server (a "
                            "peer that hangs for longer than the timeout ends every rank, as NCCL's watchdog does)")
        return self._broken

    def check(self) -> None:
        """Waits for this rank's gathers so far and raises GatherTimeout if one gave up (p2p). After the kernel's
        trap the wait itself fails with a CUDA error: the GatherTimeout then says why, chained to it."""
        if self.backend != "p2p":
            return
        try:
            torch.cuda.current_stream(self.device).synchronize()
        except RuntimeError as e:
            why = self.failure()
            if why:
                raise GatherTimeout(why) from e
            raise
        why = self.failure()
        if why:
            raise GatherTimeout(why)

    def close(self) -> None:
        _LIVE_P2P.discard(self)
        if self.backend == "p2p":
            torch.cuda.synchronize(self.device)
            self._handle = None
            self._buf = self._out = self._flags = None


def _int_list(values) -> list[int]:
    """rows_per_rank as Python ints; a float, a bool or anything else that is not an integer is a ValueError (int()
    would truncate 2.5 to 2 and gather the wrong rows)."""
    try:
        items = list(values)
    except TypeError:
        raise ValueError(f"rows_per_rank must be a sequence of integers, got {type(values).__name__}") from None
    out = []
    for v in items:
        if isinstance(v, bool):
            raise ValueError(f"rows_per_rank must hold integers, got {v!r} in {items}")
        try:
            out.append(operator.index(v))
        except TypeError:
            raise ValueError(f"rows_per_rank must hold integers, got {v!r} in {items}") from None
    return out


def reference_gather(locals_: Sequence[torch.Tensor], layout: str, num_taps: int, hidden_size: int) -> torch.Tensor:
    """What every rank's output must hold, given every rank's local tensor (the test oracle)."""
    world = len(locals_)
    if layout == ROWS:
        return torch.cat(list(locals_), dim=0)
    hs = hidden_size // world
    t = locals_[0].shape[0]
    out = torch.empty(t, num_taps * hidden_size, dtype=locals_[0].dtype)
    for r, loc in enumerate(locals_):
        for k in range(num_taps):
            out[:, k * hidden_size + r * hs: k * hidden_size + (r + 1) * hs] = loc[:, k * hs:(k + 1) * hs]
    return out
