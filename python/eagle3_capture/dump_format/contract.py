"""The server dump's contract: what the SGLang plugin writes (``EAGLE3_CAPTURE_DUMP=<dir>``) and everything that
reads it (the doctor, the tests, the GPU report) checks, through :func:`record_problems` alone.

Engine-free (torch only, no SGLang): the plugin's writer (sglang/dump*.py) and the reader (:mod:`.reader`) share
these names.

Files: ``<dir>/eagle3_capture_<host>_<server>_tp<tp_rank>_<seq:06d>.pt`` (``torch.save`` of a dict). ``<server>`` is
the writing process's random id (:data:`SERVER_RE`), also in the record, and ``<host>`` its host name (made safe for
a file name): replicas that share a directory, even in PID namespaces where both are pid 6, never share a name. The
bytes go to ``<name>.tmp``, created exclusively, and reach ``<name>`` by a hard link, which fails rather than replace
a file of that name; the writer then takes another name, with a fresh random id in place of ``<server>`` (the
record's ``server`` key still names its process: the key, not the name, is what readers group by). A reader never
sees a partial file (readers ignore ``*.tmp``). Version-2 files (``eagle3_capture_pid<pid>_tp<tp_rank>_<seq:06d>.pt``:
named by the process id alone, which two replicas in separate PID namespaces share) and version-1 files
(``eagle3_capture_pid<pid>_<n:04d>.pt``, no ``format`` key) are what the plugin wrote before; both are still read
(version 2 by :func:`record_problems`, version 1 by :func:`v1_record_problems`).

A record holds one forward of the target as served (or the rows of it that belong to the requests the dump
follows): its token ids, positions, request boundaries, the packed slots the target handed to the draft (``aux``),
the taps in force, who wrote it (its ranks, and from version 3 its process: ``server``, ``host``, ``pid``), and, for
forwards that contain one of the doctor's own requests (``rid`` starting
with :data:`DOCTOR_RID_PREFIX`), the residual stream at more layer inputs (``stream``). The table of keys is
:data:`FIELDS`; docs/dump_format.md says what each holds.
"""
from __future__ import annotations

import re
from typing import Any, List, Optional

import torch

FORMAT = "eagle3-capture-dump/3"
FORMAT_V2 = "eagle3-capture-dump/2"
FORMATS = {FORMAT: 3, FORMAT_V2: 2}   # the formats with a key, and their version
DOCTOR_RID_PREFIX = "eagle3-doctor-"
TMP_SUFFIX = ".tmp"
SERVER_RE = re.compile(r"^[0-9a-f]{16}$")   # a writing process's id: 64 random bits, lower-case hex
FILE_RE = re.compile(r"^eagle3_capture_([A-Za-z0-9.-]{1,63})_([0-9a-f]{16})_tp(\d+)_(\d{6,})\.pt$")
V2_FILE_RE = re.compile(r"^eagle3_capture_pid(\d+)_tp(\d+)_(\d{6,})\.pt$")
V1_FILE_RE = re.compile(r"^eagle3_capture_pid(\d+)_(\d{4,})\.pt$")

# EAGLE3_CAPTURE_DUMP_STREAM values: which layer inputs a doctor forward's stream holds
STREAM_DECLARED = "declared"   # the declared taps, plus the served slots' layer inputs where they differ
STREAM_ALL = "all"             # 0..L: the embedding, every layer output, the final boundary before the final norm
STREAM_MODES = (STREAM_DECLARED, STREAM_ALL)

CONVENTIONS = ("draft_ids", "layer_inputs", "hf_hidden_states")

# every key of a version-2 record, in the order of the contract's table
FIELDS = (
    "format", "seq", "forward_mode", "graph", "input_ids", "positions", "requests", "aux", "layers_to_capture",
    "draft_ids", "declared", "declared_convention", "describe", "stream", "stream_layer_inputs", "num_layers",
    "hidden_size", "model_class", "dtype", "tp_rank", "tp_size", "attn_tp_rank", "attn_tp_size", "dp_rank",
    "writer", "server", "host", "pid",
)
SERVER_FIELDS = ("server", "host", "pid")  # new in version 3: the writing process
FIELDS_V2 = tuple(k for k in FIELDS if k not in SERVER_FIELDS)
REQUEST_FIELDS = ("rid", "row_start", "row_end", "prefix_len")
RANK_FIELDS = ("tp_rank", "tp_size", "attn_tp_rank", "attn_tp_size", "dp_rank")

_TAP_RE = re.compile(r"^(Embedding|LayerOutput\((0|[1-9]\d*)\))$")
_FLOAT = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


class DumpError(ValueError):
    """A dump the reader cannot use: a file that does not load, a record off the contract, a request whose rows do
    not fit together. The message names the file (or the request) and what was expected."""


class DumpRecordError(DumpError):
    """A record that does not follow the contract; the message names every offending key."""


def host_in_name(host: str) -> str:
    """A host name as it goes into a file name: letters, digits, '.' and '-' (anything else becomes '-'), at most 63
    characters ('host' when nothing is left)."""
    out = re.sub(r"[^A-Za-z0-9.-]", "-", str(host))[:63].strip(".")
    return out or "host"


def file_name(host: str, server: str, tp_rank: int, seq: int) -> str:
    """The name of a record: its writer's host and id, its TP rank and its number in that process."""
    if not SERVER_RE.match(server):
        raise ValueError(f"server id {server!r}: expected 16 lower-case hex digits")
    return f"eagle3_capture_{host_in_name(host)}_{server}_tp{int(tp_rank)}_{int(seq):06d}.pt"


def is_doctor_rid(rid: Any) -> bool:
    """Whether a request id marks one of the doctor's own requests (its forwards get the stream dumped)."""
    return isinstance(rid, str) and rid.startswith(DOCTOR_RID_PREFIX)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _shown(v: Any) -> str:
    if isinstance(v, torch.Tensor):
        return f"a {v.dtype} tensor of shape {tuple(v.shape)}"
    r = repr(v)
    return r if len(r) <= 60 else r[:57] + "..."


def _int_list(v: Any) -> bool:
    return isinstance(v, list) and all(_is_int(x) for x in v)


def record_problems(rec: Any) -> List[str]:
    """Every way `rec` departs from the contract of its version, 3 (:data:`FORMAT`) or 2 (:data:`FORMAT_V2`, no
    ``server``, ``host``, ``pid``); empty: it follows it. Pure: reads, never converts."""
    if not isinstance(rec, dict):
        return [f"a record is a dict, got {type(rec).__name__}"]
    out: List[str] = []
    g = rec.get
    version = FORMATS.get(g("format")) if isinstance(g("format"), str) else None
    missing = [k for k in (FIELDS_V2 if version == 2 else FIELDS) if k not in rec]
    if missing:
        out.append(f"missing keys {missing}")
    if "format" in rec and version is None:
        out.append(f"format is {_shown(g('format'))}, expected {FORMAT!r} (or {FORMAT_V2!r})")
    if version != 2:
        out += _server_problems(rec)
    if "seq" in rec and not (_is_int(g("seq")) and g("seq") >= 0):
        out.append(f"seq must be an integer >= 0, got {_shown(g('seq'))}")
    if "forward_mode" in rec and not (isinstance(g("forward_mode"), str) and g("forward_mode")):
        out.append(f"forward_mode must be a non-empty string, got {_shown(g('forward_mode'))}")
    if "graph" in rec and not isinstance(g("graph"), bool):
        out.append(f"graph must be a bool, got {_shown(g('graph'))}")
    L, H = g("num_layers"), g("hidden_size")
    for key, v in (("num_layers", L), ("hidden_size", H)):
        if key in rec and not (_is_int(v) and v >= 1):
            out.append(f"{key} must be an integer >= 1, got {_shown(v)}")
    L = L if _is_int(L) and L >= 1 else None
    H = H if _is_int(H) and H >= 1 else None

    T = None
    for key in ("input_ids", "positions"):
        v = g(key)
        if key not in rec:
            continue
        if not (isinstance(v, torch.Tensor) and v.dtype == torch.int64 and v.dim() == 1):
            out.append(f"{key} must be a 1-D int64 tensor [T], got {_shown(v)}")
            continue
        if T is None:
            T = v.shape[0]
        elif v.shape[0] != T:
            out.append(f"positions has {v.shape[0]} rows, input_ids {T}")
        if key == "positions" and v.numel() and int(v.min()) < 0:
            out.append("positions holds negative values")

    out += _request_problems(g("requests"), T) if "requests" in rec else []

    ltc = g("layers_to_capture")
    if "layers_to_capture" in rec:
        if not (_int_list(ltc) and ltc):
            out.append(f"layers_to_capture must be a non-empty list of integers, got {_shown(ltc)}")
            ltc = None
        elif L is not None and any(i < 0 or i > L for i in ltc):
            out.append(f"layers_to_capture {ltc} has layer inputs outside 0..{L} (num_layers={L})")
    else:
        ltc = None

    aux = g("aux")
    if aux is not None:
        if not (isinstance(aux, torch.Tensor) and aux.dim() == 2 and aux.dtype in _FLOAT):
            out.append(f"aux must be a floating [T, K*H] tensor or None, got {_shown(aux)}")
            aux = None
        else:
            if T is not None and aux.shape[0] != T:
                out.append(f"aux has {aux.shape[0]} rows, input_ids {T}")
            if ltc is not None and H is not None and aux.shape[1] != len(ltc) * H:
                out.append(f"aux is {aux.shape[1]} wide, layers_to_capture x hidden_size = {len(ltc)} x {H}")
            if isinstance(g("dtype"), str) and g("dtype") != str(aux.dtype):
                out.append(f"dtype says {g('dtype')!r}, aux is {aux.dtype}")

    if g("draft_ids") is not None and not _int_list(g("draft_ids")):
        out.append(f"draft_ids must be a list of integers or None, got {_shown(g('draft_ids'))}")
    dec = g("declared")
    if dec is not None and not (isinstance(dec, list) and all(isinstance(x, str) and _TAP_RE.match(x) for x in dec)):
        out.append(f"declared must be a list of 'Embedding' / 'LayerOutput(k)' or None, got {_shown(dec)}")
    else:
        out += declaration_problems(dec, ltc, g("draft_ids") if _int_list(g("draft_ids")) else None, L)
    conv = g("declared_convention")
    if conv is not None and conv not in CONVENTIONS:
        out.append(f"declared_convention must be one of {list(CONVENTIONS)} or None, got {_shown(conv)}")
    for key in ("describe", "model_class", "dtype", "writer"):
        v = g(key)
        if key in rec and not (isinstance(v, str) or (v is None and key == "describe")):
            out.append(f"{key} must be a string, got {_shown(v)}")

    out += _stream_problems(g("stream"), g("stream_layer_inputs"), T, H, L, aux)
    out += _rank_problems(rec)
    return out


def _tap_index(tap: str) -> int:
    """'Embedding' -> -1, 'LayerOutput(k)' -> k (the EAGLE draft-id meaning)."""
    return -1 if tap == "Embedding" else int(tap[len("LayerOutput("):-1])


def declaration_problems(declared: Optional[list], layers_to_capture: Optional[list], draft_ids: Optional[list],
                         L: Optional[int]) -> List[str]:
    """How the declared taps contradict the rest of a record: each served slot is one declared tap (as many taps as
    layers_to_capture and draft_ids), the taps are distinct, in order, and within the model (LayerOutput(k) with k
    < num_layers). Their *values* may differ from layers_to_capture: a server that captures other layers than its
    draft declares is what the doctor exists to find, and the record must carry it."""
    if declared is None:
        return []
    out = []
    idx = [_tap_index(t) for t in declared]
    if not declared:
        out.append("declared is an empty list; a draft declares at least one tap (None where unknown)")
    if idx != sorted(set(idx)):
        out.append(f"declared taps {declared} are not distinct and in order (Embedding, then LayerOutput(k) by k)")
    if L is not None and idx and idx[-1] >= L:
        out.append(f"declared {declared[-1]} is beyond the model's {L} layers (LayerOutput(0..{L - 1}))")
    if layers_to_capture is not None and len(layers_to_capture) != len(declared):
        out.append(f"declared names {len(declared)} taps {declared}, layers_to_capture {len(layers_to_capture)} "
                   f"slots {list(layers_to_capture)}: each served slot is one declared tap")
    if draft_ids is not None and len(draft_ids) != len(declared):
        out.append(f"declared names {len(declared)} taps, draft_ids {len(draft_ids)} ids {list(draft_ids)}")
    elif draft_ids is not None and list(draft_ids) != idx:
        out.append(f"draft_ids {list(draft_ids)} are not the declared taps {declared} (draft id -1 is Embedding, k "
                   "is LayerOutput(k))")
    return out


def _server_problems(rec: dict) -> List[str]:
    out = []
    if "server" in rec and not (isinstance(rec["server"], str) and SERVER_RE.match(rec["server"])):
        out.append(f"server must be the writing process's id, 16 lower-case hex digits, got {_shown(rec['server'])}")
    if "host" in rec and not (isinstance(rec["host"], str) and rec["host"]):
        out.append(f"host must be a non-empty string, got {_shown(rec['host'])}")
    if "pid" in rec and not (_is_int(rec["pid"]) and rec["pid"] >= 1):
        out.append(f"pid must be an integer >= 1, got {_shown(rec['pid'])}")
    return out


def _request_problems(reqs: Any, T: Optional[int]) -> List[str]:
    if not isinstance(reqs, list):
        return [f"requests must be a list of dicts, got {_shown(reqs)}"]
    out = []
    end = 0
    for i, r in enumerate(reqs):
        if not isinstance(r, dict) or sorted(r) != sorted(REQUEST_FIELDS):
            out.append(f"requests[{i}] must be a dict with keys {list(REQUEST_FIELDS)}, got {_shown(r)}")
            return out
        if r["rid"] is not None and not isinstance(r["rid"], str):
            out.append(f"requests[{i}].rid must be a string or None, got {_shown(r['rid'])}")
        s, e = r["row_start"], r["row_end"]
        if not (_is_int(s) and _is_int(e)) or s != end or e < s:
            out.append(f"requests[{i}] rows [{s}, {e}) do not follow the previous request's rows (which end at "
                       f"{end}): requests cover the rows in order")
            return out
        end = e
        p = r["prefix_len"]
        if p is not None and not (_is_int(p) and p >= 0):
            out.append(f"requests[{i}].prefix_len must be an integer >= 0 or None, got {_shown(p)}")
    if T is not None and end != T:
        out.append(f"requests cover rows [0, {end}) of the {T} rows")
    return out


def _stream_problems(stream: Any, inputs: Any, T, H, L, aux) -> List[str]:
    if stream is None and inputs is None:
        return []
    if stream is None or inputs is None:
        return ["stream and stream_layer_inputs come together (one is None, the other is not)"]
    out = []
    if not (isinstance(stream, torch.Tensor) and stream.dim() == 3 and stream.dtype in _FLOAT):
        return [f"stream must be a floating [S, T, H] tensor, got {_shown(stream)}"]
    if not (_int_list(inputs) and inputs == sorted(set(inputs)) and inputs):
        return [f"stream_layer_inputs must be a non-empty sorted list of distinct integers, got {_shown(inputs)}"]
    if stream.shape[0] != len(inputs):
        out.append(f"stream has {stream.shape[0]} entries, stream_layer_inputs {len(inputs)}")
    if T is not None and stream.shape[1] != T:
        out.append(f"stream has {stream.shape[1]} rows, input_ids {T}")
    if H is not None and stream.shape[2] != H:
        out.append(f"stream is {stream.shape[2]} wide, hidden_size is {H}")
    if L is not None and (inputs[0] < 0 or inputs[-1] > L):
        out.append(f"stream_layer_inputs {inputs} outside 0..{L}")
    if isinstance(aux, torch.Tensor) and aux.dtype != stream.dtype:
        out.append(f"stream is {stream.dtype}, aux {aux.dtype}: both are the served dtype")
    return out


def _rank_problems(rec: dict) -> List[str]:
    out = []
    for key in RANK_FIELDS:
        v = rec.get(key)
        if v is not None and not (_is_int(v) and v >= (1 if key.endswith("size") else 0)):
            out.append(f"{key} must be {'an integer >= 1' if key.endswith('size') else 'an integer >= 0'} or None, "
                       f"got {_shown(v)}")
    for rank, size in (("tp_rank", "tp_size"), ("attn_tp_rank", "attn_tp_size")):
        r, s = rec.get(rank), rec.get(size)
        if _is_int(r) and _is_int(s) and not 0 <= r < s:
            out.append(f"{rank}={r} is not below {size}={s}")
    return out


_INT = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


def int_values(v: Any) -> Optional[List[int]]:
    """A version-1 integer list (a list, a tuple or an integer tensor), None when it is not one."""
    if isinstance(v, torch.Tensor):
        return v.reshape(-1).tolist() if v.dtype in _INT else None
    return list(v) if isinstance(v, (list, tuple)) and all(_is_int(x) for x in v) else None


def _v1_count(v: Any) -> Optional[int]:
    """A version-1 count (an int, or a one-element integer tensor), None when it is not one."""
    if isinstance(v, torch.Tensor) and v.numel() == 1 and v.dtype in _INT:
        return int(v)
    return v if _is_int(v) else None


def v1_record_problems(rec: Any) -> List[str]:
    """Every way `rec` departs from a version-1 record (the plugin's older dump, no ``format`` key): ``input_ids`` and
    ``positions`` [T] (integer tensors or lists), and optionally ``aux`` [T, K*H] (floating), ``layers_to_capture``,
    ``draft_ids`` (integer lists), ``num_layers``, ``hidden_size`` (integers >= 1), ``forward_mode``,
    ``model_class``, ``dtype``, ``declared_convention`` (strings), ``declared`` (a list of strings). Looser on types
    than version 2, as that writer was. Pure: reads, never converts."""
    if not isinstance(rec, dict):
        return [f"a record is a dict, got {type(rec).__name__}"]
    out: List[str] = []
    T = None
    for key, what in (("input_ids", "the forward's token ids"), ("positions", "each row's position in its request")):
        v = rec.get(key)
        if v is None:
            out.append(f"no '{key}' ({what})")
            continue
        if (isinstance(v, torch.Tensor) and v.dim() != 1) or int_values(v) is None:
            out.append(f"{key} must be a 1-D integer tensor or list [T], got {_shown(v)}")
            continue
        n = len(int_values(v))
        if T is None:
            T = n
        elif n != T:
            out.append(f"positions has {n} entries, input_ids {T} (one per row)")
    counts = {}
    for key in ("num_layers", "hidden_size"):
        v = rec.get(key)
        if v is not None:
            counts[key] = _v1_count(v)
            if counts[key] is None or counts[key] < 1:
                out.append(f"{key} must be an integer >= 1, got {_shown(v)}")
                counts[key] = None
    L, H = counts.get("num_layers"), counts.get("hidden_size")
    lists = {}
    for key in ("layers_to_capture", "draft_ids"):
        v = rec.get(key)
        if v is not None:
            lists[key] = int_values(v)
            if lists[key] is None:
                out.append(f"{key} must be a list of integers, got {_shown(v)}")
    aux = rec.get("aux")
    if aux is not None:
        if not (isinstance(aux, torch.Tensor) and aux.dim() == 2 and aux.dtype in _FLOAT):
            out.append(f"aux must be a floating [T, K*H] tensor or None, got {_shown(aux)}")
            aux = None
        elif T is not None and aux.shape[0] != T:
            out.append(f"aux has {aux.shape[0]} rows, input_ids {T}")
        ltc = lists.get("layers_to_capture")
        if aux is not None and ltc is not None and H is not None and aux.shape[1] != len(ltc) * H:
            out.append(f"aux is {aux.shape[1]} wide, layers_to_capture x hidden_size = {len(ltc)} x {H}")
    for key in ("forward_mode", "model_class", "dtype", "declared_convention"):
        v = rec.get(key)
        if v is not None and not isinstance(v, str):
            out.append(f"{key} must be a string, got {_shown(v)}")
    dec = rec.get("declared")
    if dec is not None and not (isinstance(dec, list) and all(isinstance(x, str) for x in dec)):
        out.append(f"declared must be a list of strings, got {_shown(dec)}")
    elif dec is not None and all(_TAP_RE.match(x) for x in dec):
        out += declaration_problems(dec, lists.get("layers_to_capture"), lists.get("draft_ids"), L)
    out += _stream_problems(rec.get("stream"), rec.get("stream_layer_inputs"), T, H, L, aux)
    return out


def validate_record(rec: Any, where: str = "record") -> None:
    """Raise :class:`DumpRecordError` naming every problem of `rec` (see :func:`record_problems`)."""
    problems = record_problems(rec)
    if problems:
        fmt = rec.get("format") if isinstance(rec, dict) and isinstance(rec.get("format"), str) and \
            rec.get("format") in FORMATS else FORMAT
        raise DumpRecordError(f"{where}: not an {fmt} record: " + "; ".join(problems))


__all__ = ["FORMAT", "FORMAT_V2", "FORMATS", "DOCTOR_RID_PREFIX", "TMP_SUFFIX", "SERVER_RE", "FILE_RE", "V2_FILE_RE",
           "V1_FILE_RE", "STREAM_DECLARED", "STREAM_ALL", "STREAM_MODES", "CONVENTIONS", "FIELDS", "FIELDS_V2",
           "SERVER_FIELDS", "REQUEST_FIELDS", "RANK_FIELDS", "DumpError", "DumpRecordError", "host_in_name",
           "file_name", "is_doctor_rid", "record_problems", "v1_record_problems", "validate_record",
           "declaration_problems"]
