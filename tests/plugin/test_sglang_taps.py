"""SGLang's real set_eagle3_layers_to_capture, hooked: the draft's ids through the tap spec, at model load."""
import importlib.util
import json
import os

import pytest

from sglang_fixtures import harness, require_sglang, sglang_plugin, skip_unless_sglang_has, tiny  # noqa: F401

pytestmark = pytest.mark.sglang

CONFIGS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "configs")


@pytest.fixture
def no_declaration():
    from eagle3_capture.sglang.taps import target

    target.set_declaration(None)
    yield target
    target.set_declaration(None)


def test_61_layers_draft_ids_become_layer_inputs(harness, sglang_plugin, no_declaration):
    from eagle3_capture.spec import EMBEDDING, LayerOutput
    from eagle3_capture.sglang.taps.target import SPEC_ATTR, resolved_taps

    m = harness.bare_model()
    assert m.config.num_hidden_layers == 61
    m.set_eagle3_layers_to_capture([-1, 2, 30])
    assert m.model.layers_to_capture == [0, 3, 31]
    assert m.capture_aux_hidden_states is True
    assert getattr(m.model, SPEC_ATTR).taps == (EMBEDDING, LayerOutput(2), LayerOutput(30))
    r = resolved_taps()[-1]
    assert r.model_class == "DeepseekV3ForCausalLM" and r.layers_to_capture == [0, 3, 31]
    # SGLang's own rule, the original the registry keeps in __wrapped__, as the installed release has it (0.5.23:
    # -1 stays and never matches a layer; 0.5.12: +1 on each): the note names what stock would store
    stock_ids = harness.stock_layers_to_capture([-1, 2, 30], 61)
    assert f"stock SGLang would store {stock_ids}" in r.native_note, r.native_note
    if stock_ids == [-1, 2, 30] and importlib.util.find_spec("sglang.srt.layers.aux_hidden_states") is not None:
        assert "captured 2 of 3" in r.native_note  # the packer's count check (layers/aux_hidden_states.py)


def test_61_layers_final_boundary(harness, sglang_plugin, no_declaration):
    from eagle3_capture.spec import LayerOutput
    from eagle3_capture.sglang.taps.target import SPEC_ATTR

    m = harness.bare_model()
    m.set_eagle3_layers_to_capture([-1, 2, 30, 60])
    # 61 = layer-input index of LayerOutput(60), the final boundary: SGLang's loop (0..60) never reaches it;
    # the plugin's final-norm hook captures it (test_sglang_wiring proves the value)
    assert m.model.layers_to_capture == [0, 3, 31, 61]
    spec = getattr(m.model, SPEC_ATTR)
    assert spec.includes_final_boundary and spec.taps[-1] == LayerOutput(60)


def test_61_layers_no_ids_keeps_sglang_default(harness, sglang_plugin, no_declaration):
    m = harness.bare_model()
    m.set_eagle3_layers_to_capture(None)
    assert m.model.layers_to_capture == [2, 30, 58]


@pytest.mark.parametrize("ids, match", [
    ([-2, 2, 30], r"draft id -2 is out of range for a 61-layer model"),
    ([-1, 2, 61], r"draft id 61 is out of range .* \(did you pass HF hidden_states or layer-input indices\?"),
    ([2, 2, 30], r"duplicate draft id 2"),
    ([30, 2], r"draft id 30 \(position 0\) comes before draft id 2"),
    ([], r"no draft ids given"),
])
def test_rejected_ids_raise_at_load(harness, sglang_plugin, no_declaration, ids, match):
    from eagle3_capture.spec import TapError

    m = harness.bare_model()
    with pytest.raises(TapError, match=match) as e:
        m.set_eagle3_layers_to_capture(ids)
    msg = str(e.value)
    assert "eagle3_capture: DeepseekV3ForCausalLM (61 layers, H=7168)" in msg and str(ids) in msg
    assert m.model.layers_to_capture == [] and m.capture_aux_hidden_states is False  # nothing half-set


def _declare(target, path_or_dict, sglang_ids):
    from eagle3_capture.configs import read_draft_config

    target.set_declaration(target.DraftDeclaration(sglang_ids, read_draft_config(path_or_dict), None, "test"))


@pytest.mark.parametrize("fname, expect", [
    ("draft_eagle_config_ids.json", [0, 3, 31]),          # draft ids [-1, 2, 30]
    ("draft_layer_inputs_convention.json", [0, 3, 31]),  # declared layer inputs [0, 3, 31]
    ("draft_hf_convention.json", [0, 3, 31]),            # declared HF hidden_states [0, 3, 31]
])
def test_declared_convention_is_honoured(harness, sglang_plugin, no_declaration, fname, expect):
    path = os.path.join(CONFIGS, fname)
    ids = json.load(open(path))["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    _declare(no_declaration, path, ids)
    m = harness.bare_model()
    m.set_eagle3_layers_to_capture(ids)  # what SGLang passes: eagle_config's ids, as they are
    assert m.model.layers_to_capture == expect


def test_declared_layer_inputs_may_name_the_final_boundary(harness, sglang_plugin, no_declaration):
    cfg = {"hidden_size": 7168, "eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 3, 31, 61],
                                                 "eagle_aux_hidden_state_convention": "layer_inputs"}}
    _declare(no_declaration, cfg, [0, 3, 31, 61])
    m = harness.bare_model()
    m.set_eagle3_layers_to_capture([0, 3, 31, 61])
    assert m.model.layers_to_capture == [0, 3, 31, 61]


def test_declared_hf_final_entry_is_rejected(harness, sglang_plugin, no_declaration):
    from eagle3_capture.spec import TapError

    cfg = {"hidden_size": 7168, "eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 3, 61],
                                                 "eagle_aux_hidden_state_convention": "hf_hidden_states"}}
    _declare(no_declaration, cfg, [0, 3, 61])
    m = harness.bare_model()
    with pytest.raises(TapError, match=r"HF hidden_states index 61 .* AFTER the final norm"):
        m.set_eagle3_layers_to_capture([0, 3, 61])


def test_top_level_ids_reach_the_target(harness, sglang_plugin, no_declaration):
    """Stock SGLang's target reads only eagle_config's ids; the draft sized its fc from the top-level ones."""
    _declare(no_declaration, os.path.join(CONFIGS, "draft_top_level_ids.json"), None)
    m = harness.bare_model()
    m.set_eagle3_layers_to_capture(None)  # what SGLang passes for this config
    assert m.model.layers_to_capture == [3, 31, 59]  # draft ids [2, 30, 58], not SGLang's default [2, 30, 58]


def test_unreadable_draft_config_fails_at_load(harness, sglang_plugin, no_declaration):
    target = no_declaration
    target.set_declaration(target.DraftDeclaration([0, 3, 31], None, "ValueError: bad convention 'hf'", "d"))
    m = harness.bare_model()
    with pytest.raises(ValueError, match=r"draft config d could not be read: ValueError: bad convention 'hf'"):
        m.set_eagle3_layers_to_capture([0, 3, 31])


def test_ids_that_do_not_match_the_declaration_are_draft_ids(harness, sglang_plugin, no_declaration):
    """e.g. --enable-return-aux-hidden-states's own ids: read as draft ids."""
    _declare(no_declaration, os.path.join(CONFIGS, "draft_layer_inputs_convention.json"), [0, 3, 31])
    m = harness.bare_model()
    m.set_eagle3_layers_to_capture([1, 29, 57])
    assert m.model.layers_to_capture == [2, 30, 58]


def test_resolve_hook_reads_the_draft_config_where_sglang_does(harness, sglang_plugin, no_declaration, tmp_path):
    """SGLang's real resolve_spec_aux_hidden_state_config on a target and a draft directory: the hook keeps the
    draft's declared convention, and the next set_eagle3_layers_to_capture honours it."""
    skip_unless_sglang_has("sglang.srt.model_executor.model_runner_components.spec_aux_hidden_state",
                           "model_executor/model_runner_components/spec_aux_hidden_state.py "
                           "(resolve_spec_aux_hidden_state_config: the draft's ids are read elsewhere)")
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.model_executor.model_runner_components import spec_aux_hidden_state as sah
    from sglang.srt.runtime_context import get_context
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    cfg = harness.tiny_config()
    tdir, ddir = tmp_path / "target", tmp_path / "draft"
    cfg.save_pretrained(tdir)
    ddir.mkdir()
    (ddir / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 4,
        "vocab_size": 256, "draft_vocab_size": 256, "max_position_embeddings": 128, "rms_norm_eps": 1e-6,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 2, 4, 6],
                         "eagle_aux_hidden_state_convention": "layer_inputs"}}))
    override = get_context().override_server_args(model_path=str(tdir), speculative_algorithm="EAGLE3",
                                                   speculative_draft_model_path=str(ddir))
    server_args = override.install()
    try:
        mc = ModelConfig.from_server_args(server_args, model_path=str(tdir))
        conf = sah.resolve_spec_aux_hidden_state_config(
            server_args=server_args, model_config=mc, spec_algorithm=SpeculativeAlgorithm.from_string("EAGLE3"),
            is_draft_worker=False)
    finally:
        override.restore()
    assert conf.eagle_use_aux_hidden_state and conf.eagle_aux_hidden_state_layer_ids == [0, 2, 4, 6]  # untouched
    decl = no_declaration.current_declaration()
    assert decl.sglang_ids == [0, 2, 4, 6] and decl.draft.convention == "layer_inputs" and decl.error is None
    assert str(ddir) in decl.source
    m = harness.bare_model(6, 64)
    m.set_eagle3_layers_to_capture(conf.eagle_aux_hidden_state_layer_ids)
    # layer inputs [0, 2, 4, 6]: Embedding, LayerOutput(1), LayerOutput(3), LayerOutput(5) = the final boundary
    assert m.model.layers_to_capture == [0, 2, 4, 6]
    from eagle3_capture.sglang.taps.target import SPEC_ATTR
    assert getattr(m.model, SPEC_ATTR).to_draft_ids() == [-1, 1, 3, 5]


def test_startup_log_line(harness, sglang_plugin, no_declaration, caplog):
    import logging

    m = harness.bare_model()
    with caplog.at_level(logging.INFO, logger="eagle3_capture.sglang"):
        m.set_eagle3_layers_to_capture([-1, 2, 30, 60])
    lines = [r.getMessage() for r in caplog.records if r.name == "eagle3_capture.sglang"]
    assert len(lines) == 1, lines
    line = lines[0]
    from eagle3_capture.sglang.installed import internals

    release = internals.current()
    for part in (f"eagle3_capture: SGLang {release.version} (adapter {release.adapter}): DeepseekV3ForCausalLM: "
                 "taps [Embedding, LayerOutput(2), LayerOutput(30), LayerOutput(60)]", "draft ids [-1, 2, 30, 60]", "layer inputs n/a (final boundary)",
                 "HF hidden_states n/a (final boundary)", "L=61 H=7168 K=4 fc_in=28672",
                 "layers_to_capture [0, 3, 31, 61 (final boundary, before the final norm)]",
                 "taps=on", "final_boundary=on", "capture=on" if release.packer_slot else "capture=off (",
                 "EAGLE3_CAPTURE_DISABLE"):
        assert part in line, (part, line)


def test_whether_a_spec_declares_the_final_boundary_is_asked_of_that_spec(sglang_plugin):
    """The model forward hook asks at every forward whether the model's spec declares the final boundary; the answer
    it keeps for the last spec asked about follows the spec (models with and without it, in any order)."""
    from eagle3_capture.sglang.taps import model_forward
    from eagle3_capture.spec import TapSpec

    final = TapSpec.from_draft_ids([-1, 1, 5], 6, 64)
    inner = TapSpec.from_draft_ids([-1, 1, 3], 6, 64)
    for spec, want in ((final, True), (inner, False), (None, False), (final, True), (final, True), (inner, False),
                       (TapSpec.from_draft_ids([-1, 1, 5], 6, 64), True)):
        assert model_forward.declares_final(spec) is want, spec
