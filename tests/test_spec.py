"""Tap conventions: round trips, the real Kimi-K2.5 case, the final boundary, errors (compare_taps is tested in
test_findings.py, SGLang 0.5.23's own rule in test_sglang_rules.py)."""

import re

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from eagle3_capture.spec import (
    CONV_CANONICAL, CONV_DRAFT_IDS, CONV_HF, CONV_LAYER_INPUTS, CONVENTIONS, DRAFT_IDS, EMBEDDING, HF_HIDDEN_STATES,
    LAYER_INPUTS, Embedding, LayerOutput, TapError, TapSpec, convention_limits,
)
from eagle3_capture.findings import compare_taps
from tap_strategies import H, L61, codes, specs


# ------------------------------------------------------------------------------------------------ taps
def test_tap_order_and_repr():
    assert Embedding() == EMBEDDING
    assert EMBEDDING < LayerOutput(0) < LayerOutput(1) < LayerOutput(30)
    assert sorted([LayerOutput(3), EMBEDDING, LayerOutput(0)]) == [EMBEDDING, LayerOutput(0), LayerOutput(3)]
    assert LayerOutput(2) >= LayerOutput(2) and not LayerOutput(2) > LayerOutput(2)
    assert repr(EMBEDDING) == "Embedding" and repr(LayerOutput(30)) == "LayerOutput(30)"
    assert LayerOutput(4) == LayerOutput(4) and LayerOutput(4) != LayerOutput(5) and LayerOutput(0) != EMBEDDING
    assert len({LayerOutput(1), LayerOutput(1), EMBEDDING}) == 2


@given(st.integers(-1, 500), st.integers(-1, 500))
def test_tap_order_matches_draft_ids(a, b):
    ta = EMBEDDING if a == -1 else LayerOutput(a)
    tb = EMBEDDING if b == -1 else LayerOutput(b)
    assert (ta < tb) == (a < b) and (ta == tb) == (a == b) and (ta >= tb) == (a >= b)


def test_tap_rejects_bad_layer():
    with pytest.raises(ValueError, match=r"LayerOutput\(-1\).*Embedding"):
        LayerOutput(-1)
    with pytest.raises(ValueError, match="not an integer"):
        LayerOutput("3")
    with pytest.raises(ValueError, match="bool"):
        LayerOutput(True)
    with pytest.raises(Exception):
        LayerOutput(3).k = 4  # frozen


# ------------------------------------------------------------------------------------------------ round trips
@settings(max_examples=300)
@given(specs())
def test_round_trip_draft_ids(spec):
    ids = spec.to_draft_ids()
    assert TapSpec.from_draft_ids(ids, spec.num_layers, spec.hidden_size) == spec
    assert ids == sorted(ids) and all(-1 <= d < spec.num_layers for d in ids)


@settings(max_examples=300)
@given(specs())
def test_round_trip_layer_inputs(spec):
    if spec.includes_final_boundary:
        with pytest.raises(ValueError, match="final boundary"):
            spec.to_layer_inputs()
    else:
        idx = spec.to_layer_inputs()
        assert all(0 <= i < spec.num_layers for i in idx)
        assert TapSpec.from_layer_inputs(idx, spec.num_layers, spec.hidden_size) == spec
    idx = spec.to_layer_inputs(allow_final_boundary=True)
    assert TapSpec.from_layer_inputs(idx, spec.num_layers, spec.hidden_size, allow_final_boundary=True) == spec
    # the layer-input index of a tap is its draft id + 1
    assert idx == [d + 1 for d in spec.to_draft_ids()]


@settings(max_examples=300)
@given(specs())
def test_round_trip_hf(spec):
    if spec.includes_final_boundary:
        with pytest.raises(ValueError, match="final_is_prenorm"):
            spec.to_hf_hidden_states()
    else:
        h = spec.to_hf_hidden_states()
        assert TapSpec.from_hf_hidden_states(h, spec.num_layers, spec.hidden_size) == spec
    h = spec.to_hf_hidden_states(final_is_prenorm=True)
    assert TapSpec.from_hf_hidden_states(h, spec.num_layers, spec.hidden_size, final_is_prenorm=True) == spec


@settings(max_examples=200)
@given(specs(), st.sampled_from(sorted(CONVENTIONS)))
def test_round_trip_by_key_and_limits(spec, key):
    lim = convention_limits(spec)[key]
    assert lim.ok == (key == DRAFT_IDS or not spec.includes_final_boundary)
    if lim.ok:
        assert TapSpec.from_convention(key, list(lim.indices), spec.num_layers, spec.hidden_size) == spec
        assert list(lim.indices) == spec.to_convention(key)
    else:
        assert "final" in lim.reason and lim.convention in lim.reason


@settings(max_examples=200)
@given(specs())
def test_describe_lists_every_convention(spec):
    line = spec.describe()
    assert "\n" not in line
    assert f"draft ids {spec.to_draft_ids()}" in line
    assert f"taps {list(spec.taps)}" in line
    if spec.includes_final_boundary:
        assert "layer inputs n/a (final boundary)" in line and "HF hidden_states n/a (final boundary)" in line
    else:
        assert f"layer inputs {spec.to_layer_inputs()}" in line
        assert f"HF hidden_states {spec.to_hf_hidden_states()}" in line


@given(specs())
def test_shape_properties(spec):
    assert spec.K == len(spec.taps)
    assert spec.fc_in_features == spec.K * spec.hidden_size
    spec.check_fc_in_features(spec.K * spec.hidden_size)
    with pytest.raises(ValueError):
        spec.check_fc_in_features(spec.K * spec.hidden_size + 1)
    assert spec.includes_embedding == (EMBEDDING in spec.taps)
    assert spec.includes_final_boundary == (LayerOutput(spec.num_layers - 1) in spec.taps)


# ------------------------------------------------------------------------------------------------ the real case
def test_kimi_k25_training_taps_in_every_convention():
    trained = TapSpec((EMBEDDING, LayerOutput(2), LayerOutput(30)), L61, H)
    assert TapSpec.from_hf_hidden_states([0, 3, 31], L61, H) == trained
    assert TapSpec.from_draft_ids([-1, 2, 30], L61, H) == trained
    assert TapSpec.from_layer_inputs([0, 3, 31], L61, H) == trained
    assert trained.to_draft_ids() == [-1, 2, 30]
    assert trained.to_layer_inputs() == [0, 3, 31]
    assert trained.to_hf_hidden_states() == [0, 3, 31]
    assert trained.K == 3 and trained.fc_in_features == 21504
    assert trained.includes_embedding and not trained.includes_final_boundary
    assert trained.describe().startswith(
        "taps [Embedding, LayerOutput(2), LayerOutput(30)] | draft ids [-1, 2, 30] | layer inputs [0, 3, 31] | "
        "HF hidden_states [0, 3, 31]")
    # what the server captured in the incident: layer inputs [3, 31, 59], no embedding
    served = TapSpec.from_layer_inputs([3, 31, 59], L61, H)
    assert served.taps == (LayerOutput(2), LayerOutput(30), LayerOutput(58))
    f = compare_taps(trained, served.taps)
    assert "missing-embedding" in codes(f) and "count-mismatch" not in codes(f)


# ------------------------------------------------------------------------------------------------ final boundary
def test_final_boundary():
    s = TapSpec((EMBEDDING, LayerOutput(2), LayerOutput(60)), L61, H)  # valid
    assert s.includes_final_boundary and s.final_boundary == LayerOutput(60)
    assert s.to_draft_ids() == [-1, 2, 60]
    with pytest.raises(ValueError) as e:
        s.to_layer_inputs()
    assert "LayerOutput(60)" in str(e.value) and "61" in str(e.value) and CONV_LAYER_INPUTS in str(e.value)
    assert "allow_final_boundary" in str(e.value) and "silently" in str(e.value)
    assert s.to_layer_inputs(allow_final_boundary=True) == [0, 3, 61]
    with pytest.raises(ValueError) as e:
        TapSpec.from_layer_inputs([0, 3, 61], L61, H)
    assert "layer-input index 61" in str(e.value) and CONV_LAYER_INPUTS in str(e.value)
    assert TapSpec.from_layer_inputs([0, 3, 61], L61, H, allow_final_boundary=True) == s
    with pytest.raises(ValueError) as e:
        TapSpec.from_hf_hidden_states([0, 3, 61], L61, H)
    assert "HF hidden_states index 61" in str(e.value) and "final_is_prenorm" in str(e.value)
    assert "after the final norm".lower() in str(e.value).lower() and CONV_HF in str(e.value)
    with pytest.raises(ValueError, match="final_is_prenorm"):
        s.to_hf_hidden_states()
    assert s.to_hf_hidden_states(final_is_prenorm=True) == [0, 3, 61]
    assert TapSpec.from_hf_hidden_states([0, 3, 61], L61, H, final_is_prenorm=True) == s
    lim = convention_limits(s)
    assert lim[DRAFT_IDS].ok and not lim[LAYER_INPUTS].ok and not lim[HF_HIDDEN_STATES].ok
    assert lim[LAYER_INPUTS].indices is None


def test_final_boundary_l1():
    s = TapSpec((EMBEDDING, LayerOutput(0)), 1, 4)
    assert s.includes_final_boundary
    assert s.to_layer_inputs(allow_final_boundary=True) == [0, 1]


# ------------------------------------------------------------------------------------------------ errors
def _raises(fn, *patterns):
    with pytest.raises(ValueError) as e:
        fn()
    msg = str(e.value)
    for p in patterns:
        assert re.search(p, msg), (p, msg)
    return msg


@pytest.mark.parametrize("conv, fn_name", [(CONV_DRAFT_IDS, "from_draft_ids"), (CONV_LAYER_INPUTS, "from_layer_inputs"),
                                           (CONV_HF, "from_hf_hidden_states")])
def test_duplicate_and_unsorted_have_distinct_messages(conv, fn_name):
    fn = getattr(TapSpec, fn_name)
    dup = _raises(lambda: fn([3, 3], L61, H), r"duplicate .* 3\b", re.escape(conv))
    uns = _raises(lambda: fn([31, 3], L61, H), r"31 .*comes before .* 3\b", "increasing", re.escape(conv))
    assert "duplicate" not in uns and "increasing" not in dup
    _raises(lambda: fn([], L61, H), "no .* given", re.escape(conv))
    _raises(lambda: fn(None, L61, H), "sequence", re.escape(conv))
    _raises(lambda: fn([1.5], L61, H), "not an integer", re.escape(conv))
    _raises(lambda: fn([True], L61, H), "bool", re.escape(conv))


def test_out_of_range_messages():
    _raises(lambda: TapSpec.from_layer_inputs([0, 3, 62], L61, H),
            re.escape("layer-input index 62 is out of range for a 61-layer model (valid 0..60"),
            re.escape(CONV_LAYER_INPUTS))
    _raises(lambda: TapSpec.from_layer_inputs([-1, 3], L61, H), "layer-input index -1", "never matches",
            re.escape(CONV_LAYER_INPUTS))
    _raises(lambda: TapSpec.from_draft_ids([-2, 3], L61, H), "draft id -2 is out of range", r"-1\.\.60",
            re.escape(CONV_DRAFT_IDS))
    _raises(lambda: TapSpec.from_draft_ids([2, 61], L61, H), "draft id 61 is out of range", "output of layer",
            re.escape(CONV_DRAFT_IDS))
    _raises(lambda: TapSpec.from_hf_hidden_states([0, 62], L61, H), "HF hidden_states index 62 is out of range",
            re.escape(CONV_HF))
    _raises(lambda: TapSpec.from_hf_hidden_states([-1], L61, H), "negative HF hidden_states index -1",
            "wrap-around", re.escape(CONV_HF))
    _raises(lambda: TapSpec((EMBEDDING, LayerOutput(61)), L61, H), r"LayerOutput\(61\) is out of range",
            re.escape(CONV_CANONICAL))


def test_canonical_errors():
    _raises(lambda: TapSpec((), L61, H), "at least one tap", re.escape(CONV_CANONICAL))
    _raises(lambda: TapSpec((LayerOutput(3), LayerOutput(3)), L61, H), r"duplicate LayerOutput\(3\)")
    _raises(lambda: TapSpec((LayerOutput(3), EMBEDDING), L61, H), r"LayerOutput\(3\).*comes before Embedding",
            "increasing")
    _raises(lambda: TapSpec((EMBEDDING, 3), L61, H), "3 is not a tap")
    _raises(lambda: TapSpec(EMBEDDING, L61, H), "sequence")
    _raises(lambda: TapSpec((EMBEDDING,), 0, H), "num_layers must be >= 1")
    _raises(lambda: TapSpec((EMBEDDING,), L61, 0), "hidden_size must be >= 1")
    _raises(lambda: TapSpec.from_convention("nope", [1], L61, H), "unknown tap convention 'nope'")
    assert TapSpec([EMBEDDING], 1, 1).taps == (EMBEDDING,)  # list accepted, stored as tuple


def test_fc_in_features_mismatch():
    s = TapSpec.from_draft_ids([-1, 2, 30], L61, H)
    s.check_fc_in_features(21504)
    msg = _raises(lambda: s.check_fc_in_features(14336), "K=3", "H=7168", "21504", "14336", "K=2",
                  re.escape(CONV_CANONICAL))
    assert "Embedding" in msg
    _raises(lambda: s.check_fc_in_features(21505), "21505", "not a multiple of H=7168")
    assert issubclass(TapError, ValueError)


@pytest.mark.parametrize("ids", [{-1: "a", 2: "b", 30: "c"}, {-1, 2, 30}, (i for i in (-1, 2, 30)), "-1,2,30",
                                 b"\x01", None, 3, torch.tensor([[-1, 2, 30]]), iter([-1, 2, 30])])
@pytest.mark.parametrize("key", [DRAFT_IDS, LAYER_INPUTS, HF_HIDDEN_STATES])
def test_from_convention_takes_only_an_ordered_sequence_of_ints(key, ids):
    """A dict (its keys would be the taps), a set (no order), a generator or iterator, a string, a 2-D tensor: a
    TapError saying a sequence is expected; the slot order is the sequence's."""
    with pytest.raises(TapError, match="expected a sequence of"):
        TapSpec.from_convention(key, ids, 61, 7168)


def test_from_convention_sequences_it_takes():
    want = TapSpec.from_draft_ids([-1, 2, 30], 61, 7168)
    for ids in ([-1, 2, 30], (-1, 2, 30), torch.tensor([-1, 2, 30]), np.array([-1, 2, 30])):
        assert TapSpec.from_convention(DRAFT_IDS, ids, 61, 7168) == want
    assert TapSpec.from_convention(LAYER_INPUTS, range(1, 4), 61, 7168).K == 3
