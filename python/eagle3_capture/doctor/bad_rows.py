"""Rows of hidden states that hold no information: a NaN or an Inf anywhere in the row, or the row all zero. Every
doctor command that reads hidden states (a dump's served slots and residual stream, a reference, SpecForge training
data, the taps a replay feeds the draft) finds them here, leaves them out of every cosine, match and prediction,
counts them and says where they are -- and blames the data, never the taps, the draft or the flags: a NaN row says
nothing about which layer was captured.

How a command ends on them (docs/doctor.md, "Bad rows"): rows left out while others remain to judge on are an error
finding of their own (exit 1: the data the deployment or the pipeline produced is broken and must be fixed whatever
the verdict on the rest); an input with no usable row at all (every row of a reference, of the server's stream, of
the training data, every prompt of a replay) leaves nothing to judge: bad input, exit 2, one line.

An all-zero row is not always broken: a token's embedding may be zero (a padding row), so at the embedding output
(layer input 0) a zero row is data, and a captured slot's zero row is explained where the row it is compared with is
zero too. Past the embedding a residual-stream row is never exactly zero.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import torch

BLAME = ("bad data, left out of every figure: such rows say nothing about the taps, the draft or the flags; find "
         "where they became NaN, Inf or zero (an overflow in the served dtype, a buffer never written, a broken "
         "file)")


def row_flags(x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """(non-finite [...], all-zero [...]) per row of x [..., H]: a row holding a NaN or Inf, a finite row of zeros.
    Reduced in float64, one row block at a time in the caller's dtype (no float64 copy of x)."""
    norm = torch.linalg.vector_norm(x, dim=-1, dtype=torch.float64)
    finite = torch.isfinite(norm)
    if not bool(finite.all()):  # the norm of a finite row can overflow only past float64's range: check the values
        finite = torch.isfinite(x).all(-1)
    return ~finite, finite & (norm == 0)


@dataclass
class BadRows:
    """Rows of one thing (``what``: "served slot 1", "the stream at LayerOutput(3)", "training slot 0") that are
    not usable, out of ``total``; ``first``: where the first one is (a file or request and a row or position)."""

    what: str
    nonfinite: int
    zero: int
    total: int
    first: str

    @property
    def count(self) -> int:
        return self.nonfinite + self.zero

    def line(self) -> str:
        kinds = [f"{self.nonfinite} hold NaN or Inf" if self.nonfinite else "",
                 f"{self.zero} are all zero" if self.zero else ""]
        return (f"{self.what}: {self.count} of {self.total} rows are bad ({' and '.join(k for k in kinds if k)}; "
                f"first: {self.first})")

    def to_json(self) -> dict:
        return {"what": self.what, "nonfinite": self.nonfinite, "zero": self.zero, "total": self.total,
                "first": self.first}


class RowTally:
    """Bad rows of several things, added batch by batch (``add``), each thing named once."""

    def __init__(self):
        self.items: dict = {}

    def add(self, what: str, bad_nonfinite: torch.Tensor, bad_zero: torch.Tensor, where: str,
            positions: Optional[torch.Tensor] = None) -> None:
        """Rows of one batch: masks [T]; ``where`` names the batch (a file, a request); ``positions`` [T] the rows'
        positions (default: their index)."""
        nf, z = int(bad_nonfinite.sum()), int(bad_zero.sum())
        b = self.items.setdefault(what, BadRows(what, 0, 0, 0, ""))
        b.total += int(bad_nonfinite.numel())
        if (nf or z) and not b.first:
            r = int((bad_nonfinite | bad_zero).nonzero()[0])
            p = int(positions[r]) if positions is not None else r
            b.first = f"{where}, {'position' if positions is not None else 'row'} {p}"
        b.nonfinite += nf
        b.zero += z

    def bad(self) -> List[BadRows]:
        return [b for b in self.items.values() if b.count]


def grouped(bad: Sequence[BadRows]) -> List[BadRows]:
    """Things whose bad rows are the same rows (the same counts, the same first one: e.g. one broken forward seen at
    every layer of the stream) as one entry naming them all."""
    groups: dict = {}
    for b in bad:
        groups.setdefault((b.nonfinite, b.zero, b.total, b.first), []).append(b.what)
    out = []
    for (nf, z, total, first), names in groups.items():
        what = names[0] if len(names) == 1 else (", ".join(names[:2]) + (f" and {len(names) - 2} more"
                                                                          if len(names) > 2 else ""))
        out.append(BadRows(what, nf, z, total, first))
    return out


def summary(bad: Sequence[BadRows], limit: int = 2) -> str:
    """One line for a verdict: the bad things (up to ``limit``, rows shared by several named once)."""
    g = grouped(bad)
    return "; ".join(b.line() for b in g[:limit]) + (f"; and {len(g) - limit} more" if len(g) > limit else "")


__all__ = ["BLAME", "row_flags", "BadRows", "RowTally", "grouped", "summary"]
