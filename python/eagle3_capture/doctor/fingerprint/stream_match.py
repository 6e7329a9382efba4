"""Which layer a slot holds, told by the residual stream itself: no reference model.

A *slot* is one H-wide column group of something captured for some tokens (the served ``aux``, or a SpecForge
sample's ``aux_hidden_state``); the *stream* is the residual stream of the same tokens at several layer inputs
(the server's full-stream dump: 0 = embedding, i = input of layer i, L = final boundary). Per slot and stream entry
the mean cosine over the rows, the per-row cosines and whether the two are equal bit for bit.

Honest at depth: in a deep model neighbouring layers' streams are nearly parallel, so a best match means little
unless it beats the next best by more than two captures of the *same* tap differ. That noise is measured where
the pair is known (``1 - cos`` of the best match, if the best is the same tap: the best cannot be closer to the
slot than the slot's own tap's other capture is); a match is

* ``exact``: equal bit for bit (the same capture, e.g. a served slot and the stream of the same forward) to that
  entry alone; equal to several (a stream that does not change between them) is ``ambiguous``;
* ``clear``: margin (best - next best) larger than ``NOISE_FACTOR`` x that noise, and the best wins on at least
  ``MIN_ROW_WINS`` of the rows one by one;
* ``ambiguous``: otherwise -- the report says so instead of naming a layer;
* ``none``: best cosine below ``min_cos``: the slot is no layer of this stream;
* ``no rows``: no row of the slot could be compared (every one is bad data: :mod:`..bad_rows`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence

import torch

from ..bad_rows import BadRows, RowTally, row_flags

DEFAULT_MIN_COS = 0.95
NOISE_FACTOR = 2.0
MIN_ROW_WINS = 0.9
NO_ROWS = "no rows"  # the verdict of a slot none of whose rows could be compared (bad data, no match either way)


def layer_name(i: int, L: Optional[int]) -> str:
    """A layer input in words: 0 = Embedding, i = LayerOutput(i-1); L = the final boundary."""
    if i == 0:
        return "Embedding"
    return f"LayerOutput({i - 1})" + (" (final boundary)" if L is not None and i == L else "")


@dataclass
class SlotMatch:
    slot: int
    best: int                      # layer input
    best_cos: float
    second: Optional[int]
    second_cos: float
    exact: bool
    rows: int
    row_wins: float                # share of rows whose own best is ``best`` over ``second``
    verdict: str                   # exact | clear | ambiguous | none
    expected: Optional[int] = None  # the layer input the slot should hold (declared), if known

    @property
    def margin(self) -> float:
        return self.best_cos - self.second_cos

    @property
    def noise(self) -> float:
        return 1.0 - self.best_cos

    def to_json(self, L: Optional[int] = None) -> dict:
        return {"slot": self.slot, "holds": None if self.verdict in ("none", "ambiguous", NO_ROWS) else self.best,
                "holds_name": layer_name(self.best, L), "best": self.best, "best_cos": _r(self.best_cos),
                "next_best": self.second, "next_cos": _r(self.second_cos), "margin": _r(self.margin),
                "noise": _r(self.noise), "row_wins": _r(self.row_wins), "exact": self.exact, "rows": self.rows,
                "verdict": self.verdict, "expected": self.expected,
                "ok": None if self.expected is None else (self.verdict in ("exact", "clear")
                                                           and self.best == self.expected)}


def _r(v: float):
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else round(float(v), 7)


def _unit(x: torch.Tensor) -> torch.Tensor:
    x = x.float()
    n = torch.linalg.vector_norm(x, dim=-1, keepdim=True)
    return x / n.clamp_min(1e-30)


@dataclass
class StreamMatcher:
    """Accumulates, over batches of tokens, every (slot, stream entry) cosine. Entries are named by layer input;
    every batch must carry the same entries.

    Rows that hold no information (:mod:`..bad_rows`: a NaN or Inf, or all zero) enter no cosine and no bit-for-bit
    comparison: they are counted per slot and per entry (:meth:`bad_rows`). A zero row is data where zero is a
    value the thing can hold: at the entries ``zero_ok`` (the embedding output, layer input 0), and in a slot where
    the entry it matches is zero at that row too. ``slot_name`` / ``entry_name`` name them in messages."""

    K: int
    H: int
    layers: Optional[List[int]] = None
    row_cos: Dict[tuple, List[torch.Tensor]] = field(default_factory=dict)
    equal: Dict[tuple, bool] = field(default_factory=dict)
    zero_ok: Sequence[int] = (0,)
    slot_name: Callable[[int], str] = lambda k: f"slot {k}"
    entry_name: Callable[[int], str] = lambda i: f"the stream at {layer_name(i, None)}"
    slot_tally: RowTally = field(default_factory=RowTally)
    entry_tally: RowTally = field(default_factory=RowTally)
    zero_pairs: Dict[tuple, list] = field(default_factory=dict)  # (k, entry): [slot-zero rows where the entry is
    #                                                               not zero, first such (where, position)]
    slot_zero: Dict[int, int] = field(default_factory=dict)

    def add(self, slots: torch.Tensor, stream: torch.Tensor, layers: Sequence[int], where: str = "a batch",
            positions: Optional[torch.Tensor] = None) -> None:
        """slots [T, K*H]; stream [S, T, H] at layer inputs ``layers``; ``where`` names the batch in messages (a
        request or a file), ``positions`` [T] its rows' positions."""
        T = slots.shape[0]
        if slots.shape[1] != self.K * self.H or stream.shape[1] != T or stream.shape[2] != self.H:
            raise ValueError(f"slots {tuple(slots.shape)} / stream {tuple(stream.shape)} do not fit K={self.K}, "
                             f"H={self.H}")
        if self.layers is None:
            self.layers = list(layers)
        elif list(layers) != self.layers:
            raise ValueError(f"stream entries {list(layers)} differ from earlier batches' {self.layers}")
        entries = []
        for j, li in enumerate(layers):
            nf, zero = row_flags(stream[j])
            bad_zero = zero if li not in self.zero_ok else torch.zeros_like(zero)
            self.entry_tally.add(self.entry_name(li), nf, bad_zero, where, positions)
            entries.append((stream[j], ~nf, zero, _unit(stream[j])))
        for k in range(self.K):
            s = slots[:, k * self.H:(k + 1) * self.H]
            s_nf, s_zero = row_flags(s)
            self.slot_tally.add(self.slot_name(k), s_nf, torch.zeros_like(s_zero), where, positions)
            self.slot_zero[k] = self.slot_zero.get(k, 0) + int(s_zero.sum())
            su = _unit(s)
            for li, (ref, r_fin, r_zero, ru) in zip(layers, entries):
                key = (k, li)
                valid = ~s_nf & ~s_zero & r_fin & ~r_zero
                # float32 unit rows: a row's cosine with itself can land a few ulps above 1; NaN where not valid
                c = (su * ru).sum(-1).clamp(-1.0, 1.0)
                self.row_cos.setdefault(key, []).append(torch.where(valid, c, torch.full_like(c, float("nan"))))
                # bit for bit over the rows that carry data (a bad row is counted, not compared)
                same = s.dtype == ref.dtype and bool(valid.any()) and torch.equal(s[valid], ref[valid])
                self.equal[key] = self.equal.get(key, True) and same
                unexplained = s_zero & r_fin & ~r_zero
                zp = self.zero_pairs.setdefault(key, [0, None])
                zp[0] += int(unexplained.sum())
                if zp[1] is None and bool(unexplained.any()):
                    r = int(unexplained.nonzero()[0])
                    zp[1] = f"{where}, {'position' if positions is not None else 'row'} " \
                            f"{int(positions[r]) if positions is not None else r}"

    def matches(self, min_cos: float = DEFAULT_MIN_COS, expected: Optional[Sequence[int]] = None,
                noise_factor: float = NOISE_FACTOR, min_row_wins: float = MIN_ROW_WINS) -> List[SlotMatch]:
        out = []
        for k in range(self.K):
            cos = {li: torch.cat(self.row_cos[(k, li)]) for li in self.layers}
            ok = {li: ~torch.isnan(c) for li, c in cos.items()}
            usable = [li for li in self.layers if bool(ok[li].any())]
            exp = None if expected is None or k >= len(expected) else expected[k]
            if not usable:  # every row of the slot, or of every entry, is bad: nothing to name
                out.append(SlotMatch(k, exp if exp is not None else self.layers[0], float("nan"), None,
                                     float("nan"), False, 0, float("nan"), NO_ROWS, exp))
                continue
            mean = {li: float(cos[li][ok[li]].double().mean()) for li in usable}
            order = sorted(usable, key=lambda li: (-mean[li], li))
            best = order[0]
            second = order[1] if len(order) > 1 else None
            sc = mean[second] if second is not None else float("nan")
            rows = int(ok[best].sum())
            wins = 1.0
            if second is not None:  # row by row, over the rows both entries could be compared on
                both = ok[best] & ok[second]
                wins = float((cos[best][both] > cos[second][both]).double().mean()) if bool(both.any()) else 0.0
            # bit for bit names a layer only when no other entry is also bit-equal: a stream that does not move
            # from one layer to the next (SGLang's dummy weights in bf16) holds the slot at several layer inputs
            twins = [li for li in usable if li != best and self.equal[(k, li)]]
            exact = self.equal[(k, best)] and not twins
            if self.equal[(k, best)] and twins:
                verdict = "ambiguous"  # the twins' cosines equal best's, so `second` (the next in order) is one
            elif exact:
                verdict = "exact"
            elif mean[best] < min_cos:
                verdict = "none"
            elif second is None or (mean[best] - sc > noise_factor * (1.0 - mean[best]) and wins >= min_row_wins):
                verdict = "clear"
            else:
                verdict = "ambiguous"
            out.append(SlotMatch(k, best, mean[best], second, sc, exact, rows, wins, verdict, exp))
        return out

    def bad_rows(self, matches: Sequence[SlotMatch]) -> List[BadRows]:
        """Every slot's and entry's bad rows: non-finite ones, and zero ones (a slot's where the entry it matches is
        not zero there; an entry's past the embedding)."""
        out = []
        for m in matches:
            b = self.slot_tally.items[self.slot_name(m.slot)]
            nz, first = (0, None) if m.verdict == NO_ROWS else self.zero_pairs.get((m.slot, m.best), (0, None))
            if m.verdict == NO_ROWS:  # every zero row counts: nothing explains them
                nz = self.slot_zero.get(m.slot, 0)
            if b.nonfinite or nz:
                out.append(BadRows(b.what, b.nonfinite, nz, b.total, b.first or first or "?"))
        return out + self.entry_tally.bad()

    def entries_usable(self) -> bool:
        """Whether any entry has a usable row (False: nothing to compare the slots with)."""
        return any(b.count < b.total for b in self.entry_tally.items.values())


def render_matches(matches: Sequence[SlotMatch], L: Optional[int], what: str = "slot",
                   name: Optional[Callable[[int], str]] = None) -> List[str]:
    """A table, one row per slot; ``name`` names a stream entry (default: the layer input in words)."""
    name = name or (lambda i: layer_name(i, L))
    lines = [f"{what:>8}  {'holds':<29}  cos       {'next best':<24}  cos       margin    noise     rows  "
             "row wins  verdict"]
    for m in matches:
        nb = "-" if m.second is None else name(m.second)
        exp = "" if m.expected is None else ("" if m.best == m.expected and m.verdict in ("exact", "clear")
                                             else f"   expected {name(m.expected)}")
        holds = name(m.best) if m.verdict not in ("none", NO_ROWS) else f"({m.verdict})"
        lines.append(f"{m.slot:>8}  {holds:<29}  {m.best_cos:.6f}  {nb:<24}  {m.second_cos:.6f}  "
                     f"{m.margin:.2e}  {m.noise:.2e}  {m.rows:>5}  {m.row_wins:>8.3f}  {m.verdict}{exp}")
    return lines


__all__ = ["DEFAULT_MIN_COS", "NOISE_FACTOR", "MIN_ROW_WINS", "NO_ROWS", "layer_name", "SlotMatch", "StreamMatcher",
           "render_matches"]
