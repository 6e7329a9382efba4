"""Fingerprinting captured slots against reference hidden states.

The reference (``doctor dump-reference``) holds, for some tokens, every residual-stream value of the target as the
training side computed it: the HF ``hidden_states`` stack (index h: 0 = embedding output, h = k+1 = output of
layer k; the last entry h = L is post-final-norm in most models) plus the final boundary LayerOutput(L-1) taken
before the final norm. The captured file holds what a server packed for the same tokens: ``aux`` [T, K*H]
(file formats: :mod:`.files`; the cosine sums: :mod:`.cosine_table`).

For every slot and every reference column the table gives the mean over tokens of the cosine similarity; the
column a slot matches names the tap the server really captured, whatever its config says. A one-layer shift
costs only about 0.1 accept length on real drafts, invisible in acceptance alone; here it is a different column.

Rows that cannot be compared are left out of the means and counted: a captured row with a NaN or Inf, or all zero
where the reference row it matches is not, is a broken capture and an error finding of its own (with the slot and
the row count); the table says how many rows each slot's figures rest on. The reference is read one column at a
time, so memory stays near the size of the capture plus one column, whatever the reference's size.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

import torch

from ...findings import Finding, compare_taps
from ...spec import EMBEDDING, LayerOutput, TapError, TapSpec
from ..common import DoctorError, fmt_table
from .cosine_table import SlotRows, align_rows, row_findings, slot_rows, stream_cosines
from .files import POST_NORM, Captured, Reference, load_captured, load_reference, short_label

DEFAULT_MIN_COS = 0.95     # below this, a slot matches nothing in the reference
DEFAULT_AMBIGUOUS = 0.005  # best - second best below this: the match is not trustworthy


@dataclass
class SlotMatch:
    slot: int
    best: int
    best_cos: float
    second: int
    second_cos: float
    declared: Optional[int]
    declared_cos: Optional[float]


@dataclass
class FingerprintResult:
    reference: Reference
    cos: torch.Tensor              # [K, C] mean cosine over the rows compared (NaN: no row could be)
    rows: int                      # captured token rows aligned with the reference
    records: List[str]
    notes: List[str]
    declared: Optional[TapSpec]
    declared_source: str
    served: Optional[List[object]]  # what the dump says the server meant to capture
    matches: List[SlotMatch]
    findings: List[Finding] = field(default_factory=list)
    min_cos: float = DEFAULT_MIN_COS
    rows_used: List[int] = field(default_factory=list)  # per slot: rows its best match's cosine rests on

    @property
    def K(self) -> int:
        return self.cos.shape[0]

    @property
    def matched(self) -> List[object]:
        return [self.reference.columns[m.best] if m.best_cos >= self.min_cos else None for m in self.matches]

    def to_json(self) -> dict:
        ref = self.reference
        return {
            "reference": ref.path, "records": self.records, "rows": self.rows, "rows_used": self.rows_used,
            "notes": self.notes, "columns": ref.labels, "cos": [[_num(v) for v in row] for row in self.cos],
            "declared": None if self.declared is None else [repr(t) for t in self.declared.taps],
            "declared_source": self.declared_source,
            "served": None if self.served is None else [repr(t) for t in self.served],
            "slots": [{"slot": m.slot, "matches": ref.labels[m.best], "cos": _num(m.best_cos),
                       "next_best": ref.labels[m.second], "next_cos": _num(m.second_cos),
                       "declared": None if m.declared is None else ref.labels[m.declared],
                       "declared_cos": None if m.declared_cos is None else _num(m.declared_cos),
                       "ok": m.declared is not None and m.best == m.declared and m.best_cos >= self.min_cos}
                      for m in self.matches],
            "findings": [f.__dict__ for f in self.findings],
        }


def _num(v) -> Optional[float]:
    """A cosine for JSON: rounded, and None where no row could be compared (JSON has no NaN)."""
    v = float(v)
    return None if math.isnan(v) else round(v, 6)


def _declared_from_record(cap: Captured, L: int, H: int) -> Tuple[Optional[TapSpec], Optional[List[object]], str]:
    """(declared taps from the dump's draft ids, taps the server meant from layers_to_capture, source text)."""
    declared, served, src = None, None, ""
    if cap.draft_ids is not None:
        try:
            declared = TapSpec.from_draft_ids(cap.draft_ids, L, H)
            src = f"draft ids {cap.draft_ids} recorded in the capture dump"
        except TapError as e:
            src = f"draft ids {cap.draft_ids} in the dump are not a valid tap set ({e})"
    if cap.layers_to_capture is not None:
        served = [EMBEDDING if i == 0 else LayerOutput(i - 1) for i in cap.layers_to_capture if 0 <= i <= L]
    return declared, served, src


def _check_thresholds(min_cos: float, ambiguous: float) -> None:
    if not isinstance(min_cos, (int, float)) or isinstance(min_cos, bool) or not -1.0 <= min_cos <= 1.0:
        raise DoctorError(f"--min-cos {min_cos!r}: expected a cosine in [-1, 1]")
    if not isinstance(ambiguous, (int, float)) or isinstance(ambiguous, bool) or not 0.0 <= ambiguous <= 2.0:
        raise DoctorError(f"ambiguous margin {ambiguous!r}: expected a number in [0, 2]")


def _declared_columns(declared: TapSpec, ref: Reference) -> List[int]:
    L, H = ref.num_layers, ref.hidden_size
    if declared.hidden_size != H or declared.num_layers != L:
        raise DoctorError(f"declared taps are for L={declared.num_layers}, H={declared.hidden_size}; the "
                          f"reference has L={L}, H={H}")
    missing = [t for t in declared.taps if t not in ref.columns]
    if missing:
        raise DoctorError(f"declared taps {missing} have no column in the reference {ref.path} (a reference "
                          "without final_prenorm cannot show the final boundary; dump it with doctor "
                          "dump-reference)")
    return [ref.columns.index(t) for t in declared.taps]


def fingerprint(reference: str, captured: str, declared: Optional[TapSpec] = None, declared_source: str = "",
                min_cos: float = DEFAULT_MIN_COS, ambiguous: float = DEFAULT_AMBIGUOUS) -> FingerprintResult:
    _check_thresholds(min_cos, ambiguous)
    ref = load_reference(reference)
    caps = load_captured(captured)
    L, H = ref.num_layers, ref.hidden_size
    K = None
    aligned: List[SlotRows] = []
    records, notes = [], []
    decls = {}  # (draft ids, served layer inputs) -> the records of the server(s) that ran with them
    skipped = []
    served = None
    dcols = None if declared is None else _declared_columns(declared, ref)
    for cap in caps:
        W = cap.aux.shape[1]
        if W % H:
            raise DoctorError(f"captured {cap.path}: aux width {W} is not a multiple of the reference's hidden size "
                              f"H={H} (K*H expected): a capture from another model?")
        if cap.hidden_size is not None and cap.hidden_size != H:
            raise DoctorError(f"captured {cap.path}: recorded hidden_size {cap.hidden_size}, the reference has H={H}")
        if cap.num_layers is not None and cap.num_layers != L:
            raise DoctorError(f"captured {cap.path}: recorded num_layers {cap.num_layers}, the reference has L={L}")
        if K is not None and W // H != K:
            raise DoctorError(f"captured {cap.path}: K={W // H} slots, earlier records have K={K}")
        try:
            start, note = align_rows(ref, cap)
        except DoctorError as e:
            if len(caps) == 1:
                raise
            skipped.append(f"{os.path.basename(cap.path)}: {e}")
            continue
        K = W // H
        if note:
            notes.append(f"{os.path.basename(cap.path)}: {note}")
        aligned.append(slot_rows(cap, start, K, H))
        records.append(cap.path)
        decls.setdefault((tuple(cap.draft_ids) if cap.draft_ids else None,
                          tuple(cap.layers_to_capture) if cap.layers_to_capture else None), []).append(cap.path)
        if declared is None:
            d, sv, src = _declared_from_record(cap, L, H)
            if d is not None:
                declared, declared_source = d, src
                dcols = _declared_columns(declared, ref)
            elif src and not declared_source:
                notes.append(src)
            served = served or sv
        elif served is None:
            served = _declared_from_record(cap, L, H)[1]
    if not aligned:
        raise DoctorError(f"captured {captured}: none of its {len(caps)} dumps matches the reference's tokens: "
                          + "; ".join(skipped[:3]))
    if skipped:
        notes.append(f"{len(skipped)} dump(s) skipped (tokens not in the reference)")
    table = stream_cosines(ref, aligned, K)
    if all(n == ref.num_tokens for n in table.ref_nonfinite):
        raise DoctorError(f"reference {ref.path}: every row of every index holds NaN or Inf: there is nothing to "
                          "compare the capture with; dump the reference again (in float32)")
    cos = torch.where(table.used > 0, table.cos_sum / table.used.clamp_min(1), torch.full((), float("nan"),
                                                                                            dtype=torch.float64))
    order_key = cos.nan_to_num(nan=-math.inf)
    matches = []
    for s in range(K):
        order = torch.argsort(order_key[s], descending=True, stable=True).tolist()
        best, second = order[0], order[1] if len(order) > 1 else order[0]
        dc = dcols[s] if dcols is not None and s < len(dcols) else None
        matches.append(SlotMatch(s, best, float(cos[s, best]), second, float(cos[s, second]), dc,
                                 None if dc is None else float(cos[s, dc])))
    bad_rows, row_notes = row_findings(ref, aligned, table, [m.best for m in matches], K)
    res = FingerprintResult(ref, cos.float(), sum(r.valid.shape[1] for r in aligned), records, notes + row_notes,
                            declared, declared_source, served, matches, min_cos=min_cos,
                            rows_used=[int(table.used[m.slot, m.best]) for m in matches])
    res.findings = bad_rows + _findings(res, ambiguous)
    if len(decls) > 1:  # the slots' cosines mix servers that capture different taps: no verdict on either
        res.findings.insert(0, Finding(
            "error", "fingerprint-mixed-declarations",
            f"the captured records hold {len(decls)} declarations: "
            + "; ".join(f"draft ids {None if d is None else list(d)}, served layer inputs "
                        f"{None if sv is None else list(sv)} ({len(ps)} record(s), first "
                        f"{os.path.basename(ps[0])})" for (d, sv), ps in decls.items())
            + ": records of several servers (or of a restart with another draft) in one directory; every slot's "
              "cosine mixes them",
            "give each server its own EAGLE3_CAPTURE_DUMP directory, or fingerprint one server's records alone"))
    return res


def _findings(res: FingerprintResult, ambiguous: float) -> List[Finding]:
    ref, out = res.reference, []
    labels = ref.labels
    for m in res.matches:
        if math.isnan(m.best_cos):
            continue  # no row of this slot could be compared: fingerprint-no-rows says so
        if m.best_cos < res.min_cos:
            out.append(Finding("error", "fingerprint-no-match",
                               f"captured slot {m.slot} matches no reference index (best {labels[m.best]} at cos "
                               f"{m.best_cos:.3f} < {res.min_cos}): not a hidden state of this model for these "
                               "tokens",
                               "check that the reference was dumped from the served weights for the same token ids"))
        elif m.best_cos - m.second_cos < ambiguous:
            out.append(Finding("warning", "fingerprint-ambiguous",
                               f"captured slot {m.slot}: {labels[m.best]} (cos {m.best_cos:.4f}) and "
                               f"{labels[m.second]} (cos {m.second_cos:.4f}) are too close to tell apart",
                               "use more or longer prompts for the reference and the capture"))
        if ref.columns[m.best] == POST_NORM and m.best_cos >= res.min_cos:
            out.append(Finding("error", "fingerprint-post-norm",
                               f"captured slot {m.slot} holds the final norm's output (HF hidden_states[{ref.num_layers}]), "
                               "not a residual-stream tap",
                               f"capture LayerOutput({ref.num_layers - 1}) before the final norm"))
    if res.declared is None:
        out.append(Finding("info", "fingerprint-undeclared",
                           "no declared taps (no --draft-config/--taps and no draft ids in the dump): matches are "
                           "reported without a verdict"))
        return out
    matched = res.matched
    if any(t is None or t == POST_NORM for t in matched):
        if len(matched) != res.declared.K:
            out.append(Finding("error", "count-mismatch",
                               f"{len(matched)} slots captured, the draft declares K={res.declared.K}"))
        return out
    for f in compare_taps(res.declared, matched,
                          fix=f"capture {list(res.declared.taps)} = draft ids {res.declared.to_draft_ids()}"):
        out.append(Finding(f.severity, "fingerprint-" + f.code, "measured: " + f.message, f.fix))
    return out


def render(res: FingerprintResult, *, max_cols: int = 24) -> str:
    """The cosine table (slots x reference indices) and a verdict per slot."""
    ref = res.reference
    C = len(ref.columns)
    cols = list(range(C))
    if C > max_cols:  # keep the columns that matter: per slot its best, second and declared
        keep = sorted({i for m in res.matches for i in (m.best, m.second, m.declared) if i is not None})
        cols = keep
    lines = [f"fingerprint: {len(res.records)} capture record(s), {res.rows} token rows, reference {ref.path} "
             f"(L={ref.num_layers}, H={ref.hidden_size})"]
    lines += [f"  note: {n}" for n in res.notes]
    L = ref.num_layers
    header = ["slot", "rows"] + [short_label(ref.columns[c], L) for c in cols]
    rows = []
    for m in res.matches:
        row = [str(m.slot), str(res.rows_used[m.slot]) if res.rows_used else "?"]
        for c in cols:
            v = float(res.cos[m.slot, c])
            mark = "*" if c == m.best else ("d" if c == m.declared else " ")
            row.append("  -  " + mark if math.isnan(v) else f"{v:.3f}{mark}")
        rows.append(row)
    lines.append(f"cosine similarity, mean over the rows compared (rows: how many of the {res.rows} the slot's best "
                 "match rests on; rows with NaN/Inf or all zero are left out; * best match, d declared; "
                 f"Emb = hidden_states[0], LOk = LayerOutput(k) = hidden_states[k+1], LO{L - 1} taken before the "
                 "final norm" + (f", hs{L}post = HF's last entry, after it" if POST_NORM in ref.columns else "")
                 + "):")
    lines.append(fmt_table(rows, header))
    vrows = []
    for m in res.matches:
        dec = "-" if m.declared is None else ref.labels[m.declared]
        ok = (m.declared is not None and m.best == m.declared and m.best_cos >= res.min_cos)
        verdict = "ok" if ok else ("?" if m.declared is None else "MISMATCH")
        served = "-"
        if res.served is not None and m.slot < len(res.served):
            served = repr(res.served[m.slot])
        if math.isnan(m.best_cos):
            verdict = "NO ROWS"
        vrows.append([m.slot, f"{ref.labels[m.best]} ({_fmt_cos(m.best_cos)})",
                      f"{ref.labels[m.second]} ({_fmt_cos(m.second_cos)})", dec, served, verdict])
    lines.append("")
    lines.append(fmt_table(vrows, ["slot", "matches", "next best", "declared", "server meant", "verdict"]))
    if res.declared is not None:
        lines.append(f"declared taps: {list(res.declared.taps)} ({res.declared_source or 'given'})")
    return "\n".join(lines)


def _fmt_cos(v: float) -> str:
    return "-" if math.isnan(v) else f"{v:.3f}"


__all__ = ["DEFAULT_MIN_COS", "DEFAULT_AMBIGUOUS", "SlotMatch", "FingerprintResult", "fingerprint", "render"]
