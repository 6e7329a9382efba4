"""Reading the server dump: each record file loaded and checked against the contract (:mod:`.contract`, the one
validator) into a :class:`DumpRecord`, a directory read as a live server fills it (:class:`DumpReader`), and one
request's rows stitched across records.

Version 3 (``format`` = ``eagle3-capture-dump/3``; files ``eagle3_capture_<host>_<server>_tp<rank>_<seq>.pt``) is
version 2 plus the writing process (``server``: its random id, ``host``, ``pid``), so that the records of replicas
sharing one directory are told apart (``inventory.py``). Version 2 (``eagle3-capture-dump/2``; files
``eagle3_capture_pid<pid>_tp<rank>_<seq>.pt``) carries the request boundaries (``requests``: rid, rows, prefix
length), the served slots (``aux``, at ``layers_to_capture``) and, for forwards holding one of the doctor's own
requests (rid prefix ``eagle3-doctor-``), the residual stream (``stream`` [S, T, H] at the layer inputs
``stream_layer_inputs``: 0 = the embedding output, i = the input of layer i, L = the final boundary before the final
norm). Version 1 (``eagle3_capture_pid<pid>_<n>.pt``, no ``format`` key) carries ``aux``, ``input_ids``,
``positions`` and ``layers_to_capture`` only: no request ids, no stream.

Rows of one request may be split over several records (chunked prefill); :func:`doctor_requests` gathers them per
*writer and rid* -- replicas sharing a directory may write records of one rid (a miswired replica reusing a correct
one's), and neither may hide the other -- and :func:`stitch` joins them by ``positions``, refusing rows that
disagree: another token, or another capture (layers_to_capture, declared taps) at one position. ``*.tmp`` files are
in flight and never read. Every problem is a :class:`~.contract.DumpError` naming the file (or the request) and the
field.
"""
from __future__ import annotations

import glob
import os
import zipfile
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Optional

import torch

from .contract import (DOCTOR_RID_PREFIX, FORMAT, FORMATS, V2_FILE_RE, DumpError, DumpRecordError, int_values,
                       record_problems, v1_record_problems)

# forwards whose rows are the request's own tokens (a verify's rows are draft tokens, a decode's one new token)
PREFILL_MODES = ("EXTEND", "MIXED", "PREFILL", "SPLIT_PREFILL")


@dataclass
class RequestRows:
    rid: Optional[str]
    row_start: int
    row_end: int
    prefix_len: Optional[int]


@dataclass
class DumpRecord:
    """One dumped forward, its fields checked (tensors may be memory-mapped: read only what is used)."""

    path: str
    version: int
    forward_mode: str
    input_ids: torch.Tensor                  # [T] int64
    positions: torch.Tensor                  # [T] int64
    aux: Optional[torch.Tensor]              # [T, K*H]
    layers_to_capture: Optional[List[int]]
    requests: Optional[List[RequestRows]]    # v2 only
    stream: Optional[torch.Tensor]           # [S, T, H], v2 doctor forwards only
    stream_layer_inputs: Optional[List[int]]
    num_layers: Optional[int]
    hidden_size: Optional[int]
    model_class: Optional[str]
    dtype: Optional[str]
    draft_ids: Optional[List[int]]
    declared: Optional[List[str]]
    declared_convention: Optional[str]
    graph: Optional[bool] = None             # v2: replayed from a CUDA graph
    server: Optional[str] = None             # v3: the writing process's random id
    host: Optional[str] = None               # v3: its host name
    pid: Optional[int] = None                # v3: its process id (in its own PID namespace)

    @property
    def rows(self) -> int:
        return int(self.input_ids.numel())


def dump_files(path: str) -> List[str]:
    """The record files of a dump directory (or the one file given), in name order; ``*.tmp`` never."""
    if path is None or not os.path.exists(path):
        raise DumpError(f"dump {path}: no such file or directory")
    if not os.path.isdir(path):
        return [path]
    files = [f for f in glob.glob(os.path.join(path, "*.pt")) if os.path.isfile(f)]
    return sorted(files)


def _ids(v: Any) -> torch.Tensor:
    """A checked list or integer tensor of ids as a 1-D int64 tensor."""
    return v.to(torch.int64) if isinstance(v, torch.Tensor) else torch.tensor(int_values(v), dtype=torch.int64)


def _count(v: Any) -> Optional[int]:
    return None if v is None else int(v)


def _ints(v: Any) -> Optional[List[int]]:
    return None if v is None else int_values(v)


def read_record(d: Any, path: str) -> DumpRecord:
    """A :class:`DumpRecord` of one loaded record, checked by the contract (:func:`~.contract.record_problems` for
    version 2, :func:`~.contract.v1_record_problems` for a record without ``format``); every problem is named in
    one :class:`~.contract.DumpRecordError`."""
    what = f"dump {path}"
    if not isinstance(d, dict):
        raise DumpRecordError(f"{what}: expected the plugin's dump (a dict), got {type(d).__name__}")
    fmt = d.get("format")
    if fmt is not None and not (isinstance(fmt, str) and fmt in FORMATS):
        raise DumpRecordError(f"{what}: format {fmt!r}; this reader reads {' and '.join(map(repr, FORMATS))} (and "
                              "version 1, which has no format key)")
    version = FORMATS[fmt] if fmt is not None else 1
    problems = record_problems(d) if version >= 2 else v1_record_problems(d)
    if problems:
        kind = f"an {fmt} record" if version >= 2 else "a version-1 dump record"
        raise DumpRecordError(f"{what}: not {kind}: " + "; ".join(problems))
    reqs = None
    if version >= 2:
        reqs = [RequestRows(r["rid"], r["row_start"], r["row_end"], r["prefix_len"]) for r in d["requests"]]
    return DumpRecord(path, version, d.get("forward_mode") or "?", _ids(d["input_ids"]), _ids(d["positions"]),
                      d.get("aux"), _ints(d.get("layers_to_capture")), reqs, d.get("stream"),
                      _ints(d.get("stream_layer_inputs")), _count(d.get("num_layers")), _count(d.get("hidden_size")),
                      d.get("model_class"), d.get("dtype"), _ints(d.get("draft_ids")), d.get("declared"),
                      d.get("declared_convention"), d.get("graph"), d.get("server"), d.get("host"), d.get("pid"))


CRC_CHUNK = 16 << 20


def verify_bytes(path: str) -> None:
    """Every byte of a record file against the CRC-32 its zip directory holds for each member (torch.save writes
    them; torch.load does not check them, so a flipped bit in a tensor would load as data). DumpError naming the
    member when one does not match. Costs one read of the file at the speed of zlib's CRC-32 (docs/dump_format.md
    gives the figures)."""
    try:
        with zipfile.ZipFile(path) as z:
            infos = z.infolist()
            if infos and all(i.CRC == 0 for i in infos) and any(i.file_size for i in infos):
                raise DumpError(f"dump {path}: written without CRC-32s (torch.serialization.config.save."
                                "compute_crc32 off in the writing process): its bytes cannot be verified; write the "
                                "dump with CRCs on (the default)")
            for info in infos:
                try:
                    with z.open(info) as f:
                        while f.read(CRC_CHUNK):
                            pass
                except zipfile.BadZipFile as e:
                    if "CRC" not in str(e):
                        raise
                    raise DumpError(f"dump {path}: {info.filename} fails its CRC-32: the record's bytes changed "
                                    "after it was written (a disk or copy error, or an edit); remove the record, or "
                                    "dump again") from None
    except DumpError:
        raise
    except Exception as e:  # noqa: BLE001 - a truncated or foreign file fails in many ways inside zipfile
        raise DumpError(f"dump {path}: not a readable dump record (zip: {type(e).__name__}: "
                        f"{str(e).splitlines()[0] if str(e) else ''}); a truncated or foreign file?") from None


def load_record(path: str) -> DumpRecord:
    """One record file, its bytes verified against their CRC-32s, loaded (memory-mapped, no pickled code) and
    checked."""
    verify_bytes(path)
    try:
        d = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as e:  # pickle / zip errors come in many types; a truncated file is one of them
        raise DumpError(f"dump {path}: not a readable dump record (torch.load: {type(e).__name__}: "
                        f"{str(e).splitlines()[0] if str(e) else ''}); a truncated or foreign file?") from None
    return read_record(d, path)


class DumpReader:
    """A dump directory read once per file (a live server keeps adding records: :meth:`refresh` reads the new
    ones)."""

    def __init__(self, path: str):
        self.path = path
        self.records: Dict[str, DumpRecord] = {}

    def refresh(self) -> List[DumpRecord]:
        for f in dump_files(self.path):
            if f not in self.records:
                self.records[f] = load_record(f)
        return [self.records[f] for f in sorted(self.records)]


@dataclass
class DumpedRequest:
    """One request's prefill rows, stitched over its records by position (0..T-1 when nothing came from the
    prefix cache)."""

    rid: Optional[str]
    input_ids: torch.Tensor                   # [T]
    first_position: int
    stream: Optional[torch.Tensor]            # [S, T, H]
    stream_layer_inputs: Optional[List[int]]
    aux: Optional[torch.Tensor]               # [T, K*H]
    layers_to_capture: Optional[List[int]]
    num_layers: Optional[int]
    hidden_size: Optional[int]
    model_class: Optional[str]
    dtype: Optional[str]
    version: int
    records: List[str] = field(default_factory=list)
    declared: Optional[List[str]] = None

    @property
    def length(self) -> int:
        return int(self.input_ids.numel())


def _same(values: Iterable, what: str, key: str):
    vals = [v for v in values]
    for v in vals[1:]:
        if v != vals[0]:
            raise DumpError(f"{what}: its records disagree on {key} ({vals[0]!r} vs {v!r})")
    return vals[0] if vals else None


def stitch(rid: Optional[str], parts: List[tuple], layers: Optional[List[int]] = None,
           with_aux: bool = True) -> DumpedRequest:
    """parts: (record, row_start, row_end) of one request's prefill rows; DumpError when they do not form one
    run of positions or disagree. ``layers``: only these stream entries (layer inputs) are read (a full-stream
    record of a deep model is large); ``with_aux``: read the served slots too."""
    what = f"dumped request {rid or '(no rid)'}"
    by_pos: Dict[int, tuple] = {}
    for rec, s, e in parts:
        for r, p in zip(range(s, e), rec.positions[s:e].tolist()):
            tok = int(rec.input_ids[r])
            if p in by_pos:
                other, orow = by_pos[p]
                if int(other.input_ids[orow]) != tok or capture_of(other) != capture_of(rec):
                    raise _conflict(what, p, other, int(other.input_ids[orow]), rec, tok)
                continue  # the same row written twice (two TP ranks of a version-1 dump, a retracted prefill)
            by_pos[p] = (rec, r)
    first, last = min(by_pos), max(by_pos)
    missing = [p for p in range(first, last + 1) if p not in by_pos]
    if missing:
        raise DumpError(f"{what}: positions {first}..{last} with {len(missing)} missing (first: {missing[0]}): a "
                          "chunk of its prefill is not in the dump (the writer's budget, or records removed)")
    recs = [by_pos[p] for p in range(first, last + 1)]
    records = list(dict.fromkeys(r.path for r, _ in recs))
    layers_all = _same([tuple(r.stream_layer_inputs) if r.stream_layer_inputs is not None else None
                        for r, _ in recs], what, "stream_layer_inputs")
    ltc = _same([tuple(r.layers_to_capture) if r.layers_to_capture is not None else None for r, _ in recs], what,
                "layers_to_capture")
    has_aux = _same([r.aux is not None for r, _ in recs], what, "whether aux is dumped")
    ids = torch.tensor([int(r.input_ids[i]) for r, i in recs], dtype=torch.int64)
    stream = aux = None
    stream_layers = None if layers_all is None else list(layers_all)
    if stream_layers is not None:
        pick = list(range(len(stream_layers)))
        if layers is not None:
            absent = [i for i in layers if i not in stream_layers]
            if absent:
                raise DumpError(f"{what}: the dump's stream holds layer inputs {stream_layers}, not {absent} "
                                  f"({os.path.basename(recs[0][0].path)})")
            pick = [stream_layers.index(i) for i in layers]
            stream_layers = list(layers)
        stream = _gather_rows([(r.stream, i, 1) for r, i in recs], pick)
    if has_aux and with_aux:
        aux = _gather_rows([(r.aux, i, 0) for r, i in recs])
    r0 = recs[0][0]
    return DumpedRequest(rid, ids, first, stream, stream_layers, aux,
                         None if ltc is None else list(ltc),
                         _same([r.num_layers for r, _ in recs], what, "num_layers"),
                         _same([r.hidden_size for r, _ in recs], what, "hidden_size"), r0.model_class, r0.dtype,
                         r0.version, records, r0.declared)


def _gather_rows(rows: List[tuple], pick: Optional[List[int]] = None) -> torch.Tensor:
    """Rows (tensor, row, row dim) -> one tensor with the rows in order along that dim, copying runs at once;
    ``pick``: for a stream (row dim 1), the entries of dim 0 to keep."""
    out, run = [], None

    def flush():
        t, s, e, dim = run
        part = t.narrow(dim, s, e - s)
        out.append(part[pick] if pick is not None else part)

    for t, i, dim in rows:
        if run is not None and run[0] is t and run[2] == i:
            run = (t, run[1], i + 1, dim)
        else:
            if run is not None:
                flush()
            run = (t, i, i + 1, dim)
    flush()
    return torch.cat(out, dim=rows[0][2]).clone()


def writer_key(rec: DumpRecord) -> str:
    """Who wrote a record: its server id (version 3), else what its file name says of its process (version 2:
    ``v2-pid<pid>``, which replicas in separate PID namespaces share), else its version alone."""
    if rec.server is not None:
        return rec.server
    m = V2_FILE_RE.match(os.path.basename(rec.path))
    return f"v{rec.version}-pid{m.group(1)}" if m else f"v{rec.version}"


def capture_of(rec: DumpRecord) -> tuple:
    """What a record says its slots hold: (layers_to_capture, declared taps); two records of one row must agree."""
    return (None if rec.layers_to_capture is None else tuple(rec.layers_to_capture),
            None if rec.declared is None else tuple(rec.declared))


def _conflict(what: str, p: int, a: DumpRecord, ta: int, b: DumpRecord, tb: int) -> DumpError:
    """Two records of one request disagree at a position: say what differs and what to do."""
    fa, fb = os.path.basename(a.path), os.path.basename(b.path)
    if ta != tb:
        differs = f"token {ta} in {fa} and token {tb} in {fb}"
    else:
        (la, da), (lb, db) = capture_of(a), capture_of(b)
        differs = (f"the same token {ta}, captured at layer inputs {list(la) if la else la} (declared {da}) in {fa} "
                   f"and at {list(lb) if lb else lb} (declared {db}) in {fb}")
    who = ("one writer" if writer_key(a) == writer_key(b) else
           f"writers {writer_key(a)} and {writer_key(b)}")
    return DumpError(f"{what}: two records of {who} disagree at position {p}: {differs}. One rid written twice "
                     "(replicas sharing the directory whose records cannot be told apart -- version-2 records "
                     "carry only a pid -- or a copied or edited record): remove the foreign records, or give each "
                     "server its own EAGLE3_CAPTURE_DUMP directory and run the doctor on each")


@dataclass
class RequestParts:
    """Where one request's prefill rows are (record, row_start, row_end), all of one writer; read with
    :meth:`load`."""

    rid: Optional[str]
    parts: List[tuple]
    writer: Optional[str] = None

    @property
    def input_ids(self) -> torch.Tensor:
        """The request's token ids by position (DumpError when a position is missing or two records disagree on
        it), without its tensors."""
        by_pos: Dict[int, int] = {}
        seen: Dict[int, tuple] = {}
        what = f"dumped request {self.rid or '(no rid)'}"
        for rec, s, e in self.parts:
            for r, (p, tok) in enumerate(zip(rec.positions[s:e].tolist(), rec.input_ids[s:e].tolist())):
                if p in by_pos and (by_pos[p] != tok or capture_of(seen[p][0]) != capture_of(rec)):
                    raise _conflict(what, p, seen[p][0], by_pos[p], rec, tok)
                by_pos[p] = tok
                seen.setdefault(p, (rec, s + r))
        first, last = min(by_pos), max(by_pos)
        if len(by_pos) != last - first + 1:
            gap = next(p for p in range(first, last + 1) if p not in by_pos)
            raise DumpError(f"dumped request {self.rid or '(no rid)'}: positions {first}..{last} with "
                              f"{last - first + 1 - len(by_pos)} missing (first: {gap}): a chunk of its prefill is "
                              "not in the dump (the writer's budget, or records removed)")
        return torch.tensor([by_pos[p] for p in range(first, last + 1)], dtype=torch.int64)

    def load(self, layers: Optional[List[int]] = None, with_aux: bool = True) -> DumpedRequest:
        return stitch(self.rid, self.parts, layers, with_aux)


def doctor_requests(records: Iterable[DumpRecord], rid_prefix: str = DOCTOR_RID_PREFIX
                    ) -> Dict[tuple, RequestParts]:
    """(writer, rid) -> where the request's prefill rows are, for the requests of version-2 or -3 records whose rid
    starts with ``rid_prefix`` (nothing is read until :meth:`RequestParts.load`). Keyed by writer as well as rid:
    replicas sharing a directory never hide each other's records of one rid (:func:`writer_key`)."""
    parts: Dict[tuple, RequestParts] = {}
    for rec in records:
        if rec.version < 2 or rec.forward_mode not in PREFILL_MODES:
            continue
        w = writer_key(rec)
        for rq in rec.requests or []:
            if rq.rid is not None and rq.rid.startswith(rid_prefix) and rq.row_end > rq.row_start:
                parts.setdefault((w, rq.rid), RequestParts(rq.rid, [], w)).parts.append(
                    (rec, rq.row_start, rq.row_end))
    return parts


def by_rid(requests: Dict[tuple, RequestParts]) -> Dict[str, List[RequestParts]]:
    """rid -> its requests, one per writer that wrote it (in the order first seen)."""
    out: Dict[str, List[RequestParts]] = {}
    for (_, rid), parts in requests.items():
        out.setdefault(rid, []).append(parts)
    return out


def one_writer(rid: str, found: List[RequestParts], where: str) -> RequestParts:
    """The one request of `rid` (the doctor sent it once, to one server); DumpError naming the writers when several
    wrote it."""
    if len(found) == 1:
        return found[0]
    files = "; ".join(f"{p.writer}: {os.path.basename(p.parts[0][0].path)}" for p in found[:4])
    raise DumpError(f"{where}: request {rid} is in the records of {len(found)} writers ({files}); the doctor sent it "
                    "once, to one server: another server's records carry the same rid (a copied dump directory, or "
                    "replicas given the same requests): give the directory of the server that was sent the request, "
                    "or remove the foreign records")


def v1_sequences(records: Iterable[DumpRecord]) -> List[RequestParts]:
    """Version-1 records have no request ids: each prefill record split where positions stop counting up by one,
    keeping the runs that start at position 0 (a whole request's prefill in one forward, none of it cached)."""
    out = []
    for rec in records:
        if rec.version != 1 or rec.forward_mode not in PREFILL_MODES:
            continue
        pos = rec.positions.tolist()
        cuts = [0] + [i for i in range(1, len(pos)) if pos[i] != pos[i - 1] + 1] + [len(pos)]
        for s, e in zip(cuts, cuts[1:]):
            if pos[s] == 0:
                out.append(RequestParts(None, [(rec, s, e)]))
    return out


__all__ = ["PREFILL_MODES", "RequestRows", "DumpRecord", "DumpedRequest", "DumpReader", "RequestParts", "dump_files",
           "read_record", "load_record", "verify_bytes", "stitch", "doctor_requests", "by_rid", "one_writer",
           "writer_key", "capture_of", "v1_sequences"]
