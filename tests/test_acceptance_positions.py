"""acceptance/positions.py: per-position attempts and acceptances from a histogram of correct drafts per verify,
against a direct count over simulated verifies, and back (the histogram is recovered exactly)."""
from hypothesis import given, settings, strategies as st

import pytest

from eagle3_capture.acceptance.positions import accept_length, add, attempts_accepted, histogram_of


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 8).flatmap(lambda P: st.tuples(st.just(P), st.lists(st.integers(0, P), max_size=300))))
def test_counts_equal_a_direct_count_over_verifies(case):
    P, verifies = case
    h = [0] * (P + 1)
    for k in verifies:
        h[k] += 1
    att, acc = attempts_accepted(h, P)
    for p in range(1, P + 1):
        assert att[p - 1] == sum(1 for k in verifies if k >= p - 1)   # drafts 1..p-1 accepted: p was verified
        assert acc[p - 1] == sum(1 for k in verifies if k >= p)
    assert histogram_of(len(verifies), acc) == h
    if verifies:
        assert accept_length(h) == pytest.approx(1 + sum(verifies) / len(verifies), rel=1e-12)


def test_short_histograms_pad_and_long_ones_are_refused():
    assert attempts_accepted([5, 3], 3) == ([8, 3, 0], [3, 0, 0])
    with pytest.raises(ValueError, match="more than 2 draft positions"):
        attempts_accepted([1, 1, 1, 1], 2)
    with pytest.raises(ValueError, match="no verifies"):
        accept_length([0, 0])
    assert add([1, 2], [0, 0, 5]) == [1, 2, 5]
