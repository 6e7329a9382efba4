"""vLLM 0.32.0's own code, in this process (no engine): the id lookups of both model runners through the real
EAGLEConfig against vllm_rules.read_aux_layer_ids (fuzzed), the plugin's feature detection and hooks, and the
declaration the plugin derives from a real VllmConfig (EngineArgs.create_engine_config, as the engine builds it) for
either runner -- the nested-only refusal under Model Runner V2, which cannot run on this CPU machine (it needs
Triton)."""
from __future__ import annotations

import inspect
import json
import os
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings, strategies as st

from eagle3_capture import vllm_rules as vr
from eagle3_capture.spec import EMBEDDING, LayerOutput
import vllm_pair
from vllm_fixtures import pair  # noqa: F401

pytestmark = [pytest.mark.vllm]

IDS = st.lists(st.integers(-2, 8), min_size=0, max_size=4)
MAYBE = lambda s: st.one_of(st.just(None), s)  # noqa: E731


@st.composite
def draft_configs(draw):
    cfg = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": 64,
           "num_hidden_layers": 1}
    for key in ("eagle_aux_hidden_state_layer_ids", "dspark_target_layer_ids", "target_layer_ids"):
        v = draw(MAYBE(IDS))
        if v is not None:
            cfg[key] = v
    for section in ("eagle_config", "dflash_config"):
        sub = {}
        for key in ("eagle_aux_hidden_state_layer_ids", "layer_ids", "target_layer_ids"):
            v = draw(MAYBE(IDS))
            if v is not None:
                sub[key] = v
        if draw(st.booleans()):
            cfg[section] = sub
    return cfg


def test_installed_release_is_in_the_table_with_both_runners():
    import vllm

    assert vllm.__version__.split("+")[0] == "0.32.0"
    assert vr.vllm_release("0.32.0").runners == (vr.RUNNER_V1, vr.RUNNER_V2)
    assert vr.assumed_vllm_release()[0].version == "0.32.0"


@pytest.mark.parametrize("runner", [vr.RUNNER_V1, vr.RUNNER_V2])
def test_real_id_lookup_matches_the_model(runner):
    from transformers import AutoConfig
    from vllm.transformers_utils.configs.eagle import EAGLEConfig
    from vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils import get_eagle3_aux_layers_from_config
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    if runner == vr.RUNNER_V2:
        ask = get_eagle3_aux_layers_from_config
    else:
        ask = lambda spec: GPUModelRunner._get_eagle3_aux_layers_from_config(  # noqa: E731
            SimpleNamespace(speculative_config=spec))

    @settings(max_examples=200, deadline=None)
    @given(draft_configs())
    def check(cfg):
        hf = EAGLEConfig(AutoConfig.for_model(**cfg), method="eagle3", model_type="eagle")
        got = ask(SimpleNamespace(draft_model_config=SimpleNamespace(hf_config=hf)))
        assert got == vr.read_aux_layer_ids(cfg, runner).ids, cfg

    check()


def test_default_layers_and_setter_as_modelled():
    from vllm.model_executor.models.deepseek_v2 import DeepseekV2ForCausalLM

    obj = SimpleNamespace(model=SimpleNamespace(layers=list(range(61))))
    assert DeepseekV2ForCausalLM.get_eagle3_default_aux_hidden_state_layers(obj) == vr.default_aux_layers(61)


def test_feature_detection_and_hooks_in_place():
    from vllm.model_executor.models.deepseek_v2 import DeepseekV2Model, DeepseekV3ForCausalLM

    from eagle3_capture.vllm import internals, plugin, target

    rel = internals.detect()
    assert (rel.release, rel.adapter, rel.missing, rel.refusal) == ("0.32.0", "aux-list", {}, None)
    signature = inspect.signature(DeepseekV2Model.forward)
    plugin.register()
    plugin.register()  # loaded twice in one process: wrapped once
    assert DeepseekV2Model.forward.__wrapped__ is target.ORIGINALS[internals.MODEL_FORWARD_PATH]
    assert inspect.signature(DeepseekV2Model.forward) == signature  # vLLM's compile decorator reads it
    assert all(target.in_place(p) is None for p, _ in target.HOOKS)
    assert DeepseekV3ForCausalLM.set_aux_hidden_state_layers._eagle3_capture_hook is \
        target.set_aux_hidden_state_layers_hook
    assert "=on" in plugin.status_text() and "not" not in plugin.status_text()


def _engine_config(pair, draft, monkeypatch, v2: bool):
    """The VllmConfig the engine builds for this pair. Model Runner V2 needs Triton, which has no CPU backend here
    (create_engine_config refuses it), so for V2 the real config's parts are handed on with the runner choice
    turned to V2: the draft's hf_config (vLLM's EAGLEConfig) is the real one either way."""
    from vllm.engine.arg_utils import EngineArgs

    monkeypatch.setenv("VLLM_MLA_DISABLE", "1")
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "0")
    args = EngineArgs(model=pair.target, skip_tokenizer_init=True, enforce_eager=True, dtype="float32",
                      max_model_len=128, speculative_config={"method": "eagle3", "model": draft,
                                                             "num_speculative_tokens": 3})
    cfg = args.create_engine_config()
    assert cfg.use_v2_model_runner is False
    if not v2:
        return cfg
    return SimpleNamespace(speculative_config=cfg.speculative_config, parallel_config=cfg.parallel_config,
                           use_v2_model_runner=True)


@pytest.mark.parametrize("v2", [False, True])
def test_declaration_from_the_real_engine_config(pair, monkeypatch, v2):
    """The draft as trained (nested draft ids, convention declared) and its nested-only twin without the convention,
    through the VllmConfig the engine builds: V1 serves both; V2 refuses the nested-only ids it would ignore."""
    from vllm.model_executor.models.deepseek_v2 import DeepseekV2Model

    from eagle3_capture.vllm import internals, plugin, target
    from eagle3_capture.vllm.declaration import DeclarationError

    plugin.register()  # the embedding tap needs the forward hook in place
    with open(os.path.join(pair.target, "config.json")) as f:
        tcfg = json.load(f)
    model = SimpleNamespace(config=SimpleNamespace(num_hidden_layers=tcfg["num_hidden_layers"],
                                                   hidden_size=tcfg["hidden_size"]),
                            model=DeepseekV2Model.__new__(DeepseekV2Model))
    rel = internals.detect()
    vcfg = _engine_config(pair, pair.draft("draft_embedding"), monkeypatch, v2)
    if v2:
        with pytest.raises(DeclarationError, match=r"only in eagle_config.eagle_aux_hidden_state_layer_ids, which "
                                                   r"vLLM 0.32.0 \(model runner v2\) does not read.*\[0, 2, 3\]"):
            target.declaration_for(model, vcfg, rel)
    else:
        decl = target.declaration_for(model, vcfg, rel)
        assert decl.spec.taps == (EMBEDDING, LayerOutput(1), LayerOutput(2)) and decl.aux_layers == (2, 3)
    bare = pair.variant("draft_interior", "interior_nested_undeclared", nested=[1, 2, 4])
    vcfg = _engine_config(pair, bare, monkeypatch, v2)
    if v2:
        with pytest.raises(DeclarationError, match="move them to the top-level"):
            target.declaration_for(model, vcfg, rel)
    else:
        assert target.declaration_for(model, vcfg, rel).aux_layers == (1, 2, 4)


def _gptj_rotation(x, positions, base, dim):
    """Float64 rotation of interleaved pairs (x[2i], x[2i+1]) by positions * base^(-2i/dim): DeepSeek's rope layout
    (transformers' apply_rotary_pos_emb_interleave up to the order it writes the pairs in)."""
    inv = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    ang = positions.double()[:, None] * inv[None]
    shape = (x.shape[0],) + (1,) * (x.dim() - 2) + (dim // 2,)
    c, s = ang.cos().view(shape), ang.sin().view(shape)
    x = x.double()
    out = torch.empty_like(x)
    out[..., 0::2] = x[..., 0::2] * c - x[..., 1::2] * s
    out[..., 1::2] = x[..., 1::2] * c + x[..., 0::2] * s
    return out


@pytest.mark.parametrize("heads", [vllm_pair.TARGET["num_attention_heads"], 4])
def test_cpu_rotary_op_exact_for_the_targets_one_head(heads):
    """The rotary op vLLM's CPU engine runs (RotaryEmbedding.forward_cpu, ``ops.rotary_embedding``) on the views
    DeepseekV2Attention (MLA disabled) hands it: q[..., qk_nope_head_dim:] of [tokens, heads, qk_head_dim] and the
    latent's rope part. Exact for the pair's one-head target; with 4 heads it rotates the wrong rows (it takes the
    head stride for the token stride), which is why the pair has one head (vllm_pair.py)."""
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.rotary_embedding import get_rope

    t = vllm_pair.TARGET
    nope, dim, lora = t["qk_nope_head_dim"], t["qk_rope_head_dim"], t["kv_lora_rank"]
    base = 10000.0
    with set_current_vllm_config(VllmConfig()):
        rope = get_rope(dim, max_position=t["max_position_embeddings"], is_neox_style=False,
                        rope_parameters={"rope_theta": base, "rope_type": "default"}, dtype=torch.float32)
    g = torch.Generator().manual_seed(0)
    T = 24
    q = torch.randn(T, heads, nope + dim, generator=g)
    latent = torch.randn(T, lora + dim, generator=g).unsqueeze(1)
    positions = torch.arange(3, 3 + T)
    want_q = _gptj_rotation(q[..., nope:], positions, base, dim)
    want_k = _gptj_rotation(latent[:, :, lora:], positions, base, dim)
    q_pe, k_pe = rope.forward_cpu(positions, q[..., nope:], latent[:, :, lora:])
    err_q = float((q_pe.double() - want_q).abs().max())
    assert float((k_pe.double() - want_k).abs().max()) < 1e-5
    if heads == 1:
        assert err_q < 1e-5, err_q
    else:
        assert err_q > 0.1, f"vLLM's CPU rotary op is exact with {heads} heads now ({err_q:.1e}): the pair may go back to " \
                            "several heads"
