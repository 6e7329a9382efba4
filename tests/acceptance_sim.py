"""Simulated verifies for the acceptance tests (test-only): the correct drafts of one verify whose draft at
position p is accepted with probability rates[p-1], given the earlier ones were."""
from __future__ import annotations

from typing import Sequence


def simulated_verify(rates: Sequence[float], rnd) -> int:
    k = 0
    for r in rates:
        if rnd.random() >= r:
            break
        k += 1
    return k
