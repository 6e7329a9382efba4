"""Drafts and checkpoints that are not what they seem (issue 32, kinds 3 and 7): integer, quantized and NaN draft
weights (the MLA projections too), shard indexes naming files outside their directory, MLA configs with bad values.
Each is one DoctorError naming the file and the value -- before, they were cast, followed or truncated without a
word, or gave a traceback."""
import json
import os

import pytest
import torch
from safetensors.torch import load_file, save_file

from eagle3_capture.doctor.common import DoctorError
from eagle3_capture.doctor.draft.checkpoint import load_draft, save_draft
from test_doctor_draft_mla import mla_arch, seeded


@pytest.fixture
def mla_dir(tmp_path):
    d = str(tmp_path / "mla")
    save_draft(seeded(mla_arch(), dtype=torch.float32), d)
    return d


def _edit_weights(d, fn):
    p = os.path.join(d, "model.safetensors")
    t = load_file(p)
    fn(t)
    save_file(t, p)


def _edit_config(d, fn):
    p = os.path.join(d, "config.json")
    cfg = json.load(open(p))
    fn(cfg)
    json.dump(cfg, open(p, "w"))


# -- kind 3: draft weights ------------------------------------------------------------------------------------------

def _int8_with_scale(t):
    w = t["midlayer.self_attn.q_a_proj.weight"]
    scale = w.abs().amax(1, keepdim=True) / 127
    t["midlayer.self_attn.q_a_proj.weight"] = (w / scale).round().to(torch.int8)
    t["midlayer.self_attn.q_a_proj.weight_scale"] = scale


@pytest.mark.parametrize("edit, needle", [
    (_int8_with_scale, r"q_a_proj\.weight(_scale)? is (torch.int8|a quantization tensor)"),
    (lambda t: t.update({"midlayer.mlp.down_proj.weight": t["midlayer.mlp.down_proj.weight"].to(torch.int32)}),
     r"down_proj\.weight is torch.int32, an integer weight"),
    (lambda t: t.update({"midlayer.self_attn.kv_b_proj.qweight": torch.zeros(4, 4, dtype=torch.int32)}),
     r"kv_b_proj\.qweight is a quantization tensor"),
])
def test_integer_and_quantized_draft_weights_are_refused(mla_dir, edit, needle):
    """Before: an int8 weight with its weight_scale (W8A8) was cast to float, its scale ignored: exit 0 and another
    prediction; int32 weights were taken too."""
    _edit_weights(mla_dir, edit)
    with pytest.raises(DoctorError, match=needle):
        load_draft(mla_dir)


@pytest.mark.parametrize("name", ["midlayer.self_attn.kv_a_proj_with_mqa.weight", "midlayer.self_attn.q_b_proj.weight",
                                  "fc.weight", "midlayer.input_layernorm.weight"])
@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_a_non_finite_draft_weight_is_refused_at_load(mla_dir, name, value):
    """Before: a NaN weight changed the prediction with no warning (the MLA projections too)."""
    def edit(t):
        t[name].view(-1)[3] = value
    _edit_weights(mla_dir, edit)
    with pytest.raises(DoctorError, match=rf"{name.replace('.', '[.]')} holds 1 NaN or Inf value"):
        load_draft(mla_dir)


def test_a_clean_draft_still_loads(mla_dir):
    assert load_draft(mla_dir).arch.mla


# -- kind 7: MLA draft configs ---------------------------------------------------------------------------------------

def _scaling(**kw):
    def edit(cfg):
        cfg["rope_scaling"] = {**cfg["rope_scaling"], **kw}
    return edit


@pytest.mark.parametrize("edit, needle", [
    (lambda c: c.update(kv_lora_rank=16.7), r"'kv_lora_rank' must be a positive integer, got 16.7"),
    (lambda c: c.update(kv_lora_rank=-16), r"'kv_lora_rank' must be a positive integer, got -16"),
    (lambda c: c.update(kv_lora_rank="16"), r"'kv_lora_rank' must be a positive integer, got '16'"),
    (lambda c: c.update(qk_rope_head_dim=7), r"'qk_rope_head_dim' must be even"),
    (_scaling(type="wobbly"), r"rope_scaling type 'wobbly' is not one"),
    (_scaling(factor=0), r"'factor' must be > 0, got 0"),
    (_scaling(factor=-4.0), r"'factor' must be > 0, got -4.0"),
    (_scaling(factor=float("nan")), r"'factor' must be a finite number, got nan"),
    (_scaling(factor="64"), r"'factor' must be a finite number, got '64'"),
    (_scaling(mscale="1.0"), r"'mscale' must be a finite number, got '1.0'"),
])
def test_bad_mla_config_values_are_one_error(mla_dir, edit, needle):
    """Before: 16.7 was truncated to 16 and a yarn factor of 0 / negative / NaN ran with only a transformers
    warning; a negative rank, an odd rope dim, an unknown rope_type and a string factor or mscale were tracebacks."""
    _edit_config(mla_dir, edit)
    with pytest.raises(DoctorError, match=needle):
        load_draft(mla_dir)
