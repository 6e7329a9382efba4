"""Reading target/draft configs as SGLang 0.5.23 reads them, and deriving the trained taps."""

import json
import os
from pathlib import Path

import pytest

from eagle3_capture.configs import (
    SRC_DEFAULT, SRC_EAGLE_CONFIG, SRC_TOP_LEVEL, DraftConfig, check_sglang_serving, draft_taps,
    read_draft_config, read_target_config, target_ids,
)
from eagle3_capture.sglang_releases import FAMILY_DEEPSEEK_V2, FAMILY_QWEN_MOE
from eagle3_capture.spec import CONV_DRAFT_IDS, CONV_HF, EMBEDDING, LayerOutput, TapSpec

DATA = Path(__file__).parent / "data" / "configs"
TRAINED = (EMBEDDING, LayerOutput(2), LayerOutput(30))


def codes(findings):
    return [f.code for f in findings]


# ------------------------------------------------------------------------------------------------ targets
def test_target_deepseek_v3():
    t = read_target_config(DATA / "target_deepseek_v3_61.json")
    assert (t.num_layers, t.hidden_size, t.model_type) == (61, 7168, "deepseek_v3")
    assert t.architectures == ("DeepseekV3ForCausalLM",)
    assert t.source_path == str(DATA / "target_deepseek_v3_61.json")
    assert t.text_config_key is None and t.sglang_family == FAMILY_DEEPSEEK_V2


def test_target_kimi_k25_nested_text_config_from_directory():
    t = read_target_config(str(DATA / "target_kimi_k25"))  # a directory holding config.json
    assert (t.num_layers, t.hidden_size) == (61, 7168)  # not the vision tower's 27 x 1152
    assert t.text_config_key == "text_config"
    assert t.model_type == "deepseek_v3" and t.top_model_type == "kimi_k25"
    assert t.architectures == ("KimiK25ForConditionalGeneration",)
    assert t.source_path.endswith(os.path.join("target_kimi_k25", "config.json"))
    assert t.sglang_family == FAMILY_DEEPSEEK_V2


def test_target_from_dict_and_sub_config_priority():
    t = read_target_config({"model_type": "x", "num_hidden_layers": 4, "hidden_size": 8})
    assert (t.num_layers, t.hidden_size, t.source_path) == (4, 8, None) and t.sglang_family is None
    # nested wins over top level, as in SGLang's get_hf_text_config; thinker_config > text_config
    t = read_target_config({"num_hidden_layers": 4, "hidden_size": 8,
                            "text_config": {"num_hidden_layers": 10, "hidden_size": 16}})
    assert (t.num_layers, t.hidden_size) == (10, 16)
    t = read_target_config({"thinker_config": {"text_config": {"num_hidden_layers": 3, "hidden_size": 2}},
                            "text_config": {"num_hidden_layers": 10, "hidden_size": 16}})
    assert (t.num_layers, t.hidden_size, t.text_config_key) == (3, 2, "thinker_config.text_config")


def test_target_errors_name_file_and_key():
    p = DATA / "target_missing_layers.json"
    with pytest.raises(ValueError, match=r"target_missing_layers\.json: missing 'num_hidden_layers'"):
        read_target_config(p)
    with pytest.raises(ValueError, match=r"target_nested_missing_layers\.json.*text_config\.num_hidden_layers"):
        read_target_config(DATA / "target_nested_missing_layers.json")
    with pytest.raises(ValueError, match=r"target_malformed\.json: malformed JSON"):
        read_target_config(DATA / "target_malformed.json")
    with pytest.raises(FileNotFoundError, match=r"nope\.json"):
        read_target_config(DATA / "nope.json")
    with pytest.raises(FileNotFoundError, match=r"data.configs.config\.json"):
        read_target_config(DATA)  # a directory without config.json
    with pytest.raises(ValueError, match=r"'hidden_size' must be an integer"):
        read_target_config({"num_hidden_layers": 4, "hidden_size": "8"})
    with pytest.raises(ValueError, match=r"'num_hidden_layers' must be >= 1"):
        read_target_config({"num_hidden_layers": 0, "hidden_size": 8})


def test_target_top_level_not_object(tmp_path):
    p = tmp_path / "config.json"
    p.write_text("[1, 2]")
    with pytest.raises(ValueError, match="JSON object"):
        read_target_config(tmp_path)


# ------------------------------------------------------------------------------------------------ drafts
def test_draft_ids_in_eagle_config():
    d = read_draft_config(DATA / "draft_eagle_config_ids.json")
    assert d.layer_ids == [-1, 2, 30] and d.layer_ids_source == SRC_EAGLE_CONFIG
    assert target_ids(d, "0.5.23") == [-1, 2, 30]
    assert d.convention == "draft_ids"
    assert (d.hidden_size, d.target_hidden_size, d.num_hidden_layers) == (7168, 7168, 1)
    assert d.fc_norm is True and d.norm_before_fc is False
    assert d.architectures == ("Eagle3DeepseekV2ForCausalLM",)
    assert d.fc_in_features == 3 * 7168 and d.K == 3
    assert d.warnings == ()


def test_draft_ids_top_level_are_not_seen_by_sglang_target():
    d = read_draft_config(DATA / "draft_top_level_ids.json")
    assert d.layer_ids == [2, 30, 58] and d.layer_ids_source == SRC_TOP_LEVEL
    assert target_ids(d, "0.5.23") is None
    assert d.target_hidden_size is None and d.fc_in_features == 3 * 7168  # width falls back to hidden_size
    assert any("top level" in w and "default" in w for w in d.warnings)
    t = read_target_config(DATA / "target_deepseek_v3_61.json")
    assert draft_taps(d, t).taps == (LayerOutput(2), LayerOutput(30), LayerOutput(58))
    # the server captures its default [2, 30, 58] layer inputs = outputs 1, 29, 57: shifted by one
    f = check_sglang_serving(d, t, "0.5.23")
    assert codes(f) == ["config"] + ["shifted-tap"] * 3


def test_draft_ids_absent_uses_sglang_default():
    d = read_draft_config(DATA / "draft_no_ids.json")
    assert d.layer_ids is None and d.layer_ids_source == SRC_DEFAULT and target_ids(d, "0.5.23") is None
    assert d.fc_in_features == 3 * 7168
    t = read_target_config(DATA / "target_deepseek_v3_61.json")
    spec = draft_taps(d, t)
    assert spec.to_layer_inputs() == [2, 30, 58]
    assert spec.taps == (LayerOutput(1), LayerOutput(29), LayerOutput(57))
    assert check_sglang_serving(d, t, "0.5.23") == []


def test_draft_explicit_conventions():
    t = read_target_config(DATA / "target_kimi_k25")
    li = read_draft_config(DATA / "draft_layer_inputs_convention.json")
    assert li.convention == "layer_inputs" and li.layer_ids == [0, 3, 31]
    assert draft_taps(li, t).taps == TRAINED
    hf = read_draft_config(DATA / "draft_hf_convention.json")
    assert hf.convention == "hf_hidden_states"
    assert draft_taps(hf, t).taps == TRAINED
    # read as draft ids (the default), the same integers would mean other taps
    as_ids = DraftConfig(**{**li.__dict__, "convention": "draft_ids"})
    assert draft_taps(as_ids, t).taps == (LayerOutput(0), LayerOutput(3), LayerOutput(31))


def test_draft_layer_inputs_may_name_final_boundary_hf_may_not():
    t = read_target_config(DATA / "target_deepseek_v3_61.json")
    base = {"hidden_size": 7168, "eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 3, 61]}}
    li = read_draft_config({**base, "eagle_config": {**base["eagle_config"],
                                                    "eagle_aux_hidden_state_convention": "layer_inputs"}})
    assert draft_taps(li, t).taps[-1] == LayerOutput(60)
    hf = read_draft_config({**base, "eagle_config": {**base["eagle_config"],
                                                    "eagle_aux_hidden_state_convention": "hf_hidden_states"}})
    with pytest.raises(ValueError) as e:
        draft_taps(hf, t)
    assert "HF hidden_states index 61" in str(e.value) and CONV_HF in str(e.value) and "<dict>" in str(e.value)
    assert draft_taps(hf, t, final_is_prenorm=True).taps[-1] == LayerOutput(60)


def test_draft_legacy_use_aux_norm_and_norm_before_fc():
    d = read_draft_config(DATA / "draft_use_aux_norm.json")
    assert d.fc_norm is True and d.norm_before_fc is True
    assert d.hidden_size == 4096 and d.target_hidden_size == 7168 and d.fc_in_features == 3 * 7168
    t = read_target_config(DATA / "target_kimi_k25")
    assert draft_taps(d, t).taps == (LayerOutput(1), LayerOutput(29), LayerOutput(57))
    assert check_sglang_serving(d, t, "0.5.23") == []  # ids starting with 1 get SGLang's +1: served right


def test_kimi_k25_incident_from_configs():
    d = read_draft_config(DATA / "draft_eagle_config_ids.json")
    t = read_target_config(DATA / "target_kimi_k25")
    spec = draft_taps(d, t)
    assert spec == TapSpec(TRAINED, 61, 7168)
    f = check_sglang_serving(d, t, "0.5.23")
    for code in ("dropped-tap", "capture-error", "count-mismatch", "missing-embedding", "shifted-tap"):
        assert code in codes(f)
    # the same draft on a Qwen MoE-style target (+1 always) would be served right
    q = read_target_config({"model_type": "qwen3_moe", "num_hidden_layers": 61, "hidden_size": 7168})
    assert q.sglang_family == FAMILY_QWEN_MOE
    assert check_sglang_serving(d, q, "0.5.23") == []


def test_draft_hidden_size_mismatch_with_target():
    d = read_draft_config(DATA / "draft_use_aux_norm.json")  # target_hidden_size 7168
    t = read_target_config(DATA / "target_qwen3_moe_48.json")  # H = 2048
    with pytest.raises(ValueError, match=r"target_hidden_size is 7168 .*target_qwen3_moe_48\.json.*2048"):
        draft_taps(d, t)


def test_draft_out_of_range_ids_name_file_and_convention():
    d = read_draft_config(DATA / "draft_eagle_config_ids.json")
    t = read_target_config({"num_hidden_layers": 30, "hidden_size": 7168})
    with pytest.raises(ValueError) as e:
        draft_taps(d, t)
    msg = str(e.value)
    assert "draft_eagle_config_ids.json" in msg and "draft id 30 is out of range for a 30-layer model" in msg
    assert CONV_DRAFT_IDS in msg and SRC_EAGLE_CONFIG in msg


def test_draft_num_aux_mismatch_fails_fc_check():
    d = read_draft_config({"hidden_size": 8, "num_aux_hidden_states": 2,
                           "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 2, 3]}})
    assert d.K == 2 and d.fc_in_features == 16 and any("num_aux_hidden_states" in w for w in d.warnings)
    with pytest.raises(ValueError, match=r"fc.in_features is 16 .*K=3"):
        draft_taps(d, read_target_config({"num_hidden_layers": 10, "hidden_size": 8}))


def test_draft_both_locations_and_use_aux_false():
    d = read_draft_config({"hidden_size": 8, "eagle_aux_hidden_state_layer_ids": [1, 2],
                           "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 3],
                                            "use_aux_hidden_state": False}})
    assert d.layer_ids == [1, 3] and d.layer_ids_source == SRC_EAGLE_CONFIG
    assert any("differ" in w for w in d.warnings) and d.use_aux_hidden_state is False
    f = check_sglang_serving(d, read_target_config({"model_type": "deepseek_v3", "num_hidden_layers": 10,
                                                    "hidden_size": 8}), "0.5.23")
    assert "no-capture" in codes(f)


def test_draft_unmodelled_family_is_info():
    d = read_draft_config({"hidden_size": 8, "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 2]}})
    f = check_sglang_serving(d, read_target_config({"model_type": "llama", "num_hidden_layers": 10,
                                                    "hidden_size": 8}), "0.5.23")
    assert codes(f) == ["unmodelled-family"] and f[0].severity == "info"


@pytest.mark.parametrize("name, pattern", [
    ("draft_bad_convention.json", r"draft_bad_convention\.json: 'eagle_config\.eagle_aux_hidden_state_convention' "
                                  r"is 'hf'.*draft_ids"),
    ("draft_bad_ids.json", r"draft_bad_ids\.json: 'eagle_config\.eagle_aux_hidden_state_layer_ids' must be a list"),
    ("draft_missing_hidden.json", r"draft_missing_hidden\.json: missing 'hidden_size'"),
    ("draft_malformed.json", r"draft_malformed\.json: malformed JSON"),
])
def test_draft_malformed_configs(name, pattern):
    with pytest.raises(ValueError, match=pattern):
        read_draft_config(DATA / name)


def test_draft_malformed_dicts():
    with pytest.raises(ValueError, match="'eagle_config' must be a JSON object"):
        read_draft_config({"hidden_size": 8, "eagle_config": [1]})
    with pytest.raises(ValueError, match=r"element True"):
        read_draft_config({"hidden_size": 8, "eagle_config": {"eagle_aux_hidden_state_layer_ids": [True, 2]}})
    with pytest.raises(ValueError, match=r"is empty"):
        read_draft_config({"hidden_size": 8, "eagle_config": {"eagle_aux_hidden_state_layer_ids": []}})
    with pytest.raises(FileNotFoundError, match="missing_draft"):
        read_draft_config(DATA / "missing_draft")


def test_fixtures_are_valid_json_except_the_malformed_ones():
    for p in DATA.rglob("*.json"):
        if "malformed" in p.name:
            with pytest.raises(json.JSONDecodeError):
                json.loads(p.read_text())
        else:
            json.loads(p.read_text())
