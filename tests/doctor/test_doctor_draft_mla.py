"""The doctor's MLA draft (SGLang's Eagle3DeepseekV2ForCausalLM, the kimi-k2.5-eagle3-mla layout) against
transformers' DeepseekV3Attention in float64: the attention over the 2H-wide draft input with yarn RoPE (Kimi-K2.5's
rope_scaling) and its softmax scale, a whole draft step, the multi-step chain step by step, the checkpoint round trip
through load_draft. SGLang's own load_weights on the same checkpoint: tests/plugin/test_sglang_mla_draft.py."""
import json

import pytest
import torch

from eagle3_capture.doctor.common import DoctorError
from eagle3_capture.doctor.draft.checkpoint import load_draft, save_draft
from eagle3_capture.doctor.draft.mla import MLA_DRAFT_ARCH, softmax_scale
from eagle3_capture.doctor.draft.model import DraftArch, Eagle3Draft

# the rope_scaling of Kimi-K2's config.json (moonshotai/Kimi-K2-Instruct-0905; rope_theta 50000), on a small draft
KIMI_YARN = {"type": "yarn", "factor": 64.0, "original_max_position_embeddings": 4096, "beta_fast": 1.0,
             "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0}


def mla_arch(scaling=KIMI_YARN, **kw):
    a = dict(hidden_size=64, target_hidden_size=48, num_aux=3, vocab_size=101, draft_vocab_size=37,
             num_attention_heads=4, num_key_value_heads=4, head_dim=16, intermediate_size=96,
             max_position_embeddings=262144, rope_theta=50000.0, layer_ids=[1, 3, 5], q_lora_rank=24,
             kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=12, rope_scaling=scaling)
    a.update(kw)
    return DraftArch(**a)


def seeded(arch, seed=0, dtype=torch.float64):
    torch.manual_seed(seed)
    m = Eagle3Draft(arch).to(dtype)
    with torch.no_grad():
        for name, p in m.named_parameters():
            p.copy_(torch.randn_like(p) * (0.2 if p.dim() > 1 else 0.1) + (1.0 if "norm" in name else 0.0))
        m.d2t.copy_(torch.randint(0, 5, m.d2t.shape))
    return m


def hf_attention(arch, ours):
    """transformers' DeepseekV3Attention with its down projections widened to the draft's 2H input, holding our
    module's weights."""
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3Attention, DeepseekV3RotaryEmbedding

    params = {**{k: v for k, v in (arch.rope_scaling or {}).items() if k != "type"},
              "rope_type": (arch.rope_scaling or {}).get("type", "default"), "rope_theta": arch.rope_theta}
    cfg = DeepseekV3Config(hidden_size=arch.hidden_size, num_attention_heads=arch.num_attention_heads,
                           num_key_value_heads=arch.num_attention_heads, q_lora_rank=arch.q_lora_rank,
                           kv_lora_rank=arch.kv_lora_rank, qk_nope_head_dim=arch.qk_nope_head_dim,
                           qk_rope_head_dim=arch.qk_rope_head_dim, v_head_dim=arch.v_head_dim,
                           max_position_embeddings=arch.max_position_embeddings, rms_norm_eps=arch.rms_norm_eps,
                           rope_parameters=params, attention_bias=False)
    cfg._attn_implementation = "eager"
    hf = DeepseekV3Attention(cfg, layer_idx=0)
    hf.q_a_proj = torch.nn.Linear(2 * arch.hidden_size, arch.q_lora_rank, bias=False)
    hf.kv_a_proj_with_mqa = torch.nn.Linear(2 * arch.hidden_size, arch.kv_lora_rank + arch.qk_rope_head_dim,
                                            bias=False)
    hf = hf.to(torch.float64)
    missing, unexpected = hf.load_state_dict(
        {k: v for k, v in ours.state_dict().items() if not k.startswith("_rotary")}, strict=False)
    assert not missing and not unexpected, (missing, unexpected)
    hf.q_a_layernorm.variance_epsilon = hf.kv_a_layernorm.variance_epsilon = arch.rms_norm_eps
    return hf, DeepseekV3RotaryEmbedding(cfg)


def causal_mask(T):
    m = torch.full((T, T), float("-inf"), dtype=torch.float64).triu(1)
    return m[None, None]


@pytest.mark.parametrize("scaling", [KIMI_YARN, None], ids=["yarn", "plain"])
def test_mla_attention_equals_transformers_deepseek_v3(scaling):
    arch = mla_arch(scaling)
    draft = seeded(arch)
    attn = draft.midlayer.self_attn
    hf, rot = hf_attention(arch, attn)
    B, T = 2, 9
    x = torch.randn(B, T, 2 * arch.hidden_size, dtype=torch.float64)
    pos = torch.tensor([[0, 1, 2, 3, 4, 5, 6, 7, 8], [4000, 4100, 5000, 9000, 20000, 70000, 150000, 200000, 250000]])
    want, _ = hf(x, rot(x, pos), causal_mask(T))
    q, k, v = attn.qkv(x, pos)
    got = attn.attend_rows(q[:, :, :, None], k, v, [], [])[:, :, 0]
    assert torch.allclose(got, want, rtol=1e-10, atol=1e-12), (got - want).abs().max()
    assert attn.scale == pytest.approx(hf.scaling, rel=1e-15)
    if scaling:
        assert attn.scale != pytest.approx((arch.qk_nope_head_dim + arch.qk_rope_head_dim) ** -0.5)


def reference_first_step(draft, hf, rot, taps, tokens, pos):
    """Step 1 of the draft at every position, composed by hand around transformers' attention."""
    from eagle3_capture import reference

    layer = draft.midlayer
    g = torch.stack([n.weight for n in draft.fc_norm]) if draft.fc_norm is not None else None
    flat = taps.reshape(-1, taps.shape[-1])
    hidden = reference.draft_fc(flat, draft.fc.weight, g, draft.arch.rms_norm_eps, None).view(*taps.shape[:2], -1)
    emb = draft.embed_tokens(tokens)
    x = torch.cat([layer.input_layernorm(emb), layer.hidden_norm(hidden)], -1)
    a, _ = hf(x, rot(x, pos), causal_mask(tokens.shape[1]))
    h = hidden + a
    h = h + layer.mlp(layer.post_attention_layernorm(h))
    return draft.lm_head(draft.norm(h))


@pytest.mark.parametrize("fc_norm", [False, True])
def test_a_whole_mla_draft_step_equals_the_reference(fc_norm):
    arch = mla_arch(fc_norm=fc_norm)
    draft = seeded(arch, seed=1)
    hf, rot = hf_attention(arch, draft.midlayer.self_attn)
    B, T = 2, 7
    taps = torch.randn(B, T, arch.num_aux * arch.target_hidden_size, dtype=torch.float64)
    tokens = torch.randint(0, arch.vocab_size, (B, T))
    pos = torch.arange(T)[None].expand(B, T) + torch.tensor([[0], [3000]])
    with torch.no_grad():
        want = reference_first_step(draft, hf, rot, taps, tokens, pos)
        got, _, _ = draft.first_step(taps, tokens, pos, use_op=False)
    # the draft's RMSNorm computes in float32 as SGLang's and HF's do; reference.draft_fc's fc_norm in float64
    tol = 1e-5 if fc_norm else 1e-10
    assert torch.allclose(got, want, rtol=tol, atol=tol), (got - want).abs().max()


def test_mla_checkpoint_round_trip_and_config(tmp_path):
    arch = mla_arch(fc_norm=True)
    draft = seeded(arch, seed=2, dtype=torch.float32)
    save_draft(draft, str(tmp_path / "d"))
    cfg = json.load(open(tmp_path / "d" / "config.json"))
    assert cfg["architectures"] == [MLA_DRAFT_ARCH] and cfg["q_lora_rank"] == 24 and cfg["rope_scaling"] == KIMI_YARN
    back = load_draft(str(tmp_path / "d"))
    assert back.arch.mla and back.arch.rope_scaling == KIMI_YARN and not back.notes
    taps = torch.randn(1, 5, 3 * 48)
    tokens = torch.randint(0, 101, (1, 7))
    with torch.no_grad():
        a = draft.unroll(taps, tokens, 3)
        b = back.unroll(taps, tokens, 3, use_op=True)
    for x, y in zip(a, b):
        assert torch.allclose(x, y, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("drop, needle", [("q_lora_rank", "q_lora_rank"), ("kv_lora_rank", "kv_lora_rank"),
                                          ("v_head_dim", "v_head_dim")])
def test_an_mla_config_missing_a_size_is_refused(tmp_path, drop, needle):
    draft = seeded(mla_arch(), dtype=torch.float32)
    save_draft(draft, str(tmp_path / "d"))
    p = tmp_path / "d" / "config.json"
    cfg = json.load(open(p))
    cfg.pop(drop)
    p.write_text(json.dumps(cfg))
    with pytest.raises(DoctorError, match=needle):
        load_draft(str(tmp_path / "d"))


def test_mla_rope_scaling_without_factor_is_refused(tmp_path):
    draft = seeded(mla_arch(), dtype=torch.float32)
    save_draft(draft, str(tmp_path / "d"))
    p = tmp_path / "d" / "config.json"
    cfg = json.load(open(p))
    cfg["rope_scaling"] = {"type": "yarn"}
    p.write_text(json.dumps(cfg))
    with pytest.raises(DoctorError, match="no 'factor'"):
        load_draft(str(tmp_path / "d"))


@pytest.mark.parametrize("key, scaling, note", [
    ("rope_scaling", {"type": "yarn", "factor": 4.0}, "'yarn' is not applied offline"),
    ("rope_parameters", {"rope_type": "llama3", "factor": 8.0}, "'llama3' is not applied offline"),
    ("rope_scaling", {"rope_type": "default"}, None), ("rope_scaling", None, None)])
def test_a_llama_layout_drafts_rope_scaling_is_noted_not_applied(tmp_path, key, scaling, note):
    """The Llama-layout replay runs plain RoPE: a scaled config gets one note naming its kind (either key)."""
    draft = seeded(mla_arch(q_lora_rank=0, scaling=None), dtype=torch.float32)
    save_draft(draft, str(tmp_path / "d"))
    p = tmp_path / "d" / "config.json"
    cfg = json.load(open(p))
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"]
    cfg[key] = scaling
    p.write_text(json.dumps(cfg))
    notes = load_draft(str(tmp_path / "d")).notes
    assert [n for n in notes if "rope_scaling" in n] == ([] if note is None else [notes[0]])
    if note is not None:
        assert note in notes[0]


def test_softmax_scale_follows_sglangs_mscale():
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import yarn_get_mscale

    a = mla_arch()
    assert softmax_scale(a) == pytest.approx(16 ** -0.5 * yarn_get_mscale(64.0, 1.0) ** 2)
    assert softmax_scale(mla_arch({**KIMI_YARN, "mscale_all_dim": 0})) == pytest.approx(16 ** -0.5)
    assert softmax_scale(mla_arch(None)) == pytest.approx(16 ** -0.5)


def reference_chain_one_anchor(draft, hf, rot, taps, tokens, t, steps):
    """Draft logits of steps 1..steps for anchor t, each step as one causal transformers attention over the
    sequence of draft inputs it sees: the step-1 inputs of positions 0..t, then the anchor's own inputs of steps
    2..j at positions t+1..t+j-1 (the draft KV cache SGLang's decode fills)."""
    from eagle3_capture import reference

    layer = draft.midlayer

    def layer_in(tok, hidden):
        return torch.cat([layer.input_layernorm(draft.embed_tokens(tok)), layer.hidden_norm(hidden)], -1)

    def block(x, hidden, pos):
        a, _ = hf(x, rot(x, pos), causal_mask(x.shape[1]))
        h = hidden + a[:, -1]
        h = h + layer.mlp(layer.post_attention_layernorm(h))
        return draft.lm_head(draft.norm(h)), h

    g = torch.stack([n.weight for n in draft.fc_norm]) if draft.fc_norm is not None else None
    hid1 = reference.draft_fc(taps[0, : t + 1], draft.fc.weight, g, draft.arch.rms_norm_eps, None)[None]
    xs = layer_in(tokens[:, : t + 1], hid1)
    pos = torch.arange(t + 1)[None]
    logits, h = block(xs, hid1[:, -1], pos)
    out = [logits[0]]
    for j in range(2, steps + 1):
        x = layer_in(tokens[:, t + j - 1: t + j], h[:, None])
        xs, pos = torch.cat([xs, x], 1), torch.cat([pos, torch.tensor([[t + j - 1]])], 1)
        logits, h = block(xs, h, pos)
        out.append(logits[0])
    return out


def test_the_mla_draft_chain_equals_transformers_step_by_step():
    arch = mla_arch()
    draft = seeded(arch, seed=3)
    hf, rot = hf_attention(arch, draft.midlayer.self_attn)
    T, S = 6, 3
    taps = torch.randn(1, T, arch.num_aux * arch.target_hidden_size, dtype=torch.float64)
    tokens = torch.randint(0, arch.vocab_size, (1, T + S - 1))
    with torch.no_grad():
        got = draft.unroll(taps, tokens, S)
        for t in range(T):
            want = reference_chain_one_anchor(draft, hf, rot, taps, tokens, t, S)
            for j in range(S):
                # float64 throughout except the rope tables: transformers' rotary embedding (and the draft's, as
                # SGLang's) takes cos/sin of float32 angles, rounded differently at some positions (up to ~4e-7
                # in these logits); a chain or KV-cache error is orders of magnitude larger
                assert torch.allclose(got[j][0, t], want[j], rtol=1e-6, atol=1e-6), (t, j)




@pytest.mark.parametrize("S,k,D", [(3, 2, 6), (2, 3, 7)])
def test_the_replay_runs_the_mla_draft_in_chain_and_tree(S, k, D):
    """The chain replay (unroll) and SGLang's tree (rows_step, k rows per anchor with their own draft KV; against
    test_doctor_serving's direct rendering of SGLang's EAGLE worker for one anchor) on the MLA draft, whose values
    are narrower than its keys."""
    from eagle3_capture.doctor.replay.evaluate import chain_correct_taps
    from eagle3_capture.doctor.sglang_model.serving import tree_accepted_taps
    from test_doctor_serving import sglang_tree_one_anchor

    arch = mla_arch(fc_norm=True)
    draft = seeded(arch, seed=5, dtype=torch.float32)
    g = torch.Generator().manual_seed(1)
    T = 16
    taps = torch.randn(1, T, arch.num_aux * arch.target_hidden_size, generator=g)
    seq = torch.randint(0, arch.vocab_size, (1, T), generator=g)
    with torch.no_grad():  # greedy = the draft's own step-1 guesses, so verifies accept something
        first = draft.unroll(taps[:, : T - S], seq[:, 1: T], S)[0]
    greedy = seq.clone()
    greedy[:, 1: T - S + 1] = draft.to_target_ids(first.argmax(-1))
    correct = chain_correct_taps(draft, taps, seq, greedy, S, first_anchor=2, use_op=True)
    assert correct[..., 0].all()
    tree = tree_accepted_taps(draft, taps, seq, greedy, S, k, D, first_anchor=2, use_op=False)
    with torch.no_grad():
        direct = [sglang_tree_one_anchor(draft, taps[:, : T - S], seq, greedy, t, S, k, D)[0]
                  for t in range(2, T - S)]
    assert tree[0].tolist() == direct and min(direct) >= 1
