"""kimi_shape.layer_batches reaches SGLang's real DeepseekV3 the way the GPU run sends it, on the CPU.

The GPU run starts SGLang 0.5.23 with ``load_format="dummy"`` and sends each batch of ``layer_batches`` through
``Engine.update_weights_from_tensor``, which ends in one ``model.load_weights(batch)`` per batch
(model_executor/model_runner_components/weight_updater.py). Here the same model class is built from the same
config.json (kimi_shape.py's CLI, 3 layers: one dense, two MoE) with the dummy loader's fill
(model_loader/loader.py ``DummyModelLoader.load_model``: ``initialize_dummy_weights``, then ``post_load_weights``),
then loaded one call per batch. The checks: every parameter holds its checkpoint tensors in SGLang's fused layout,
nothing keeps a dummy value, the absorbed MLA weights were re-derived, and the loaded model computes what
transformers' DeepseekV3 computes from the same tensors written as a checkpoint (so the names and layout mean the
same model to both)."""
import json
import logging
import os
import re
from unittest import mock

import pytest
import torch

import kimi_shape  # scripts/gpu_sglang, on pytest's pythonpath
from sglang_fixtures import harness, require_sglang  # noqa: F401  (fixtures)

pytestmark = pytest.mark.sglang

EXPERTS, TOPK, LAYERS = 4, 2, 3  # kimi_shape's first_k_dense_replace = 1: layer 0 dense, layers 1 and 2 MoE
DUMMY_BOUND = 1e-3               # initialize_dummy_weights' U(-1e-3, 1e-3)
REL_TOL = 1e-4                   # float32, SGLang's MLA / MoE kernels vs HF's eager modules (measured ~7e-6)


def _small_cfg() -> dict:
    return kimi_shape.target_config(experts=EXPERTS, topk=TOPK, **dict(kimi_shape.SMALL, num_hidden_layers=LAYERS))


def _yarn_rope_on_cpu():
    """The harness leaves the runtime device None so that the layers take the paths they take on a GPU host (a "cpu"
    device would route the rope to get_rope_cpu). Kimi's yarn RoPE (``DeepseekScalingRotaryEmbedding``, which the
    harness's tiny target, without rope scaling, never builds) then asks ``sglang.srt.utils.get_device()`` where to
    put its cos/sin cache, which raises on a host without an accelerator: name the CPU for that lookup alone."""
    from sglang.srt.layers.rotary_embedding import rope_variant

    return mock.patch.object(rope_variant, "get_device", lambda device_id=None: "cpu")


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.lines = []

    def emit(self, record):
        self.lines.append(f"{record.name}: {record.getMessage()}")


def _absorbed(model):
    """Per layer, the absorbed MLA weights post_load_weights derives from kv_b_proj (plain tensors, not parameters,
    so not in the state dict): (w_kc, w_vc)."""
    return [(layer.self_attn.w_kc, layer.self_attn.w_vc) for layer in model.model.layers]


@pytest.fixture(scope="module")
def kimi(harness, tmp_path_factory):
    from safetensors.torch import save_file
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.model_loader.loader import post_load_weights
    from sglang.srt.model_loader.weight_utils import initialize_dummy_weights
    from sglang.srt.models.deepseek_v2 import DeepseekV3ForCausalLM

    ckpt = str(tmp_path_factory.mktemp("kimi_small"))
    # config.json as the GPU run writes it (kimi_shape.py's CLI), read by SGLang's own ModelConfig
    assert kimi_shape.main(["--out", ckpt, "--experts", str(EXPERTS), "--topk", str(TOPK), "--small",
                            "--layers", str(LAYERS)]) == 0
    cfg = _small_cfg()
    with open(os.path.join(ckpt, "config.json")) as f:
        assert json.load(f) == json.loads(json.dumps(cfg)), "kimi_shape.py --small wrote another config"
    model_config = ModelConfig(ckpt, dtype="float32")
    hf_config = model_config.hf_config

    # what load_format="dummy" leaves (DummyModelLoader.load_model; its quant_method.process_weights_after_loading
    # pass does nothing for unquantized weights on a CUDA host, and is left out)
    with harness._default_dtype(model_config.dtype), torch.device("cpu"), _yarn_rope_on_cpu():
        model = harness._construct_model(DeepseekV3ForCausalLM, hf_config).eval()
    initialize_dummy_weights(model)
    post_load_weights(model)
    dummy = {n: t.clone() for n, t in model.state_dict().items() if torch.is_floating_point(t)}
    dummy_absorbed = [(kc.clone(), vc.clone()) for kc, vc in _absorbed(model)]

    # the update: one load_weights call per batch, as update_weights_from_tensor makes it
    batches = list(kimi_shape.layer_batches(cfg, gain=1.0, seed=0, dtype=torch.float32))
    records = _Records()
    sglang_logger = logging.getLogger("sglang")
    sglang_logger.addHandler(records)
    try:
        for batch in batches:
            model.load_weights(batch)
    finally:
        sglang_logger.removeHandler(records)

    # the same tensors as a checkpoint, for transformers
    save_file({n: t.contiguous() for batch in batches for n, t in batch}, os.path.join(ckpt, "model.safetensors"))
    weights = {n: t for batch in batches for n, t in batch}
    return dict(cfg=cfg, hf_config=hf_config, model=model, batches=batches, weights=weights, dummy=dummy,
                dummy_absorbed=dummy_absorbed, warnings=records.lines, ckpt=ckpt)


def expected_sglang_params(cfg: dict, weights: dict) -> dict:
    """SGLang parameter name -> the tensor it must hold after loading checkpoint tensors `weights`, written from the
    checkpoint layout (unquantized, the shared expert not fused into the routed ones: SGLang 0.5.23 fuses it only for
    256 or 384 routed experts): q_a_proj and kv_a_proj_with_mqa stacked into fused_qkv_a_proj_with_mqa; gate_proj
    and up_proj into gate_up_proj (the dense MLP, the shared expert); the routed experts into w13_weight [E, 2I, H]
    (gate rows, then up rows) and w2_weight [E, H, I]; anything else under its own name."""
    w = dict(weights)
    out = {}
    for i in range(cfg["num_hidden_layers"]):
        a = f"model.layers.{i}.self_attn."
        out[a + "fused_qkv_a_proj_with_mqa.weight"] = torch.cat(
            [w.pop(a + "q_a_proj.weight"), w.pop(a + "kv_a_proj_with_mqa.weight")])
        m = f"model.layers.{i}.mlp."
        for mlp in (m, m + "shared_experts."):
            if mlp + "gate_proj.weight" in w:
                out[mlp + "gate_up_proj.weight"] = torch.cat(
                    [w.pop(mlp + "gate_proj.weight"), w.pop(mlp + "up_proj.weight")])
        if m + "experts.0.gate_proj.weight" in w:
            e = [m + f"experts.{k}." for k in range(cfg["n_routed_experts"])]
            out[m + "experts.w13_weight"] = torch.stack(
                [torch.cat([w.pop(x + "gate_proj.weight"), w.pop(x + "up_proj.weight")]) for x in e])
            out[m + "experts.w2_weight"] = torch.stack([w.pop(x + "down_proj.weight") for x in e])
    out.update(w)
    return out


def test_dummy_fill_is_what_the_update_replaces(kimi):
    """The starting point is load_format=dummy's: every float entry within U(-1e-3, 1e-3), norms included."""
    over = {n: t.abs().max().item() for n, t in kimi["dummy"].items() if t.abs().max().item() > DUMMY_BOUND}
    assert not over, f"entries outside the dummy fill's +-{DUMMY_BOUND}: {over}"
    n = len(kimi["batches"])
    assert n == LAYERS + 2, f"expected the embedding, {LAYERS} layers and the head: {LAYERS + 2} batches, got {n}"


def test_loader_takes_every_name_without_a_warning(kimi):
    assert not kimi["warnings"], "SGLang's loader warned while loading kimi_shape's batches:\n" + "\n".join(
        kimi["warnings"])


def test_every_parameter_holds_its_checkpoint_tensors(kimi):
    """Norms, fused q_a/kv_a, dense and shared gate_up, every routed expert's w13 / w2 slices, router weight and
    bias, embedding, lm_head: each SGLang parameter equals what the batches hold for it, bit for bit."""
    params = dict(kimi["model"].named_parameters())
    expected = expected_sglang_params(kimi["cfg"], kimi["weights"])
    assert set(params) == set(expected), (f"SGLang parameters without a checkpoint tensor: "
                                          f"{sorted(set(params) - set(expected))}; checkpoint tensors SGLang has no "
                                          f"parameter for: {sorted(set(expected) - set(params))}")
    wrong = [f"{n}: max |diff| {(params[n].detach() - t.to(params[n].dtype)).abs().max().item():.3g}"
             for n, t in expected.items() if params[n].shape != t.shape or not torch.equal(params[n].detach(), t)]
    assert not wrong, "parameters that differ from their checkpoint tensors:\n" + "\n".join(wrong)


def test_norms_are_one_and_router_bias_zero(kimi):
    """The reshaped target's point: norms at 1 (the dummy fill leaves ~1e-3) and the router bias at 0."""
    params = dict(kimi["model"].named_parameters())
    norms = [n for n in params if n.endswith("norm.weight")]
    assert len(norms) == 4 * LAYERS + 1, norms  # input, post-attention, q_a, kv_a per layer; the final norm
    assert [n for n in norms if not torch.all(params[n] == 1)] == []
    biases = [n for n in params if n.endswith("e_score_correction_bias")]
    assert len(biases) == LAYERS - 1 and all(torch.all(params[n] == 0) for n in biases), biases


def test_routed_experts_slices(kimi):
    """Each routed expert's gate / up / down in its own slice of w13 / w2 (the order FusedMoE's kernel reads)."""
    params = dict(kimi["model"].named_parameters())
    w, inter = kimi["weights"], kimi["cfg"]["moe_intermediate_size"]
    for i in range(1, LAYERS):
        m = f"model.layers.{i}.mlp."
        w13, w2 = params[m + "experts.w13_weight"], params[m + "experts.w2_weight"]
        assert w13.shape[0] == EXPERTS and w2.shape[0] == EXPERTS, (w13.shape, w2.shape)
        for e in range(EXPERTS):
            x = m + f"experts.{e}."
            assert torch.equal(w13[e, :inter], w[x + "gate_proj.weight"]), f"layer {i} expert {e}: gate rows"
            assert torch.equal(w13[e, inter:], w[x + "up_proj.weight"]), f"layer {i} expert {e}: up rows"
            assert torch.equal(w2[e], w[x + "down_proj.weight"]), f"layer {i} expert {e}: down"


def test_absorbed_mla_weights_rederived_from_kv_b_proj(kimi):
    """post_load_weights, run by each load_weights call for the layers whose kv_b_proj came, replaced the dummy
    w_kc / w_vc by kv_b_proj's split: [heads, nope + v, kv_lora] -> w_kc [heads, nope, kv_lora], w_vc
    [heads, kv_lora, v]."""
    cfg = kimi["cfg"]
    nope, v = cfg["qk_nope_head_dim"], cfg["v_head_dim"]
    for i, ((kc, vc), (kc0, vc0)) in enumerate(zip(_absorbed(kimi["model"]), kimi["dummy_absorbed"])):
        kv_b = kimi["weights"][f"model.layers.{i}.self_attn.kv_b_proj.weight"]
        per_head = kv_b.unflatten(0, (cfg["num_attention_heads"], nope + v))
        assert torch.equal(kc, per_head[:, :nope]), f"layer {i}: w_kc is not kv_b_proj's nope rows"
        assert torch.equal(vc, per_head[:, nope:].transpose(1, 2)), f"layer {i}: w_vc is not kv_b_proj's v rows"
        assert bool((kc != kc0).all()) and bool((vc != vc0).all()), f"layer {i}: w_kc / w_vc kept dummy values"


def test_no_dummy_value_left(kimi):
    """Every element of every float state-dict entry changed from the dummy fill: nothing was silently skipped (a
    name the loader dropped, an expert it missed, a fused half never written)."""
    state = kimi["model"].state_dict()
    assert set(state) >= set(kimi["dummy"])
    kept = {n: int((state[n] == t).sum()) for n, t in kimi["dummy"].items() if bool((state[n] == t).any())}
    assert not kept, f"elements still holding their dummy value, per entry: {kept}"


def test_sglang_model_equals_transformers(kimi, harness):
    """The batches written as a checkpoint and loaded by transformers' DeepseekV3 (yarn RoPE, MLA, noaux_tc MoE)
    compute what SGLang's model computes from the same batches: final hidden states (after the final norm) at every
    prompt row and the next-token logits, for a prefill and a decode step (the decode reads the MLA cache through
    the absorbed w_kc / w_vc)."""
    from transformers import DeepseekV3ForCausalLM as HFDeepseekV3

    hf, info = HFDeepseekV3.from_pretrained(kimi["ckpt"], dtype=torch.float32, output_loading_info=True)
    problems = {k: v for k, v in info.items() if v}
    assert not problems, f"transformers did not read the checkpoint as written: {problems}"
    prompt, decode = harness.PROMPT, harness.DECODE_TOKEN
    with torch.no_grad():
        ref = hf.eval()(torch.tensor([prompt + [decode]]), output_hidden_states=True)
    ref_hidden, ref_logits = ref.hidden_states[-1][0], ref.logits[0]  # HF's last hidden_states entry: after the norm

    runner = harness.SglangRunner(kimi["hf_config"])
    pre = runner.forward(kimi["model"], torch.tensor(prompt))
    dec = runner.forward(kimi["model"], torch.tensor([decode]))
    n = len(prompt)
    pairs = {"prefill hidden": (pre.hidden_states, ref_hidden[:n]),
             "prefill logits": (pre.next_token_logits[0], ref_logits[n - 1]),
             "decode hidden": (dec.hidden_states[0], ref_hidden[n]),
             "decode logits": (dec.next_token_logits[0], ref_logits[n])}
    rel = {k: ((a - b).norm() / b.norm()).item() for k, (a, b) in pairs.items()}
    assert all(v <= REL_TOL for v in rel.values()), f"SGLang vs transformers, relative error (tol {REL_TOL}): {rel}"


# ----------------------------------------------------------------------------------------------------------------
# layer_batches itself
# ----------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("gain", [0, -1.0, 4.5, float("nan"), float("inf"), "1.0", None, True])
def test_layer_batches_rejects_a_bad_gain_at_the_call(gain):
    with pytest.raises(ValueError, match=re.escape(f"gain must be in (0, 4], got {gain!r}")):
        kimi_shape.layer_batches(_small_cfg(), gain=gain)  # not at the first batch: no next() needed


def _flat(cfg, **kw):
    return [(n, t) for batch in kimi_shape.layer_batches(cfg, dtype=torch.float32, **kw) for n, t in batch]


def _is_random(name: str) -> bool:
    return not (name.endswith("norm.weight") or name.endswith("e_score_correction_bias"))


def test_layer_batches_reproducible_by_seed():
    """The same seed gives bit-identical tensors in the same order (every server and rank sends the same target);
    another seed changes every random tensor; the gain scales them; same-shaped tensors of different layers differ
    (the dummy fill's failing)."""
    cfg = _small_cfg()
    a, b, other = _flat(cfg, gain=1.0, seed=0), _flat(cfg, gain=1.0, seed=0), _flat(cfg, gain=1.0, seed=1)
    assert [n for n, _ in a] == [n for n, _ in b] == [n for n, _ in other]
    assert [n for (n, x), (_, y) in zip(a, b) if not torch.equal(x, y)] == []
    same = [n for (n, x), (_, y) in zip(a, other) if _is_random(n) and torch.equal(x, y)]
    assert same == [], f"tensors that seed 1 left as seed 0 made them: {same}"
    doubled = dict(_flat(cfg, gain=2.0, seed=0))
    off = [n for n, x in a if _is_random(n) and n != "model.embed_tokens.weight"
           and not torch.allclose(doubled[n], 2 * x, rtol=1e-6, atol=0)]
    assert off == [], f"gain 2 is not twice gain 1 for: {off}"
    by_name = dict(a)
    for suffix in ("self_attn.q_b_proj.weight", "mlp.experts.0.gate_proj.weight", "mlp.gate.weight"):
        x, y = by_name[f"model.layers.1.{suffix}"], by_name[f"model.layers.2.{suffix}"]
        assert x.shape == y.shape and not torch.equal(x, y), f"layers 1 and 2 share {suffix}"
