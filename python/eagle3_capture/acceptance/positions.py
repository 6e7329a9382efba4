"""Per draft position, from a histogram of correct drafts per verify (SGLang's ``spec_correct_drafts_histogram``:
h[k] = verifies that accepted exactly k drafts): how many verifies reached the position and how many accepted it.

Position p (1 = the first draft token) is reached when drafts 1..p-1 were accepted, and accepted when drafts 1..p
were: attempts(p) = sum(h[p-1:]), accepted(p) = sum(h[p:]). For a tree (eagle-topk > 1) the position is the depth
of the accepted path, and the same holds. The histogram is recovered exactly: h[k] = accepted(k) - accepted(k+1)
for k >= 1, h[0] = verifies - accepted(1).
"""
from __future__ import annotations

from typing import List, Sequence, Tuple


def attempts_accepted(histogram: Sequence[int], positions: int) -> Tuple[List[int], List[int]]:
    """(attempts, accepted) per position 1..`positions` (a histogram longer than positions + 1 is an error)."""
    h = list(histogram)
    if len(h) > positions + 1:
        raise ValueError(f"a histogram of {len(h)} bins (0..{len(h) - 1} correct drafts) has more than "
                         f"{positions} draft positions")
    h += [0] * (positions + 1 - len(h))
    attempts = [sum(h[p - 1:]) for p in range(1, positions + 1)]
    accepted = [sum(h[p:]) for p in range(1, positions + 1)]
    return attempts, accepted


def histogram_of(verifies: int, accepted: Sequence[int]) -> List[int]:
    """The histogram back from the verify count and accepted(p), p = 1..P (P + 1 bins)."""
    acc = list(accepted) + [0]
    return [verifies - acc[0]] + [acc[k - 1] - acc[k] for k in range(1, len(acc))]


def accept_length(histogram: Sequence[int]) -> float:
    """Tokens per verify (the accepted drafts plus the verified token), SGLang's spec_accept_length."""
    n = sum(histogram)
    if n <= 0:
        raise ValueError("no verifies in the histogram")
    return 1.0 + sum(k * c for k, c in enumerate(histogram)) / n


def add(a: Sequence[int], b: Sequence[int]) -> List[int]:
    """Bin-wise sum of two histograms of any lengths."""
    n = max(len(a), len(b))
    return [(a[i] if i < len(a) else 0) + (b[i] if i < len(b) else 0) for i in range(n)]


__all__ = ["attempts_accepted", "histogram_of", "accept_length", "add"]
