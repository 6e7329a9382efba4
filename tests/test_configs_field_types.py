"""Config fields of the wrong JSON type are a ValueError naming the file and the key (never a TypeError from deep
inside, never a string read as true): the convention, the boolean switches, model_type, architectures."""
import json

import pytest

from eagle3_capture.configs import read_draft_config, read_target_config


def _draft(**top):
    d = {"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": 64, "target_hidden_size": 64,
         "eagle_config": {"eagle_aux_hidden_state_layer_ids": [-1, 1, 2], "use_aux_hidden_state": True}}
    for k, v in top.items():
        if k.startswith("ec_"):
            d["eagle_config"][k[3:]] = v
        else:
            d[k] = v
    return d


def _write(tmp_path, obj, name="config.json"):
    p = tmp_path / name
    p.write_text(json.dumps(obj))
    return str(p)


@pytest.mark.parametrize("field, value, needle", [
    ("ec_eagle_aux_hidden_state_convention", ["draft_ids"], "eagle_config.eagle_aux_hidden_state_convention"),
    ("ec_eagle_aux_hidden_state_convention", {"draft_ids": 1}, "eagle_config.eagle_aux_hidden_state_convention"),
    ("ec_eagle_aux_hidden_state_convention", 3, "eagle_config.eagle_aux_hidden_state_convention"),
    ("ec_use_aux_hidden_state", "false", "eagle_config.use_aux_hidden_state' must be true or false"),
    ("ec_use_aux_hidden_state", 0, "eagle_config.use_aux_hidden_state' must be true or false"),
    ("ec_norm_before_fc", "yes", "eagle_config.norm_before_fc' must be true or false"),
    ("norm_before_fc", 1, "'norm_before_fc' must be true or false"),
    ("fc_norm", "no", "'fc_norm' must be true or false"),
    ("use_aux_norm", [True], "'use_aux_norm' must be true or false"),
    ("model_type", 3, "'model_type' must be a string"),
    ("architectures", {"LlamaForCausalLMEagle3": 1}, "'architectures' must be a list of strings"),
    ("architectures", [1], "'architectures' must be a list of strings"),
])
def test_draft_fields_of_the_wrong_type(tmp_path, field, value, needle):
    p = _write(tmp_path, _draft(**{field: value}))
    with pytest.raises(ValueError) as e:
        read_draft_config(p)
    assert needle in str(e.value) and p in str(e.value), str(e.value)


def test_draft_booleans_and_null_read_as_written(tmp_path):
    d = read_draft_config(_write(tmp_path, _draft(fc_norm=True, norm_before_fc=None, ec_use_aux_hidden_state=False)))
    assert d.fc_norm and not d.norm_before_fc and not d.use_aux_hidden_state
    d = read_draft_config(_write(tmp_path, _draft(use_aux_norm=False, ec_norm_before_fc=True)))
    assert not d.fc_norm and d.norm_before_fc


@pytest.mark.parametrize("cfg, needle", [
    ({"model_type": ["deepseek_v3"], "num_hidden_layers": 4, "hidden_size": 64}, "'model_type' must be a string"),
    ({"model_type": "kimi_k25", "text_config": {"model_type": 7, "num_hidden_layers": 4, "hidden_size": 64}},
     "'text_config.model_type' must be a string"),
    ({"architectures": "DeepseekV3ForCausalLM", "num_hidden_layers": 4, "hidden_size": 64},
     "'architectures' must be a list of strings"),
    ({"num_hidden_layers": True, "hidden_size": 64}, "'num_hidden_layers' must be an integer"),
])
def test_target_fields_of_the_wrong_type(tmp_path, cfg, needle):
    p = _write(tmp_path, cfg)
    with pytest.raises(ValueError) as e:
        read_target_config(p)
    assert needle in str(e.value), str(e.value)
