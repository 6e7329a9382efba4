"""SGLang 0.5.23's rule for draft ids (sglang_releases/ on that release): what each model family stores and captures,
the errors it raises, the ids that make stock SGLang capture a spec, and the findings for serving a draft with it."""

import pytest
from hypothesis import given, settings, strategies as st

from eagle3_capture import sglang_releases as sr
from eagle3_capture.sglang_releases import (FAMILY_DEEPSEEK_V2, FAMILY_QWEN_MOE, compare_native_capture,
                                            default_layers_to_capture, sglang_family)
from eagle3_capture.spec import LayerOutput, TapSpec
from tap_strategies import H, L61, codes, specs

REL = "0.5.23"  # the release these cases were read in


def layers_to_capture(ids, L, family=FAMILY_DEEPSEEK_V2):
    return sr.layers_to_capture(ids, L, REL, family)


def native_capture(ids, L, H, family=FAMILY_DEEPSEEK_V2):
    return sr.native_capture(ids, L, H, REL, family)


def ids_for(spec, family=FAMILY_DEEPSEEK_V2):
    return sr.ids_for(spec, REL, family)


def check_release(declared, ids, family=FAMILY_DEEPSEEK_V2):
    return sr.check_release(declared, ids, REL, family)


def test_sglang_0523_given_specforge_ids_with_embedding():
    trained = TapSpec.from_draft_ids([-1, 2, 30], L61, H)
    assert layers_to_capture([-1, 2, 30], L61) == [-1, 2, 30]
    nc = native_capture([-1, 2, 30], L61, H)
    assert nc.stored == (-1, 2, 30)
    assert nc.captured_inputs == (2, 30)
    assert nc.captured_taps == (LayerOutput(1), LayerOutput(29))
    assert nc.dropped == (-1,)
    assert nc.declared_count == 3 and nc.captured_features == 2 * H
    assert nc.error == "RuntimeError: captured 2 of 3 aux hidden states"
    f = check_release(trained, [-1, 2, 30])
    c = codes(f)
    for code in ("dropped-tap", "capture-error", "count-mismatch", "missing-embedding", "shifted-tap"):
        assert code in c, (code, c)
    assert all(x.severity == "error" for x in f)
    shifted = [x.message for x in f if x.code == "shifted-tap"]
    assert len(shifted) == 2
    assert "LayerOutput(2)" in shifted[0] and "LayerOutput(1)" in shifted[0] and "-1 layer" in shifted[0]
    assert "LayerOutput(30)" in shifted[1] and "LayerOutput(29)" in shifted[1]
    dropped = next(x for x in f if x.code == "dropped-tap")
    assert "-1" in dropped.message and "never matches" in dropped.message
    # the fix names stock-SGLang ids that would work, and they really do
    assert "[0, 3, 31]" in dropped.fix
    assert ids_for(trained) == [0, 3, 31]
    assert check_release(trained, [0, 3, 31]) == []


def test_sglang_0523_given_specforge_ids_without_embedding():
    trained = TapSpec.from_draft_ids([2, 30, 58], L61, H)
    assert layers_to_capture([2, 30, 58], L61) == [2, 30, 58]
    nc = native_capture([2, 30, 58], L61, H)
    assert nc.captured_inputs == (2, 30, 58) and nc.dropped == () and nc.error is None
    assert nc.captured_taps == (LayerOutput(1), LayerOutput(29), LayerOutput(57))
    f = check_release(trained, [2, 30, 58])
    assert codes(f) == ["shifted-tap"] * 3
    assert f[0].message == ("slot 0 captures LayerOutput(1) but the draft was trained on LayerOutput(2): "
                            "shifted by -1 layer")
    assert ids_for(trained) == [3, 31, 59]
    assert check_release(trained, [3, 31, 59]) == []


def test_sglang_0523_plus_one_only_when_first_id_is_1():
    assert layers_to_capture([1, 29, 57], L61) == [2, 30, 58]
    assert layers_to_capture([1], L61) == [2]
    assert layers_to_capture([0, 29, 57], L61) == [0, 29, 57]
    assert layers_to_capture([2, 1], L61) == [2, 1]
    assert layers_to_capture([], L61) == []
    # ids starting with 1 are the only SpecForge ids served right on DeepseekV2
    trained = TapSpec.from_draft_ids([1, 29, 57], L61, H)
    assert check_release(trained, [1, 29, 57]) == []


def test_sglang_0523_default_ids():
    assert layers_to_capture(None, L61) == [2, 30, 58]
    assert default_layers_to_capture(61) == [2, 30, 58]
    assert layers_to_capture(None, 48, FAMILY_QWEN_MOE) == [2, 24, 45]  # no +1 on the default
    nc = native_capture(None, L61, H)
    assert nc.ids is None and nc.captured_taps == (LayerOutput(1), LayerOutput(29), LayerOutput(57))


@given(st.lists(st.integers(-3, 70), max_size=6), st.integers(1, 80))
def test_sglang_0523_rules_property(ids, L):
    ds = layers_to_capture(ids, L, FAMILY_DEEPSEEK_V2)
    assert ds == ([v + 1 for v in ids] if ids and ids[0] == 1 else ids)
    assert layers_to_capture(ids, L, FAMILY_QWEN_MOE) == [v + 1 for v in ids]
    nc = native_capture(ids, L, 8, FAMILY_DEEPSEEK_V2)
    assert list(nc.captured_inputs) == sorted(set(i for i in ds if 0 <= i < L))
    assert len(nc.captured_inputs) + len(nc.dropped) == len(ds)
    # nothing captured (ids [] included): DeepseekV2Model.forward returns the bare hidden states, which
    # DeepseekV2ForCausalLM.forward then unpacks as a pair
    assert (nc.error is None) == (0 < len(nc.captured_inputs) == len(ds))


def test_sglang_0523_qwen_moe_adds_one_always():
    trained = TapSpec.from_draft_ids([-1, 2, 30], L61, H)
    nc = native_capture([-1, 2, 30], L61, H, FAMILY_QWEN_MOE)
    assert nc.stored == (0, 3, 31) and nc.captured_taps == trained.taps and nc.error is None
    assert check_release(trained, [-1, 2, 30], FAMILY_QWEN_MOE) == []
    assert ids_for(trained, FAMILY_QWEN_MOE) == [-1, 2, 30]
    # a draft id L-1 becomes layers[L]: IndexError at startup
    nc = native_capture([2, 60], L61, H, FAMILY_QWEN_MOE)
    assert nc.error.startswith("IndexError") and nc.captured_inputs == ()
    f = check_release(TapSpec.from_draft_ids([2, 60], L61, H), [2, 60], FAMILY_QWEN_MOE)
    assert "final-boundary-dropped" in codes(f) and "startup-error" in codes(f)
    # a negative stored index wraps around in python indexing: draft id -2 flags the last layer
    nc = native_capture([-2], L61, H, FAMILY_QWEN_MOE)
    assert nc.captured_inputs == (60,) and nc.error is None


def test_sglang_0523_final_boundary_dropped_on_deepseek():
    trained = TapSpec.from_draft_ids([-1, 2, 60], L61, H)
    nc = native_capture([0, 3, 61], L61, H)
    assert nc.dropped == (61,) and nc.captured_inputs == (0, 3)
    f = compare_native_capture(trained, nc)
    assert "final-boundary-dropped" in codes(f)
    msg = next(x for x in f if x.code == "final-boundary-dropped").message
    assert "LayerOutput(60)" in msg and "61" in msg
    with pytest.raises(ValueError, match=r"final boundary LayerOutput\(60\).*no id list"):
        ids_for(trained)


def test_sglang_0523_layer0_first_is_unreachable_on_deepseek():
    spec = TapSpec((LayerOutput(0), LayerOutput(5)), L61, H)
    with pytest.raises(ValueError, match=r"LayerOutput\(0\).*ids\[0\] == 1|LayerOutput\(0\).*starting with 1"):
        ids_for(spec)
    assert ids_for(spec, FAMILY_QWEN_MOE) == [0, 5]


@settings(max_examples=300)
@given(specs(min_layers=2))
def test_sglang_0523_ids_for_reproduces_spec(spec):
    for fam in (FAMILY_DEEPSEEK_V2, FAMILY_QWEN_MOE):
        try:
            ids = ids_for(spec, fam)
        except ValueError as e:
            assert spec.includes_final_boundary or (fam == FAMILY_DEEPSEEK_V2 and spec.taps[0] == LayerOutput(0))
            assert "SGLang 0.5.23" in str(e)
            continue
        nc = native_capture(ids, spec.num_layers, spec.hidden_size, fam)
        assert nc.captured_taps == spec.taps and nc.error is None
        assert compare_native_capture(spec, nc) == []


def test_sglang_0523_family_lookup():
    assert sglang_family("deepseek_v3") == FAMILY_DEEPSEEK_V2
    assert sglang_family("kimi_k25") == FAMILY_DEEPSEEK_V2
    assert sglang_family("qwen3_moe") == FAMILY_QWEN_MOE
    assert sglang_family("llama") is None and sglang_family(None) is None
    with pytest.raises(ValueError, match="family"):
        layers_to_capture([1], 10, "llama")
