"""compare_taps: trained taps vs captured taps, slot by slot (missing or unexpected embedding, shifted, missing and
unexpected taps, count mismatch), and the Finding text."""

import pytest

from eagle3_capture.findings import Finding, compare_taps
from eagle3_capture.spec import EMBEDDING, LayerOutput, TapSpec
from tap_strategies import H, L61, codes


def test_compare_identical_is_clean():
    s = TapSpec.from_draft_ids([-1, 2, 30], L61, H)
    assert compare_taps(s, s.taps) == []


def test_compare_unexpected_embedding_and_missing_tap():
    trained = TapSpec.from_draft_ids([2, 30, 58], L61, H)
    f = compare_taps(trained, [EMBEDDING, LayerOutput(2)])
    c = codes(f)
    assert "count-mismatch" in c and "unexpected-embedding" in c and "missing-tap" in c
    assert any("LayerOutput(30)" in x.message for x in f if x.code == "missing-tap")
    f = compare_taps(trained, [LayerOutput(2), LayerOutput(30), LayerOutput(40), LayerOutput(58)])
    assert codes(f) == ["count-mismatch", "unexpected-tap"]
    assert "K=3" in f[0].message and "4 are captured" in f[0].message and "21504" in f[0].message


def test_compare_shift_direction_and_plural():
    trained = TapSpec.from_draft_ids([2, 30], L61, H)
    f = compare_taps(trained, [LayerOutput(5), LayerOutput(30)])
    assert len(f) == 1 and "shifted by +3 layers" in f[0].message and "slot 0" in f[0].message
    assert isinstance(f[0], Finding) and f[0].fix and "[shifted-tap]" not in str(f[0])
    assert str(f[0]).startswith("[error] shifted-tap: ")


def test_compare_rejects_non_taps():
    with pytest.raises(ValueError, match="not a tap"):
        compare_taps(TapSpec.from_draft_ids([2], 10, 4), [2])
