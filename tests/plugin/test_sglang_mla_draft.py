"""The doctor's MLA draft checkpoint (doctor/draft_mla.py, the kimi-k2.5-eagle3-mla layout) as SGLang 0.5.23 loads
it: Eagle3DeepseekV2ForCausalLM.load_weights takes every tensor (names, shapes; q_a_proj + kv_a_proj_with_mqa fused
as SGLang fuses them), the parameters are the checkpoint's, and SGLang's softmax scale (yarn mscale) is the
doctor's."""
import json

import pytest
import torch

from sglang_fixtures import harness, require_sglang  # noqa: F401,F811  (fixtures)

pytestmark = pytest.mark.sglang


def _sglang_config(arch, tmp_path, draft=None):
    """The DeepseekV3Config SGLang reads from the doctor's saved draft checkpoint (config.json) of `arch`."""
    from transformers import DeepseekV3Config

    from eagle3_capture.doctor.draft.checkpoint import save_draft
    from test_doctor_draft_mla import seeded

    if draft is None:
        draft = seeded(arch, seed=4, dtype=torch.float32)
    save_draft(draft, str(tmp_path / "d"))
    cfg_json = json.load(open(tmp_path / "d" / "config.json"))
    return DeepseekV3Config(**{k: v for k, v in cfg_json.items() if k not in ("architectures", "model_type")})


@pytest.mark.parametrize("yarn", [True, False], ids=["yarn", "plain"])
def test_sglang_loads_the_doctors_mla_checkpoint(harness, require_sglang, tmp_path, yarn, monkeypatch):
    import sglang.srt.layers.rotary_embedding.rope_variant as rope_variant
    from safetensors.torch import load_file
    from sglang.srt.models.kimi_k25_eagle3 import Eagle3DeepseekV2ForCausalLM

    from test_doctor_draft_mla import KIMI_YARN, mla_arch, seeded

    arch = mla_arch(KIMI_YARN if yarn else None, fc_norm=True)
    draft = seeded(arch, seed=4, dtype=torch.float32)
    cfg = _sglang_config(arch, tmp_path, draft)
    # SGLang's yarn RoPE asks the platform for its device, which a CPU-only machine without a platform plugin lacks
    monkeypatch.setattr(rope_variant, "get_device", lambda device_id=None: "cpu")
    with harness._default_dtype(torch.float32):
        m = Eagle3DeepseekV2ForCausalLM(cfg).eval()
    state = load_file(str(tmp_path / "d" / "model.safetensors"))
    m.load_weights(list(state.items()))
    p = dict(m.named_parameters())
    a = "model.midlayer.self_attn."
    fused = torch.cat([state["midlayer.self_attn.q_a_proj.weight"],
                       state["midlayer.self_attn.kv_a_proj_with_mqa.weight"]])
    assert torch.equal(p[a + "fused_qkv_a_proj_with_mqa.weight"], fused)
    for name in ("q_b_proj", "kv_b_proj", "o_proj", "q_a_layernorm", "kv_a_layernorm"):
        assert torch.equal(p[a + name + ".weight"], state[f"midlayer.self_attn.{name}.weight"]), name
    for name in ("input_layernorm", "hidden_norm", "post_attention_layernorm"):
        assert torch.equal(p[f"model.midlayer.{name}.weight"], state[f"midlayer.{name}.weight"]), name
    assert torch.equal(p["model.midlayer.mlp.gate_up_proj.weight"],
                       torch.cat([state["midlayer.mlp.gate_proj.weight"], state["midlayer.mlp.up_proj.weight"]]))
    assert torch.equal(p["model.fc.weight"], state["fc.weight"])
    for name in ("model.embed_tokens.weight", "lm_head.weight"):  # SGLang pads the vocabulary rows to 64
        want = state[name.removeprefix("model.")]
        assert torch.equal(p[name][: want.shape[0]], want), name
    assert m.model.midlayer.self_attn.scaling == pytest.approx(draft.midlayer.self_attn.scale, rel=1e-12)
    if getattr(m.model, "fc_norm", None) is None:  # its load_weights then drops the checkpoint's fc_norm silently
        harness.skip_missing_feature("kimi_k25_eagle3.Eagle3MLAModel.fc_norm: the checkpoint's fc_norm weights "
                                     "are dropped without a word (everything else loaded as checked)")
    assert torch.equal(p["model.fc_norm.2.weight"], state["fc_norm.2.weight"])


def test_the_doctors_mla_rope_scores_equal_sglangs(harness, require_sglang, monkeypatch, tmp_path):
    """SGLang's DeepseekScalingRotaryEmbedding (yarn, interleaved: what its MLA draft layer rotates with) and the
    doctor's (transformers' tables and its de-interleaving rotation) give the same query-key scores at Kimi-K2.5's
    rope_scaling, near and far positions (the channel order differs; scores do not). SGLang's rope is the one its
    MLA draft layer built for the doctor's config (the layer renames the scaling type deepseek_yarn first; the
    factory called with the config's raw "yarn" scaling builds a plain YaRN rope, whose cos/sin carry YaRN's own
    mscale 1.416 on 0.5.12-0.5.14)."""
    import sglang.srt.layers.rotary_embedding.rope_variant as rope_variant
    from sglang.srt.models.kimi_k25_eagle3 import Eagle3DeepseekV2ForCausalLM

    from eagle3_capture.doctor.draft.mla import MLAAttention
    from test_doctor_draft_mla import KIMI_YARN, mla_arch

    monkeypatch.setattr(rope_variant, "get_device", lambda device_id=None: "cpu")
    arch = mla_arch(KIMI_YARN)
    r = arch.qk_rope_head_dim
    with harness._default_dtype(torch.float32):
        sg = Eagle3DeepseekV2ForCausalLM(_sglang_config(arch, tmp_path)).model.midlayer.self_attn.rotary_emb
    ours = MLAAttention(arch)
    g = torch.Generator().manual_seed(0)
    T, h = 12, arch.num_attention_heads
    pos = torch.tensor([0, 1, 2, 3, 100, 4095, 4096, 5000, 30000, 100000, 200000, 262000])
    q = torch.randn(T, h, r, generator=g)
    k = torch.randn(T, 1, r, generator=g)
    sq, sk = sg.forward_native(pos, q.clone(), k.clone())  # [T, heads, r], as the MLA layer hands them
    sq, sk = sq.view(T, h, r), sk.view(T, 1, r)
    oq, ok = ours._rope(q.permute(1, 0, 2)[None], k.permute(1, 0, 2)[None], pos[None])
    want = torch.einsum("thd,sd->hts", sq, sk[:, 0])
    got = torch.einsum("htd,sd->hts", oq[0], ok[0, 0])
    torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-5)
