"""eagle3_capture.vllm.declaration: which taps the vLLM plugin captures for a draft config, pure (no vLLM), fuzzed.
tests/vllm_engine/ checks the same reading through vLLM's real config objects and serving loop."""
from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from eagle3_capture import vllm_rules as vr
from eagle3_capture.spec import EMBEDDING, LayerOutput, TapSpec
from eagle3_capture.vllm.declaration import CONVENTION_KEY, DeclarationError, describe, read_declaration

L, H = 4, 128
V1, V2 = vr.RUNNER_V1, vr.RUNNER_V2


def draft(top=None, nested=None, convention=None, **extra):
    cfg = {"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": H, "eagle_config": {}}
    if top is not None:
        cfg["eagle_aux_hidden_state_layer_ids"] = top
    if nested is not None:
        cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = nested
    if convention is not None:
        cfg["eagle_config"]["eagle_aux_hidden_state_convention"] = convention
    cfg.update(extra)
    return cfg


def test_undeclared_top_level_ids_are_vllm_layer_inputs_as_stock_serves_them():
    d = read_declaration(draft(top=[1, 2, 4]), V2, L, H)
    assert d.spec.taps == (LayerOutput(0), LayerOutput(1), LayerOutput(3)) and d.aux_layers == (1, 2, 4)
    assert d.stock == (1, 2, 4) and d.key == vr.KEY_TOP_LEVEL and "stock vLLM stores [1, 2, 4] too" in describe(d)


def test_the_embedding_is_layer_input_zero_served_where_stock_raises():
    d = read_declaration(draft(top=[0, 2, 3]), V1, L, H)
    assert d.spec.taps == (EMBEDDING, LayerOutput(1), LayerOutput(2)) and d.aux_layers == (2, 3)
    assert "the embedding taken before the first layer" in describe(d)


def test_declared_draft_ids_nested_on_v1_top_level_on_both():
    nested = read_declaration(draft(nested=[-1, 1, 2], convention="draft_ids"), V1, L, H)
    top = read_declaration(draft(top=[-1, 1, 2], nested=[-1, 1, 2], convention="draft_ids"), V2, L, H)
    for d in (nested, top):
        assert d.spec.taps == (EMBEDDING, LayerOutput(1), LayerOutput(2)) and d.aux_layers == (2, 3)
    assert nested.key == vr.KEY_NESTED and top.key == vr.KEY_TOP_LEVEL


def test_undeclared_minus_one_is_refused_naming_the_convention_key():
    with pytest.raises(DeclarationError) as e:
        read_declaration(draft(top=[-1, 1, 2]), V2, L, H, "0.32.0")
    msg = str(e.value)
    assert "\n" not in msg and CONVENTION_KEY in msg and "draft_ids" in msg and "vLLM 0.32.0 (model runner v2)" in msg


def test_nested_only_ids_the_runner_ignores_are_refused_with_the_top_level_fix():
    with pytest.raises(DeclarationError, match=r"only in eagle_config.*does not read.*default layer inputs \[2, 2, 1\]"
                       r".*top-level eagle_aux_hidden_state_layer_ids = \[0, 2, 3\]"):
        read_declaration(draft(nested=[-1, 1, 2], convention="draft_ids"), V2, L, H)
    with pytest.raises(DeclarationError, match="move them to the top-level"):
        read_declaration(draft(nested=[1, 2, 3]), V2, L, H)
    # V1 reads the nested key: served, in vLLM's meaning when undeclared
    assert read_declaration(draft(nested=[1, 2, 3]), V1, L, H).aux_layers == (1, 2, 3)


def test_fc_width_and_bad_values_refused():
    with pytest.raises(DeclarationError, match="fc takes 3 taps"):
        read_declaration(draft(top=[1, 2]), V2, L, H)  # vLLM sizes the fc for 3 without nested ids
    assert read_declaration(draft(top=[1, 2], num_aux_hidden_states=2), V2, L, H).spec.K == 2
    with pytest.raises(DeclarationError, match="width 64"):
        read_declaration(draft(top=[1, 2, 3], target_hidden_size=64), V2, L, H)
    with pytest.raises(DeclarationError, match="expected one of"):
        read_declaration(draft(top=[1, 2, 3], convention="layer-inputs"), V2, L, H)
    with pytest.raises(DeclarationError, match="out of range"):
        read_declaration(draft(top=[1, 2, 9]), V2, L, H)


@settings(max_examples=300)
@given(st.lists(st.integers(-2, L + 1), min_size=1, max_size=4),
       st.sampled_from([None, "draft_ids", "layer_inputs", "hf_hidden_states"]),
       st.sampled_from([V1, V2]), st.booleans())
def test_served_or_refused_never_silently_other_taps(ids, convention, runner, nested):
    """Whatever the config says, the plugin either refuses in one line or captures exactly the taps the ids mean in
    their convention (vLLM's layer inputs when undeclared), with vLLM's loop given their layer inputs but 0."""
    cfg = draft(nested=ids, convention=convention, num_aux_hidden_states=len(ids)) if nested else \
        draft(top=ids, convention=convention, num_aux_hidden_states=len(ids))
    try:
        d = read_declaration(cfg, runner, L, H)
    except DeclarationError as e:
        assert "\n" not in str(e)
        return
    conv = convention or "layer_inputs"
    opts = {"allow_final_boundary": True} if conv == "layer_inputs" else {}
    assert d.spec == TapSpec.from_convention(conv, ids, L, H, **opts)
    assert list(d.aux_layers) == [i for i in d.spec.to_layer_inputs(allow_final_boundary=True) if i]
    assert not (nested and runner == V2)
