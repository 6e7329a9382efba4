"""The capture dump: what the target handed its draft in served forwards, written for ``doctor fingerprint`` and the
doctor's server-side replay (record format: eagle3_capture/dump_format/contract.py, version 3).

Switched on by ``EAGLE3_CAPTURE_DUMP=<dir>`` (settings/switches.py: settings validated when SGLang loads the plugin).
It runs around the model runner's forward (served.py), after the forward returned, so it sees every served forward --
prefill, decode, verify, replayed from a CUDA graph or run eagerly -- and never SGLang's warm-up or capture passes
(its capture-mode flag set, or a stream capturing), whose dummy batches would otherwise fill the quota. A record
holds the forward's real rows only (padded graph rows are not in the batch's host metadata, dump/record.py), and the
aux buffer exactly as the runner returned it to the draft.

Bounds, per process (each setting's default in settings/switches.py): served forwards (``EAGLE3_CAPTURE_DUMP_MAX``),
served requests followed (``_REQUESTS``: the first requests seen are followed through prefill and every verify, and only
their rows are written), served rows (``_TOKENS``), bytes of every record (``_BYTES``), and rows of the doctor's own
forwards (``_STREAM_TOKENS``), which have their own budget so that served traffic never starves them.

The doctor's forwards (a request id starting ``eagle3-doctor-``) are dumped whole, with the residual stream at the
layer inputs ``EAGLE3_CAPTURE_DUMP_STREAM`` names (taps/stream.py), and are kept out of CUDA graphs (the graph runners'
``can_run_graph`` says no for them, served.py) so that the stream can be read. Under DP attention neither is done:
the graph decision there is the DP group's and the doctor's request lives in one group, so forcing one group eager
or widening its capture would desynchronise the collectives; such forwards get their aux dumped, no stream (one
WARNING line).

Only attention-TP rank 0 of each group writes (the residual stream is replicated across attention-TP ranks); every
rank still makes the same stream decisions, since a wider capture may gather rows across ranks.

Every record carries its writing process (a random id, the host, the pid: dump_record.this_process) and so does its
file name, written create-exclusive (dump/writer.py): servers sharing one directory never replace each other's
records, and the doctor tells them apart.
"""
from __future__ import annotations

import os
import threading
from typing import Dict, List, Optional

import torch

from ...dump_format import FORMAT, file_name, is_doctor_rid
from ..settings import switches
from ..settings.switches import DumpSettings, announce
from ..taps.stream import StreamRequest, columns
from .record import BatchRows, Ranks, forget_process, new_server_id, ranks, spec_fields, stream_layers, this_process
from .writer import Job, Writer, to_host


class _State:
    """One process's dump: its settings, budgets spent and writer."""

    def __init__(self, settings: DumpSettings):
        self.settings = settings
        self.lock = threading.Lock()
        self.writer: Optional[Writer] = None
        self.ranks: Optional[Ranks] = None
        self.seq = 0
        self.records = 0
        self.tokens = 0
        self.bytes = 0
        self.followed: Dict[Optional[str], None] = {}
        self.stream_tokens = 0
        self.stream_bytes = 0
        self.logged: set = set()
        self.served_done = False
        self.fields_cache: dict = {}
        self.failed: Optional[str] = None  # the dump stopped writing (every rank still decides streams alike)
        self.health_prefix = _health_check_prefix()


_state: Optional[_State] = None


def _get() -> Optional[_State]:
    global _state
    s = switches.current().dump
    if s is None:
        return None
    if _state is None or _state.settings != s:
        _state = _State(s)
    return _state


def reset() -> None:
    """Forget the budgets spent, the sequence number and the process's identity (tests: what follows is written as
    by another server; the writer's queue is flushed first)."""
    global _state
    if _state is not None and _state.writer is not None:
        _state.writer.flush(30.0)
    _state = None
    forget_process()


def flush(timeout: Optional[float] = None) -> bool:
    """Wait until every record staged so far is on disk (or dropped)."""
    st = _state
    return True if st is None or st.writer is None else st.writer.flush(timeout)


def written() -> int:
    """How many records this process's dump has put on disk so far (0 with the dump off or nothing written)."""
    st = _state
    return 0 if st is None or st.writer is None else st.writer.written


def wants(forward_batch) -> bool:
    """Whether the served-forward hook has dump work in this forward (settings on, some budget left): once the served
    budget is spent only a forward holding a doctor request (read from the batch's request ids) has any (any other
    would get no stream request and no record anyway; skipping it saves reading the batch's rows)."""
    st = _get()
    if st is None:
        return False
    if not st.served_done:
        return True
    if st.stream_tokens >= st.settings.stream_tokens:
        return False
    rids = getattr(forward_batch, "rids", None)
    return bool(rids) and any(is_doctor_rid(r) for r in rids)


def fail(why: str) -> None:
    """Stop writing after an unexpected error (one ERROR line); serving goes on. Stream decisions go on as before,
    so every rank keeps widening the same forwards."""
    st = _state
    if st is None or st.failed is not None:
        return
    st.failed = why
    announce("error", f"eagle3_capture: the capture dump stopped: {why}; serving goes on, nothing more is dumped "
                      "by this process")


def _once(st: _State, key: str, level: str, msg: str) -> None:
    if key not in st.logged:
        st.logged.add(key)
        announce(level, msg)


def forces_eager(forward_batch) -> bool:
    """Whether a target forward must not be replayed from a CUDA graph: it holds one of the doctor's requests and
    the dump will read its stream (not under DP attention, where the graph decision is the DP group's)."""
    s = switches.dump_settings()
    if s is None or s.stream_tokens == 0 or getattr(forward_batch, "global_num_tokens_cpu", None) is not None:
        return False
    rids = getattr(forward_batch, "rids", None)
    return bool(rids) and any(is_doctor_rid(r) for r in rids)


# ----------------------------------------------------------------------------------------------------------------
# before the forward: the doctor's stream (every rank decides alike)
# ----------------------------------------------------------------------------------------------------------------

def want_stream(inner, spec, rows: BatchRows) -> Optional[StreamRequest]:
    """The stream request for a forward holding a doctor request, or None. Depends only on the batch and on
    budgets every rank spends alike, never on which rank writes or whether its disk failed."""
    st = _get()
    if st is None or not rows.has_doctor:
        return None
    s = st.settings
    if rows.dp_synced or _ranks(st).dp_attention:
        _once(st, "dp", "warning", "eagle3_capture: a forward holds a doctor request under DP attention: its aux is "
                                   "dumped, its residual stream is not (forcing one DP group out of CUDA graphs or "
                                   "widening its capture would desynchronise the groups' collectives)")
        return None
    if rows.note or rows.rows == 0:
        return None
    fields = _fields(st, inner, spec)
    layers = stream_layers(fields, s.stream)
    width = len(set(layers) | set(fields["layers_to_capture"])) + len(fields["layers_to_capture"])
    nbytes = rows.rows * (width * fields["hidden_size"] * inner.embed_tokens.weight.element_size() + 16)
    with st.lock:
        if st.stream_tokens + rows.rows > s.stream_tokens or st.stream_bytes + nbytes > s.max_bytes:
            announce("warning", f"eagle3_capture: a doctor forward ({rows.rows} rows) gets no residual stream: "
                                f"{switches.ENV_DUMP_STREAM_TOKENS}={s.stream_tokens} rows of stream "
                                f"({st.stream_tokens} used) or {switches.ENV_DUMP_BYTES}={s.max_bytes} would be "
                                "exceeded")
            return None
        st.stream_tokens += rows.rows
        st.stream_bytes += nbytes
    return StreamRequest(layers, fields["num_layers"])


def _ranks(st: _State) -> Ranks:
    if st.ranks is None:
        st.ranks = ranks()
    return st.ranks


def _fields(st: _State, inner, spec) -> dict:
    """The record's tap fields; cached per model and capture list (the declaration is read once at model load)."""
    key = (id(inner), tuple(inner.layers_to_capture), id(spec))
    f = st.fields_cache.get(key)
    if f is None:
        f = st.fields_cache[key] = spec_fields(inner, spec)
    return {k: list(v) if isinstance(v, list) else v for k, v in f.items()}


# ----------------------------------------------------------------------------------------------------------------
# after the forward: the record (the writing rank only)
# ----------------------------------------------------------------------------------------------------------------

def record(model, inner, spec, forward_batch, rows: BatchRows, aux, graph: bool,
           req: Optional[StreamRequest]) -> Optional[str]:
    """Stage the record of one served forward (None: nothing dumped; else the path it will have)."""
    st = _get()
    if st is None:
        return None
    r = _ranks(st)
    if not r.writes:
        return None
    s = st.settings
    if st.writer is None:
        st.writer = Writer(s.directory)
        announce("info", f"eagle3_capture: dumping served forwards to {s.directory} ({r.writer_line()}); bounds "
                         f"per process: {s.max_records} forwards, {s.max_requests} requests, {s.max_tokens} tokens "
                         f"served; {s.stream_tokens} tokens of the doctor's requests, stream at the {s.stream} "
                         f"layer inputs; {s.max_bytes} bytes in all")
    if st.writer.stopped is not None or st.failed is not None:
        return None
    if rows.note:
        _once(st, "rows", "warning", f"eagle3_capture: a forward is not dumped: {rows.note}")
        return None
    if not isinstance(aux, torch.Tensor) or aux.dim() != 2 or aux.shape[0] < rows.rows or rows.rows == 0:
        if isinstance(aux, torch.Tensor) and rows.rows and rows.full:
            _once(st, "aux", "warning", f"eagle3_capture: a {rows.mode} forward is not dumped: its aux hidden "
                                        f"states are {tuple(aux.shape)} for {rows.rows} rows (rows scattered across "
                                        "ranks?)")
        return None
    if not rows.full:
        return None  # the runner kept only the last rows' slots (CaptureHiddenMode LAST)
    fields = _fields(st, inner, spec)
    H = fields["hidden_size"]
    if aux.shape[1] != len(fields["layers_to_capture"]) * H:
        _once(st, "width", "warning", f"eagle3_capture: a forward is not dumped: aux is {aux.shape[1]} wide for "
                                      f"layers_to_capture {fields['layers_to_capture']} x H={H}")
        return None
    streamed = req is not None and req.packed is not None and req.packed.shape[0] >= rows.rows
    if req is not None and not streamed and req.error:
        _once(st, "stream-" + req.error, "warning", f"eagle3_capture: no residual stream dumped: {req.error}")
    keep = list(rows.requests) if rows.has_doctor else _followed(st, rows)
    if not keep:
        return None
    n = sum(e - s0 for _, s0, e, _ in keep)
    src = req.packed if streamed else aux
    nbytes = n * (src.shape[1] * src.element_size() + 16)
    with st.lock:
        if not rows.has_doctor and (st.served_done or not _admit_served(st, n)):
            return None
        if st.bytes + nbytes > s.max_bytes:
            _once(st, "bytes", "info", f"eagle3_capture: the capture dump reached {switches.ENV_DUMP_BYTES}="
                                       f"{s.max_bytes} bytes; no more served forwards are dumped by this process")
            if not rows.has_doctor:
                st.served_done = True
            return None
        st.bytes += nbytes
        seq = st.seq
        st.seq += 1
    spans = [(s0, e) for _, s0, e, _ in keep]
    tensors = {"input_ids": _rows(forward_batch.input_ids, spans).to(torch.int64),
               "positions": _rows(forward_batch.positions, spans).to(torch.int64),
               "packed" if streamed else "aux": _rows(src, spans)}
    host, event, nbytes = to_host(tensors)
    requests, start = [], 0
    for rid, s0, e, p in keep:
        requests.append({"rid": rid, "row_start": start, "row_end": start + (e - s0), "prefix_len": p})
        start += e - s0
    proc = this_process()
    meta = {"format": FORMAT, "seq": seq, "forward_mode": rows.mode, "graph": bool(graph), "requests": requests,
            **fields, "stream": None, "stream_layer_inputs": None, "model_class": type(model).__name__,
            "dtype": str(aux.dtype), **r.as_fields(), "writer": r.writer_line(), **proc.as_fields()}
    assemble = None
    if streamed:
        meta["stream_layer_inputs"] = list(req.layers)
        assemble = _assembler(columns(req, req.served), columns(req, req.layers), H)
    tp = r.tp_rank or 0

    def name(server: str) -> str:
        return os.path.join(s.directory, file_name(proc.host, server, tp, seq))

    # a name found taken (a stale file, or a writer with this id) gets a fresh random id; the record keeps its server
    st.writer.submit(Job(name(proc.server), meta, host, nbytes, event, assemble,
                         rename=lambda: name(new_server_id())))
    return name(proc.server)


def _health_check_prefix() -> str:
    try:
        from sglang.srt.constants import HEALTH_CHECK_RID_PREFIX

        return HEALTH_CHECK_RID_PREFIX
    except ImportError:
        return "HEALTH_CHECK"


def _followed(st: _State, rows: BatchRows) -> List[tuple]:
    """The batch's requests whose rows are dumped: those already followed, then new ones while there is room.
    SGLang's own health-check requests (``/health`` runs a one-token generate) are never followed: a monitor
    polling the server would otherwise use up the requests' budget."""
    keep = []
    hc = st.health_prefix
    for req in rows.requests:
        rid = req[0]
        if rid is not None and rid.startswith(hc):
            continue
        if rid in st.followed and rid is not None:
            keep.append(req)
        elif len(st.followed) < st.settings.max_requests:
            st.followed[rid if rid is not None else object()] = None
            keep.append(req)
    if not keep and len(st.followed) >= st.settings.max_requests:
        _once(st, "requests", "info", f"eagle3_capture: the capture dump follows its {st.settings.max_requests} "
                                      f"requests ({switches.ENV_DUMP_REQUESTS}); other requests are not dumped")
    return keep


def _admit_served(st: _State, n: int) -> bool:
    s = st.settings
    if st.records >= s.max_records or st.tokens + n > s.max_tokens:
        which = (f"{switches.ENV_DUMP_MAX}={s.max_records} forwards" if st.records >= s.max_records
                 else f"{switches.ENV_DUMP_TOKENS}={s.max_tokens} tokens")
        _once(st, "served", "info", f"eagle3_capture: the capture dump reached {which}; no more served forwards "
                                    "are dumped by this process (the doctor's requests still are)")
        st.served_done = True
        return False
    st.records += 1
    st.tokens += n
    return True


def _rows(t: torch.Tensor, spans) -> torch.Tensor:
    if len(spans) == 1:
        return t[spans[0][0]:spans[0][1]]
    return torch.cat([t[a:b] for a, b in spans])


def _assembler(served_cols: List[int], stream_cols: List[int], H: int):
    """Cut the served aux and the stream out of a widened capture, on the writer's thread."""

    def assemble(fields: dict, tensors: Dict[str, torch.Tensor]) -> dict:
        packed = tensors["packed"]
        aux = torch.cat([packed[:, p * H:(p + 1) * H] for p in served_cols], dim=1)
        stream = torch.stack([packed[:, p * H:(p + 1) * H] for p in stream_cols])
        return {**fields, "input_ids": tensors["input_ids"], "positions": tensors["positions"], "aux": aux,
                "stream": stream}

    return assemble


__all__ = ["wants", "forces_eager", "want_stream", "record", "reset", "flush", "written", "fail"]
