"""Which layer a slot holds, told by the residual stream itself: no reference model.

A *slot* is one H-wide column group of something captured for some tokens (the served ``aux``, or a SpecForge
sample's ``aux_hidden_state``); the *stream* is the residual stream of the same tokens at several layer inputs
(the server's full-stream dump: 0 = embedding, i = input of layer i, L = final boundary). Per slot and stream entry
the mean cosine over the rows, the per-row cosines and whether the two are equal bit for bit.

Honest at depth: in a deep model neighbouring layers' streams are nearly parallel, so a best match means little
unless it beats the next best by more than two captures of the *same* tap differ. That noise is measured where
the pair is known (``1 - cos`` of the best match, if the best is the same tap: the best cannot be closer to the
slot than the slot's own tap's other capture is); a match is

* ``exact``: equal bit for bit (the same capture, e.g. a served slot and the stream of the same forward);
* ``clear``: margin (best - next best) larger than ``NOISE_FACTOR`` x that noise, and the best wins on at least
  ``MIN_ROW_WINS`` of the rows one by one;
* ``ambiguous``: otherwise -- the report says so instead of naming a layer;
* ``none``: best cosine below ``min_cos``: the slot is no layer of this stream.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence

import torch

DEFAULT_MIN_COS = 0.95
NOISE_FACTOR = 2.0
MIN_ROW_WINS = 0.9


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
        return {"slot": self.slot, "holds": None if self.verdict in ("none", "ambiguous") else self.best,
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
    every batch must carry the same entries."""

    K: int
    H: int
    layers: Optional[List[int]] = None
    row_cos: Dict[tuple, List[torch.Tensor]] = field(default_factory=dict)
    equal: Dict[tuple, bool] = field(default_factory=dict)

    def add(self, slots: torch.Tensor, stream: torch.Tensor, layers: Sequence[int]) -> None:
        """slots [T, K*H]; stream [S, T, H] at layer inputs ``layers``."""
        T = slots.shape[0]
        if slots.shape[1] != self.K * self.H or stream.shape[1] != T or stream.shape[2] != self.H:
            raise ValueError(f"slots {tuple(slots.shape)} / stream {tuple(stream.shape)} do not fit K={self.K}, "
                             f"H={self.H}")
        if self.layers is None:
            self.layers = list(layers)
        elif list(layers) != self.layers:
            raise ValueError(f"stream entries {list(layers)} differ from earlier batches' {self.layers}")
        for k in range(self.K):
            s = slots[:, k * self.H:(k + 1) * self.H]
            su = _unit(s)
            for j, li in enumerate(layers):
                ref = stream[j]
                key = (k, li)
                # float32 unit rows: a row's cosine with itself can land a few ulps above 1
                self.row_cos.setdefault(key, []).append((su * _unit(ref)).sum(-1).clamp(-1.0, 1.0))
                same = s.dtype == ref.dtype and torch.equal(s, ref)
                self.equal[key] = self.equal.get(key, True) and same

    def matches(self, min_cos: float = DEFAULT_MIN_COS, expected: Optional[Sequence[int]] = None,
                noise_factor: float = NOISE_FACTOR, min_row_wins: float = MIN_ROW_WINS) -> List[SlotMatch]:
        out = []
        for k in range(self.K):
            cos = {li: torch.cat(self.row_cos[(k, li)]) for li in self.layers}
            mean = {li: float(c.double().mean()) for li, c in cos.items()}
            order = sorted(self.layers, key=lambda li: (-mean[li], li))
            best = order[0]
            second = order[1] if len(order) > 1 else None
            sc = mean[second] if second is not None else float("nan")
            rows = int(cos[best].numel())
            wins = float((cos[best] > cos[second]).double().mean()) if second is not None else 1.0
            exact = self.equal[(k, best)]
            if exact:
                verdict = "exact"
            elif mean[best] < min_cos:
                verdict = "none"
            elif second is None or (mean[best] - sc > noise_factor * (1.0 - mean[best]) and wins >= min_row_wins):
                verdict = "clear"
            else:
                verdict = "ambiguous"
            exp = None if expected is None or k >= len(expected) else expected[k]
            out.append(SlotMatch(k, best, mean[best], second, sc, exact, rows, wins, verdict, exp))
        return out


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
        holds = name(m.best) if m.verdict != "none" else "(none)"
        lines.append(f"{m.slot:>8}  {holds:<29}  {m.best_cos:.6f}  {nb:<24}  {m.second_cos:.6f}  "
                     f"{m.margin:.2e}  {m.noise:.2e}  {m.rows:>5}  {m.row_wins:>8.3f}  {m.verdict}{exp}")
    return lines


__all__ = ["DEFAULT_MIN_COS", "NOISE_FACTOR", "MIN_ROW_WINS", "layer_name", "SlotMatch", "StreamMatcher",
           "render_matches"]
