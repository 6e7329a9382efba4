"""What a dump record says about its forward, read from SGLang's objects on the host (no device sync): the batch's
real rows and request boundaries, the taps in force, which rank writes, and which process (:func:`this_process`).

Rows: a forward's real rows come from the batch's host metadata (extend: ``extend_seq_lens_cpu``; decode: one per
request; verify: ``draft_token_num`` per request), so rows a CUDA graph or DP padding appends are never dumped.
"""
from __future__ import annotations

import os
import secrets
import socket
from dataclasses import dataclass
from typing import List, Optional, Tuple

from ...dump_format import is_doctor_rid
from ...spec import TapError, TapSpec
from ..taps.declaration import config_of, current_declaration, declared_taps


@dataclass(frozen=True)
class BatchRows:
    """A forward's rows as the batch describes them, read before the forward (a runner may change the batch)."""

    mode: str                                    # ForwardMode name
    rows: int                                    # real rows (tokens) of the forward
    requests: Tuple[Tuple[Optional[str], int, int, Optional[int]], ...]  # (rid, row_start, row_end, prefix_len)
    has_doctor: bool                             # a request of the doctor's (rid eagle3-doctor-...)
    dp_synced: bool                              # DP attention / MLP sync: the batch is one DP group's
    full: bool                                   # CaptureHiddenMode FULL: aux holds every row
    note: str = ""                               # why the rows could not be told apart (then requests is empty)


def _ints(v) -> Optional[List[int]]:
    if v is None:
        return None
    try:
        return [int(x) for x in (v.tolist() if hasattr(v, "tolist") else v)]
    except (TypeError, ValueError):
        return None


def batch_rows(fb) -> BatchRows:
    mode = getattr(fb, "forward_mode", None)
    name = getattr(mode, "name", str(mode))
    bs = int(getattr(fb, "batch_size", 0) or 0)
    rids = list(getattr(fb, "rids", None) or [None] * bs)
    ids = getattr(fb, "input_ids", None)
    n_ids = int(ids.shape[0]) if ids is not None and hasattr(ids, "shape") and ids.dim() == 1 else 0
    capture = getattr(fb, "capture_hidden_mode", None)
    full = bool(capture is not None and callable(getattr(capture, "is_full", None)) and capture.is_full())
    dp = getattr(fb, "global_num_tokens_cpu", None) is not None
    doctor = any(is_doctor_rid(r) for r in rids)
    note = ""
    lens: Optional[List[int]] = None
    prefix: Optional[List[int]] = None
    if mode is None or (hasattr(mode, "is_idle") and mode.is_idle()) or bs == 0:
        lens = []
    elif mode.is_target_verify():
        n = getattr(getattr(fb, "spec_info", None), "draft_token_num", None)
        n = int(n) if n else (n_ids // bs if n_ids % bs == 0 else None)
        lens = None if n is None else [n] * bs
    elif mode.is_decode():
        lens = [1] * bs
    elif mode.is_extend():
        lens = _ints(getattr(fb, "extend_seq_lens_cpu", None))
        prefix = _ints(getattr(fb, "extend_prefix_lens_cpu", None))
    if lens is None or len(lens) != bs or len(rids) != bs:
        note = f"the {name} batch's rows per request are not known ({bs} requests, {n_ids} input ids)"
        return BatchRows(name, n_ids, (), doctor, dp, full, note)
    if prefix is not None and len(prefix) != bs:
        prefix = None
    reqs, start = [], 0
    for i, n in enumerate(lens):
        reqs.append((None if rids[i] is None else str(rids[i]), start, start + n,
                     None if prefix is None else prefix[i]))
        start += n
    if start > n_ids:
        note = f"the {name} batch describes {start} rows but holds {n_ids} input ids"
        return BatchRows(name, n_ids, (), doctor, dp, full, note)
    return BatchRows(name, start, tuple(reqs), doctor, dp, full)


# ----------------------------------------------------------------------------------------------------------------
# the taps in force
# ----------------------------------------------------------------------------------------------------------------

def spec_fields(inner, spec: Optional[TapSpec]) -> dict:
    """The record's description of the taps: what the packer captures (layers_to_capture) and what the draft
    declares (through the plugin's spec, or, with the taps hook off, the draft config read beside SGLang)."""
    decl = current_declaration()
    try:
        declared, _ = declared_taps(inner, spec)
    except (TapError, ValueError):
        declared = None
    convention = None
    if decl is not None and decl.draft is not None and decl.draft.layer_ids is not None:
        convention = decl.draft.convention
    elif spec is not None:
        convention = "draft_ids"  # ids passed to set_eagle3_layers_to_capture, read as draft ids
    cfg = config_of(inner)
    return {
        "layers_to_capture": [int(i) for i in inner.layers_to_capture],
        "draft_ids": declared.to_draft_ids() if declared is not None else None,
        "declared": [repr(t) for t in declared.taps] if declared is not None else None,
        "declared_convention": convention if declared is not None else None,
        "describe": declared.describe() if declared is not None else None,
        "num_layers": int(cfg.num_hidden_layers),
        "hidden_size": int(cfg.hidden_size),
    }


def stream_layers(fields: dict, mode: str) -> List[int]:
    """Layer inputs of a doctor forward's stream: 0..L (``all``) or the declared taps' and the served slots'."""
    L = fields["num_layers"]
    if mode == "all":
        return list(range(L + 1))
    out = set(fields["layers_to_capture"])
    if fields["declared"] is not None:
        try:
            spec = TapSpec.from_draft_ids(fields["draft_ids"], L, fields["hidden_size"])
            out |= set(spec.to_layer_inputs(allow_final_boundary=True))
        except TapError:
            pass
    return sorted(i for i in out if 0 <= i <= L)


# ----------------------------------------------------------------------------------------------------------------
# who writes
# ----------------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Ranks:
    tp_rank: Optional[int]
    tp_size: Optional[int]
    attn_tp_rank: Optional[int]
    attn_tp_size: Optional[int]
    dp_rank: Optional[int]
    dp_attention: bool

    @property
    def writes(self) -> bool:
        """Attention-TP rank 0 writes: the residual stream (and so every aux slot and stream entry) is replicated
        across the attention-TP ranks of one batch."""
        return not self.attn_tp_rank

    def writer_line(self) -> str:
        group = f"DP group {self.dp_rank}" if self.dp_attention else "its TP group"
        why = (f"attn-TP rank {self.attn_tp_rank} of {self.attn_tp_size} in {group} (TP rank {self.tp_rank} of "
               f"{self.tp_size})")
        if not self.writes:
            return why + ": does not write (attn-TP rank 0 of the group does)"
        line = (why + ": writes, being attn-TP rank 0; the residual stream and the aux slots are replicated "
                "across attention-TP ranks")
        if self.dp_attention:
            line += "; under DP attention each DP group writes its own batch"
        return line

    def as_fields(self) -> dict:
        return {"tp_rank": self.tp_rank, "tp_size": self.tp_size, "attn_tp_rank": self.attn_tp_rank,
                "attn_tp_size": self.attn_tp_size, "dp_rank": self.dp_rank}


def ranks() -> Ranks:
    """This process's ranks from SGLang's published parallel context (a process without one: a single rank)."""
    try:
        from sglang.srt.runtime_context import get_parallel

        p = get_parallel()
        dp_attn = bool(getattr(p, "attn_dp_enabled", False))
        dp_rank = getattr(p, "attn_dp_rank", 0) if dp_attn else getattr(p, "dp_rank", None)
        return Ranks(int(p.tp_rank), int(p.tp_size), int(p.attn_tp_rank), int(p.attn_tp_size),
                     None if dp_rank is None else int(dp_rank), dp_attn)
    except Exception:  # no published context (a bare model in a test process): one rank
        return Ranks(0, 1, 0, 1, None, False)


# ----------------------------------------------------------------------------------------------------------------
# which process
# ----------------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Process:
    """The writing process: a random id drawn once per process (replicas in separate PID namespaces share pids, and
    may share host names), its host name and pid. In every record and in every file name."""

    server: str
    host: str
    pid: int

    def as_fields(self) -> dict:
        return {"server": self.server, "host": self.host, "pid": self.pid}


_process: Optional[Process] = None


def new_server_id() -> str:
    return secrets.token_hex(8)


def this_process() -> Process:
    """This process's identity, drawn at its first record (a forked child draws its own)."""
    global _process
    if _process is None or _process.pid != os.getpid():
        _process = Process(new_server_id(), socket.gethostname() or "localhost", os.getpid())
    return _process


def forget_process() -> None:
    """Draw a new identity at the next record (tests: one process standing in for a second server)."""
    global _process
    _process = None


__all__ = ["BatchRows", "batch_rows", "spec_fields", "stream_layers", "Ranks", "ranks", "Process", "this_process",
           "forget_process", "new_server_id"]
