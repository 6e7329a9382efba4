"""The draft layouts table (eagle3_capture/draft_layouts.py) is what its users read: every implementation a row names
exists, the plugin hooks each row's SGLang forward with the row's hook, the doctor builds each row's attention and
writes and reads each row's config, and a new row is all a new layout takes in the places that pick a layout."""
import dataclasses

import pytest

from eagle3_capture import draft_layouts as dl


def test_rows_are_distinct_and_one_is_the_default():
    assert len({lay.name for lay in dl.LAYOUTS}) == len(dl.LAYOUTS)
    assert len({lay.architecture for lay in dl.LAYOUTS}) == len(dl.LAYOUTS)
    assert len({lay.sglang_forward for lay in dl.LAYOUTS}) == len(dl.LAYOUTS)
    assert [lay.name for lay in dl.LAYOUTS if lay.marker is None] == ["llama"]


@pytest.mark.parametrize("lay", dl.LAYOUTS, ids=lambda lay: lay.name)
def test_every_named_implementation_exists(lay):
    from eagle3_capture.doctor.draft.model import DraftArch

    assert callable(dl.implementation(lay.plugin_hook))
    assert callable(dl.implementation(lay.config_reader))
    assert isinstance(dl.implementation(lay.doctor_attention), type)
    names = {f.name for f in dataclasses.fields(DraftArch)}
    assert set(lay.config_fields) <= names and (lay.marker is None or lay.marker in names), lay


def test_the_plugin_hooks_each_rows_forward_with_its_hook():
    from eagle3_capture.sglang import draft

    assert draft.HOOKS == [(lay.sglang_forward, dl.implementation(lay.plugin_hook)) for lay in dl.LAYOUTS]


def _arch(**kw):
    from eagle3_capture.doctor.draft.model import DraftArch

    base = dict(hidden_size=32, target_hidden_size=32, num_aux=3, vocab_size=64, draft_vocab_size=64,
                num_attention_heads=4, num_key_value_heads=2, head_dim=8, intermediate_size=48, layer_ids=[-1, 1, 2])
    return DraftArch(**{**base, **kw})


MLA_FIELDS = dict(q_lora_rank=16, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8)


@pytest.mark.parametrize("fields, lay", [({}, dl.LLAMA), (MLA_FIELDS, dl.MLA)], ids=["llama", "mla"])
def test_the_doctor_writes_reads_and_builds_each_row(fields, lay, tmp_path):
    """A DraftArch of the row's fields is that row; its config.json names the row's architecture and carries the
    row's own fields; read back, it is the same layout; the model's attention is the row's class."""
    import torch

    from eagle3_capture.doctor.draft.checkpoint import arch_from_config
    from eagle3_capture.doctor.draft.model import Eagle3Draft

    a = _arch(**fields)
    assert a.layout is lay and dl.of_fields(a) is lay
    cfg = a.config_json()
    assert cfg["architectures"] == [lay.architecture] and cfg["model_type"] == lay.model_type
    assert all(k in cfg for k in lay.config_fields) and not any(k in cfg for k in lay.config_drops)
    back = arch_from_config(cfg, "draft config", a.num_aux, a.target_hidden_size, a.layer_ids)
    assert back.layout is lay and all(getattr(back, k) == getattr(a, k) for k in lay.config_fields)
    with torch.device("meta"):
        model = Eagle3Draft(a)
    assert type(model.midlayer.self_attn) is dl.implementation(lay.doctor_attention)


def test_a_third_layout_is_one_row(monkeypatch):
    """The places that pick a layout read the table: a row added to it is found by architecture and by its marker
    field, and a config naming an unknown architecture is refused with every row's architecture listed."""
    from eagle3_capture.doctor.common import DoctorError
    from eagle3_capture.doctor.draft.checkpoint import arch_from_config

    toy = dl.DraftLayout(name="toy", architecture="ToyEagle3", model_type="toy", what="a toy layout",
                         sglang_forward="sglang.srt.models.toy.ToyModel.forward", plugin_hook="sglang.draft:x",
                         doctor_attention="doctor.draft.model:LlamaAttention",
                         config_reader="doctor.draft.validate:llama_fields", marker="v_head_dim")
    monkeypatch.setattr(dl, "LAYOUTS", dl.LAYOUTS + (toy,))
    assert dl.by_architecture("ToyEagle3") is toy and dl.by_architecture("Nope") is None
    assert dl.of_fields(_arch(v_head_dim=8)) is toy and dl.of_fields(_arch()) is dl.LLAMA
    cfg = _arch().config_json()
    cfg["architectures"] = ["Nope"]
    with pytest.raises(DoctorError, match="ToyEagle3 \\(a toy layout\\)") as e:
        arch_from_config(cfg, "draft config", 3, 32, [-1, 1, 2])
    assert "['ToyEagle3']" in str(e.value) and "is not supported offline" in str(e.value)
