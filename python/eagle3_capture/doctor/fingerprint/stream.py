"""The fingerprint with no reference model: the server's own residual stream names the layer of each served slot.

* :func:`served_fingerprint` (part of ``doctor online`` without ``--target``): the slots the server fed its draft
  (``aux`` of the doctor's teacher-forced requests) against the stream of the same forward -- a slot equal bit for
  bit to the stream at layer input i holds that layer input -- and against the draft's declared taps.
* :func:`dump_fingerprint` (``doctor fingerprint --captured DUMP`` without ``--reference``): the same over every
  doctor request in a dump (a full-stream dump, ``EAGLE3_CAPTURE_DUMP_STREAM=all``, names any layer).
* :func:`embedding_check`: the stream's embedding output (layer input 0), and a slot declared ``Embedding``, against
  rows of ``embed_tokens`` read alone from the target checkpoint's shard, bit for bit.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

import torch

from ...dump_format.inventory import inventory
from ...dump_format.reader import DumpReader, RequestParts, doctor_requests
from ..bad_rows import BLAME, BadRows, grouped, row_flags, summary
from ..common import DeploymentFinding, DoctorError
from ..progress import bar as progress_bar
from .stream_match import NO_ROWS, SlotMatch, StreamMatcher, layer_name, render_matches


@dataclass
class EmbeddingCheck:
    what: str                 # which rows were checked ("the stream's layer input 0", "served slot 0")
    rows: int
    differing: int
    max_diff: float

    @property
    def ok(self) -> bool:
        return self.rows > 0 and self.differing == 0

    def line(self) -> str:
        if self.ok:
            return f"{self.what} equals embed_tokens[input_ids] bit for bit ({self.rows} rows)"
        return (f"{self.what} differs from embed_tokens[input_ids] in {self.differing} of {self.rows} rows (max "
                f"|diff| {self.max_diff:.3g}): not the embedding output of this checkpoint")


def embedding_check(ck, info, ids: torch.Tensor, rows: torch.Tensor, what: str) -> EmbeddingCheck:
    """rows [T, H] against embed_tokens[ids] of the checkpoint (cast to the rows' dtype, as a server computes)."""
    from ..target_side.checkpoint import embedding_rows, read_embedding

    vocab = info.vocab_size if info.vocab_size is not None else embedding_rows(ck)
    uniq, inv = torch.unique(ids, return_inverse=True)
    neg = [int(t) for t in uniq.tolist() if t < 0]
    if neg:
        raise DoctorError(f"{what}: the dumped request's token id {neg[0]} is negative: a record whose input_ids are "
                          "corrupted (no tokenizer gives a negative id); remove the record or dump again")
    bad = [int(t) for t in uniq.tolist() if t >= vocab]
    if bad:
        raise DoctorError(f"{what}: the dumped request's token id {bad[-1]} is outside the vocabulary of "
                          f"--target-checkpoint ({vocab} rows of embed_tokens): the dump is of another model than "
                          "this checkpoint, or its input_ids are corrupted; give the served model's checkpoint")
    emb = read_embedding(ck, info.vocab_size, info.hidden_size, "cpu", rows=uniq.tolist())[inv].to(rows.dtype)
    finite = ~row_flags(rows)[0]  # a NaN / Inf row is bad data (counted by the fingerprint), not a wrong embedding
    emb, rows = emb[finite], rows[finite]
    diff = (emb.float() - rows.float()).abs().amax(-1)
    same = (emb == rows).all(-1)
    return EmbeddingCheck(what, int(rows.shape[0]), int((~same).sum()), float(diff.max()) if diff.numel() else 0.0)


@dataclass
class StreamFingerprint:
    L: Optional[int]
    served: Optional[List[int]]               # layers_to_capture: what the server says its slots are
    stream_layers: Optional[List[int]]
    matches: List[SlotMatch] = field(default_factory=list)
    embedding: List[EmbeddingCheck] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)
    requests: int = 0
    bad_rows: List[BadRows] = field(default_factory=list)
    mixed: List[str] = field(default_factory=list)  # one line per declaration when a directory holds several

    @property
    def tap_problems(self) -> Optional[str]:
        """One line naming what the served slots hold that the draft does not declare, judged on the rows that carry
        data (None: nothing found)."""
        out = []
        if self.mixed:
            out.append(f"the directory holds the records of {len(self.mixed)} declarations (several servers, or a "
                       f"restart with another draft, write it): {'; '.join(self.mixed)} -- give each server its own "
                       "EAGLE3_CAPTURE_DUMP directory")
        for m in self.matches:
            if m.verdict == NO_ROWS:
                out.append(f"served slot {m.slot}: no row of it can be compared (every one is bad data)")
            elif m.verdict == "none":
                out.append(f"served slot {m.slot} is no layer of the server's stream (best {layer_name(m.best, self.L)}"
                           f", cos {m.best_cos:.4f})")
            elif m.expected is not None and m.verdict in ("exact", "clear") and m.best != m.expected:
                how = "bit for bit" if m.exact else f"cos {m.best_cos:.4f}"
                out.append(f"served slot {m.slot} holds {layer_name(m.best, self.L)} ({how}), the draft declares "
                           f"{layer_name(m.expected, self.L)}")
        out += [e.line() for e in self.embedding if not e.ok]
        return "the fingerprint: " + "; ".join(out) if out else None

    @property
    def mismatch(self) -> Optional[str]:
        """One line naming what is wrong (None: nothing found): bad rows first -- the data's fault --, then what the
        slots hold, judged on the other rows."""
        taps = self.tap_problems
        if not self.bad_rows:
            return taps
        rest = ("; on the other rows, " + taps if taps else
                "; the other rows show each served slot holding what the draft declares"
                if any(m.expected is not None for m in self.matches) else "")
        return f"bad data: rows in the dump: {summary(self.bad_rows)} -- {BLAME}{rest}"

    def lines(self) -> List[str]:
        if not self.matches and not self.embedding:
            return [f"fingerprint of the served slots: {'; '.join(self.notes) or 'nothing to compare'}"]
        where = ("" if self.stream_layers is None else
                 f" at layer inputs {self.stream_layers}" if len(self.stream_layers) <= 12 else
                 f" at {len(self.stream_layers)} layer inputs ({self.stream_layers[0]}..{self.stream_layers[-1]})")
        lines = [f"fingerprint of the served slots against the server's residual stream{where} ({self.requests} "
                 f"request(s); the server says its slots are layer inputs {self.served}):"]
        lines += ["  " + ln for ln in render_matches(self.matches, self.L, "slot")]
        lines += ["  " + e.line() for e in self.embedding]
        lines += ["  bad rows: " + b.line() for b in grouped(self.bad_rows)]
        if self.bad_rows:
            lines.append(f"  ({BLAME})")
        if any(m.verdict == "ambiguous" for m in self.matches):
            lines.append("  ambiguous: the best and next best layers differ by less than two captures of one tap; "
                         "give more tokens")
        lines += [f"  note: {n}" for n in self.notes]
        return lines

    def to_json(self) -> dict:
        return {"num_layers": self.L, "served_layer_inputs": self.served, "stream_layer_inputs": self.stream_layers,
                "requests": self.requests, "slots": [m.to_json(self.L) for m in self.matches],
                "embedding": [e.__dict__ | {"ok": e.ok} for e in self.embedding], "mismatch": self.mismatch,
                "bad_rows": [b.to_json() for b in self.bad_rows], "mixed_declarations": self.mixed,
                "notes": self.notes}


def fingerprint_requests(requests: Sequence[RequestParts], L: Optional[int], expected: Optional[List[int]],
                         ck=None, info=None, progress: bool = False, min_cos: float = 0.95) -> StreamFingerprint:
    """The served slots of these requests against their stream, one request in memory at a time."""
    fp = StreamFingerprint(L, None, None)
    matcher = None
    bar = progress_bar(len(requests), "fingerprint", "request", progress)
    for parts in requests:
        req = parts.load()
        bar.update(1)
        if req.aux is None or req.layers_to_capture is None:
            continue
        fp.served = req.layers_to_capture
        K = len(req.layers_to_capture)
        H = req.aux.shape[1] // K
        if req.stream is None:
            if "no residual stream" not in " ".join(fp.notes):
                fp.notes.append("the dump has no residual stream (a version-1 dump, or not a doctor request): the "
                                "served slots cannot be named without a reference")
        else:
            matcher = matcher or StreamMatcher(K, H, slot_name=lambda k: f"served slot {k}")
            T = req.aux.shape[0]
            matcher.add(req.aux, req.stream, req.stream_layer_inputs, f"request {req.rid}",
                        torch.arange(req.first_position, req.first_position + T))
            fp.stream_layers = req.stream_layer_inputs
        fp.requests += 1
        if ck is not None and info is not None:
            if req.stream is not None and 0 in req.stream_layer_inputs:
                _merge(fp, embedding_check(ck, info, req.input_ids, req.stream[req.stream_layer_inputs.index(0)],
                                           "the stream's embedding output (layer input 0)"))
            if expected is not None and 0 in expected:
                k = expected.index(0)
                _merge(fp, embedding_check(ck, info, req.input_ids, req.aux[:, k * H:(k + 1) * H],
                                           f"served slot {k} (declared Embedding)"))
        del req
    bar.close()
    if matcher is not None:
        if not matcher.entries_usable():
            raise DoctorError(f"the server's residual stream in the dump holds no usable row ({len(requests)} "
                              f"request(s); every row NaN, Inf or zero): nothing to compare the served slots with -- "
                              f"{BLAME}")
        fp.matches = matcher.matches(min_cos=min_cos, expected=expected)
        fp.bad_rows = matcher.bad_rows(fp.matches)
    return fp


def _merge(fp: StreamFingerprint, e: EmbeddingCheck) -> None:
    for old in fp.embedding:
        if old.what == e.what:
            old.rows += e.rows
            old.differing += e.differing
            old.max_diff = max(old.max_diff, e.max_diff)
            return
    fp.embedding.append(e)


def served_fingerprint(side, ds, ck, progress: bool = False) -> StreamFingerprint:
    """``doctor online``'s fingerprint: the teacher-forced requests' served slots against the declared taps."""
    from ..target_side.side import layer_inputs

    expected = layer_inputs(ds.declared) if ds.declared is not None else None
    others = list(getattr(side, "others", []))  # other writers' requests of the same prompts: never hidden
    return fingerprint_requests([sp.parts for sp in side.streamed] + others, side.info.num_layers, expected, ck,
                                side.info, progress)


def dump_fingerprint(path: str, expected: Optional[List[int]], ck=None, checkpoint_config=None,
                     progress: bool = False, min_cos: float = 0.95) -> StreamFingerprint:
    """``doctor fingerprint --captured DUMP`` with no reference: every doctor request of the dump."""
    from ..target_side.dump_side import info_from_dump

    records = DumpReader(path).refresh()
    reqs = list(doctor_requests(records).values())
    if not reqs:
        v1 = [r for r in records if r.version == 1]
        raise DoctorError(f"--captured {path}: no request of the doctor with a residual stream in it"
                          + (f" ({len(v1)} version-1 records: they carry no stream; fingerprint them with "
                             "--reference)" if v1 else "")
                          + "; the plugin dumps the stream of eagle3-doctor- requests (doctor online --dump, or "
                          "doctor fingerprint --server URL --training-data)")
    info = info_from_dump(reqs, f"--captured {path}", checkpoint_config)
    groups = by_declaration(reqs)
    fps = []
    for group in groups.values():  # each server's declaration judged on its own requests, against its own taps
        exp = expected if expected is not None else _declared_from_records(group, info.num_layers)
        fps.append(fingerprint_requests(group, info.num_layers, exp, ck, info if ck is not None else None,
                                        progress, min_cos))
    fp = fps[0]
    if len(groups) > 1:
        fp.mixed = [f"{declaration_name(key)}: {len(g)} request(s), "
                    + (sub.tap_problems or "every served slot holds the declared tap").replace("the fingerprint: ", "")
                    for (key, g), sub in zip(groups.items(), fps)]
    if not fp.matches and not fp.embedding:
        raise DoctorError(f"--captured {path}: its doctor requests carry no served slots (aux) to fingerprint")
    several = inventory(records).note()  # one declaration written by several processes: said, not a finding
    if several:
        fp.notes.append(several)
    return fp


def by_declaration(reqs: Sequence[RequestParts]) -> Dict[tuple, List[RequestParts]]:
    """The requests grouped by the declaration of the server that wrote them (its draft's declared taps and the
    layer inputs it served), in the order first seen: one group per server configuration in a shared directory."""
    groups: Dict[tuple, List[RequestParts]] = {}
    for r in reqs:
        head = r.parts[0][0]
        key = (tuple(head.declared) if head.declared else None,
               tuple(head.layers_to_capture) if head.layers_to_capture else None)
        groups.setdefault(key, []).append(r)
    return groups


def declaration_name(key: tuple) -> str:
    declared, served = key
    return (f"declaration {list(declared)}" if declared else "no declaration") + \
        (f" (served layer inputs {list(served)})" if served else "")


def slot_holdings(parts: RequestParts) -> List[str]:
    """What each served slot of one dumped request holds, as far as its stream tells ([]: it cannot tell)."""
    L = parts.parts[0][0].num_layers
    try:
        fp = fingerprint_requests([parts], L, None)
    except (DoctorError, ValueError):  # no usable stream rows
        return []
    return [f"slot {m.slot}: {layer_name(m.best, L)}" if m.verdict in ("exact", "clear") else
            f"slot {m.slot}: not one layer of the stream ({m.verdict})" for m in fp.matches]


def with_slot_holdings(e) -> DeploymentFinding:
    """An :class:`~..target_side.dump_side.AnotherDeclaration` finding, told what each served slot holds."""
    from ..target_side.dump_side import another_declaration

    return DeploymentFinding(another_declaration(e.parts, e.wanted, e.absent, slot_holdings(e.parts)))


def _declared_from_records(reqs: Sequence[RequestParts], L: int) -> Optional[List[int]]:
    """The layer inputs the server's draft declared, from the records' ``declared`` taps (canonical reprs)."""
    import re

    head = reqs[0].parts[0][0]
    if not head.declared:
        return None
    out = []
    for t in head.declared:
        m = re.fullmatch(r"LayerOutput\((\d+)\)", t)
        if t == "Embedding":
            out.append(0)
        elif m and int(m.group(1)) < L:
            out.append(int(m.group(1)) + 1)
        else:
            return None
    return out


__all__ = ["EmbeddingCheck", "embedding_check", "StreamFingerprint", "fingerprint_requests", "served_fingerprint",
           "dump_fingerprint", "by_declaration", "declaration_name", "slot_holdings",
           "with_slot_holdings"]
