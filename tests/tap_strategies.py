"""Shared by the tap tests (test_spec.py, test_sglang_rules.py): a Hypothesis strategy for valid tap specs, the
Kimi-K2.5 target's sizes, and a findings-to-codes helper."""
from hypothesis import strategies as st

from eagle3_capture.spec import EMBEDDING, LayerOutput, TapSpec

# The Kimi-K2.5 target (DeepseekV2 architecture): 61 decoder layers of width 7168.
L61, H = 61, 7168


@st.composite
def specs(draw, min_layers=1, max_layers=128):
    L = draw(st.integers(min_layers, max_layers))
    hidden = draw(st.integers(1, 16384))
    keys = draw(st.sets(st.integers(-1, L - 1), min_size=1, max_size=min(L + 1, 8)))
    taps = tuple(EMBEDDING if k == -1 else LayerOutput(k) for k in sorted(keys))
    return TapSpec(taps, L, hidden)


def codes(findings):
    return [f.code for f in findings]
