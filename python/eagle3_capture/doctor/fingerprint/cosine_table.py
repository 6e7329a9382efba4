"""The cosine sums behind ``doctor fingerprint``: a capture's rows aligned with the reference's tokens, its slots
as unit rows, the sums of cosines per (slot, reference column) streamed one reference column at a time, and the
findings for rows that cannot be compared (not finite, or all zero where the reference is not)."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import List, Tuple

import torch

from ...findings import Finding
from ..common import DoctorError
from .files import Captured, Reference


def align_rows(ref: Reference, cap: Captured) -> Tuple[int, str]:
    """Start row in the reference of the captured rows, or DoctorError."""
    Tc, T = cap.aux.shape[0], ref.num_tokens
    if cap.input_ids is None:
        if Tc != T:
            raise DoctorError(f"captured {cap.path}: mismatched token counts: it has T={Tc} rows and no input_ids, "
                              f"the reference {ref.path} has T={T} tokens; without token ids the rows must be the "
                              "same tokens")
        return 0, "no input_ids in the capture: rows assumed to be the reference's tokens"
    if cap.input_ids.numel() != Tc:
        raise DoctorError(f"captured {cap.path}: input_ids has {cap.input_ids.numel()} tokens but aux has {Tc} rows")
    if Tc == 0:
        raise DoctorError(f"captured {cap.path}: no rows")
    if Tc > T:
        raise DoctorError(f"captured {cap.path}: mismatched token counts: {Tc} captured tokens, but the reference "
                          f"{ref.path} has only {T}; dump the reference for the same prompts")
    r, c = ref.input_ids, cap.input_ids
    starts = [s for s in range(T - Tc + 1) if torch.equal(r[s:s + Tc], c)]
    if not starts:
        same_len = " (same count, different tokens)" if Tc == T else ""
        raise DoctorError(f"captured {cap.path}: its {Tc} tokens{same_len} do not occur as a run in the reference's "
                          f"{T} tokens (first captured ids {c[:8].tolist()}, first reference ids "
                          f"{r[:8].tolist()}); dump the reference for the prompts the server captured")
    if len(starts) > 1 and cap.positions is not None and ref.positions is not None:
        exact = [s for s in starts if torch.equal(ref.positions[s:s + Tc], cap.positions)]
        starts = exact or starts
    note = "" if starts[0] == 0 and Tc == T else f"rows {starts[0]}..{starts[0] + Tc - 1} of the reference"
    return starts[0], note


@dataclass
class SlotRows:
    """One aligned capture: its normalised slots and which of its rows can be compared."""

    cap: Captured
    start: int                     # row of the reference where its rows begin
    normed: torch.Tensor           # [K, Tc, H] float32, unit rows (rows that are not valid: zero)
    valid: torch.Tensor            # [K, Tc] bool: finite and not all zero
    nonfinite: torch.Tensor        # [K, Tc] bool
    zero: torch.Tensor             # [K, Tc] bool


def _unit_rows(x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(rows scaled to unit length as float32, finite [T], norm [T] float64) of x [T, H]; rows that are not finite
    or all zero come back as zeros. The norm accumulates in float64 (a finite float32 row cannot overflow it), so a
    row is finite exactly when its norm is, and no float64 copy of x is made."""
    norm = torch.linalg.vector_norm(x, dim=-1, dtype=torch.float64)
    finite = torch.isfinite(norm)
    x = x.float()
    if not bool(finite.all()):
        x = torch.where(finite[:, None], x, torch.zeros((), dtype=x.dtype))
        norm = torch.where(finite, norm, torch.zeros((), dtype=norm.dtype))
    scale = torch.where(norm > 0, 1.0 / norm.clamp_min(1e-300), torch.zeros((), dtype=norm.dtype))
    return x * scale.float()[:, None], finite, norm


def slot_rows(cap: Captured, start: int, K: int, H: int) -> SlotRows:
    """A capture aligned at reference row `start`, as K slots of unit rows of width H (one slot at a time)."""
    Tc = cap.aux.shape[0]
    normed = torch.empty(K, Tc, H, dtype=torch.float32)
    valid, nonfinite, zero = (torch.empty(K, Tc, dtype=torch.bool) for _ in range(3))
    for k in range(K):  # one slot at a time: the temporaries stay one slot large
        normed[k], finite, norm = _unit_rows(cap.aux[:, k * H:(k + 1) * H])
        valid[k], nonfinite[k], zero[k] = finite & (norm > 0), ~finite, finite & (norm == 0)
    return SlotRows(cap, start, normed, valid, nonfinite, zero)


@dataclass
class CosineSums:
    """What the cosine table is computed from, summed over every aligned capture."""

    cos_sum: torch.Tensor          # [K, C] float64
    used: torch.Tensor             # [K, C] int64: rows compared
    ref_nonfinite: List[int]       # per column: reference rows with a NaN or Inf
    ref_zero: torch.Tensor         # [C, T] bool: all-zero reference rows


def stream_cosines(ref: Reference, records: List[SlotRows], K: int) -> CosineSums:
    """Sums of cosines and row counts per (slot, column), reading the reference one column at a time. The dot
    products of unit rows are float32 (error ~1e-6, far below the 0.005 that separates neighbouring layers), their
    sums over rows float64."""
    C, T = len(ref.columns), ref.num_tokens
    cos_sum = torch.zeros(K, C, dtype=torch.float64)
    used = torch.zeros(K, C, dtype=torch.int64)
    ref_nonfinite = [0] * C
    ref_zero = torch.zeros(C, T, dtype=torch.bool)
    for c in range(C):
        unit, finite, norm = _unit_rows(ref.column(c))
        rvalid = finite & (norm > 0)
        ref_nonfinite[c] = int((~finite).sum())
        ref_zero[c] = finite & (norm == 0)
        for rec in records:
            Tc = rec.valid.shape[1]
            rows = unit[rec.start:rec.start + Tc]
            rv = rvalid[rec.start:rec.start + Tc]
            cos = torch.einsum("kth,th->kt", rec.normed, rows).double()     # [K, Tc]
            both = rec.valid & rv[None]
            cos_sum[:, c] += torch.where(both, cos, torch.zeros((), dtype=cos.dtype)).sum(-1)
            used[:, c] += both.sum(-1)
        del unit
    return CosineSums(cos_sum, used, ref_nonfinite, ref_zero)


def row_findings(ref: Reference, records: List[SlotRows], table: CosineSums, best: List[int], K: int
                  ) -> Tuple[List[Finding], List[str]]:
    """Findings for a reference that is not finite (first: a broken reference explains what follows) and for
    captured rows that are not finite or are all zero. A slot none of whose rows can be compared is blamed on the
    capture only when its own rows are not finite or all zero; else on the reference."""
    out, notes = [], []
    for c, n in enumerate(table.ref_nonfinite):
        if n:
            out.append(Finding("error", "fingerprint-reference-nonfinite",
                               f"reference {ref.path}: {ref.labels[c]} has {n} of {ref.num_tokens} rows with NaN or "
                               "Inf; they are left out of the cosines",
                               "dump the reference again (in float32)"))
    total = sum(r.valid.shape[1] for r in records)
    for k in range(K):
        nf = sum(int(r.nonfinite[k].sum()) for r in records)
        if nf:
            first = next((r, int(r.nonfinite[k].nonzero()[0])) for r in records if r.nonfinite[k].any())
            out.append(Finding(
                "error", "fingerprint-nonfinite-rows",
                f"captured slot {k}: {nf} of {total} rows hold NaN or Inf (first: {os.path.basename(first[0].cap.path)}"
                f" row {first[1]}); they are left out of the cosines: a capture that is not finite is broken, "
                "whatever tap it holds",
                "find where the served model or the capture produces non-finite values (dtype overflow, an "
                "uninitialised buffer)"))
        # all-zero rows: a fault unless the reference row the slot matches is all zero too (a padding embedding)
        unexplained, explained, first = 0, 0, None
        for r in records:
            rows = r.zero[k].nonzero().flatten()
            if rows.numel() == 0:
                continue
            ref_zero = table.ref_zero[best[k], r.start + rows]
            explained += int(ref_zero.sum())
            bad = rows[~ref_zero]
            unexplained += int(bad.numel())
            if first is None and bad.numel():
                first = (r, int(bad[0]))
        if unexplained:
            out.append(Finding(
                "error", "fingerprint-zero-rows",
                f"captured slot {k}: {unexplained} of {total} rows are all zero where the reference's "
                f"{ref.labels[best[k]]} is not (first: {os.path.basename(first[0].cap.path)} row {first[1]}); "
                "they are left out of the cosines: those rows were not captured",
                "check that every tap is written for every token (a slot the capture skips keeps the buffer's "
                "zeros)"))
        if explained:
            notes.append(f"slot {k}: {explained} all-zero row(s) where the reference's {ref.labels[best[k]]} is all "
                         "zero too (left out of the cosines)")
        if int(table.used[k].max()) == 0:
            if any(bool(r.valid[k].any()) for r in records):
                out.append(Finding("error", "fingerprint-no-rows",
                                   f"captured slot {k}: none of its {total} rows can be compared: the reference has no "
                                   "finite, non-zero row at those tokens (the reference is broken, not the capture)",
                                   "dump the reference again (in float32)"))
            else:
                out.append(Finding("error", "fingerprint-no-rows",
                                   f"captured slot {k}: none of its {total} rows can be compared (non-finite or all "
                                   "zero): nothing is known about the tap it holds",
                                   "dump a capture with finite, non-zero rows"))
    return out, notes


__all__ = ["align_rows", "SlotRows", "slot_rows", "CosineSums", "stream_cosines", "row_findings"]
