"""The wiring proof, end to end: SGLang's real DeepseekV3ForCausalLM (weights loaded from a seeded transformers
DeepseekV3 through its load_weights) runs prefill and a decode step on the CPU; every slot of SGLang's captured aux
buffer must equal the HF hidden state at the tap the draft declares. The same run without the plugin (a fresh
process) records what stock SGLang 0.5.23 captures instead."""

import pytest
import torch

from scenarios import run_script
from sglang_fixtures import OpCounter, harness, require_sglang, sglang_plugin, tiny  # noqa: F401  (fixtures)

pytestmark = pytest.mark.sglang

# [embedding, two middle layers, the final boundary] of the 6-layer tiny model, as EAGLE draft ids
DECLARED = [-1, 1, 3, 5]
ATOL = 2e-5  # fp32: SGLang's MLA / MoE kernels vs HF's eager modules, measured ~3e-7


def _slots(aux, H):
    assert aux.dim() == 2 and aux.shape[1] % H == 0
    return [aux[:, s * H:(s + 1) * H] for s in range(aux.shape[1] // H)]


def _assert_slots_equal(aux, refs, what):
    H = refs[0].shape[1]
    slots = _slots(aux, H)
    assert len(slots) == len(refs), f"{what}: {len(slots)} slots, expected {len(refs)}"
    for s, (got, want) in enumerate(zip(slots, refs)):
        err = (got - want).abs().max().item()
        assert err <= ATOL, f"{what}: slot {s} differs from its HF tap by {err}"


def _rows(harness):
    n = len(harness.PROMPT)
    return slice(0, n), slice(n, n + 1)


def test_wiring_with_plugin_every_slot_is_the_declared_tap(harness, tiny, sglang_plugin):
    model, cfg, taps = tiny["model"], tiny["cfg"], tiny["taps"]
    model.set_eagle3_layers_to_capture(list(DECLARED))
    assert model.model.layers_to_capture == [0, 2, 4, 6]  # 6 = the final boundary, past SGLang's loop
    counter = OpCounter()
    with counter:
        prefill, decode = harness.run_sequence(model, cfg)
    pre_rows, dec_rows = _rows(harness)
    refs = [taps[harness.tap_index(d)] for d in DECLARED]
    _assert_slots_equal(prefill.hidden_states, [r[pre_rows] for r in refs], "prefill")
    _assert_slots_equal(decode.hidden_states, [r[dec_rows] for r in refs], "decode")
    # the final boundary is the residual stream BEFORE the final norm, not HF's last (post-norm) entry
    H = cfg.hidden_size
    post_norm = tiny["hf"].model.norm(taps[-1])
    assert (prefill.hidden_states[:, 3 * H:] - post_norm[pre_rows]).abs().max() > 1e-2
    # every capture went through the fused op: K per forward, and SGLang's model is HF's model
    assert counter.counts["eagle3_capture.capture_.default"] == 2 * len(DECLARED), counter.counts
    assert (prefill.next_token_logits[0] - tiny["logits"][len(harness.PROMPT) - 1]).abs().max() < 1e-4
    assert (decode.next_token_logits[0] - tiny["logits"][-1]).abs().max() < 1e-4


@pytest.fixture(scope="module")
def native(harness, tmp_path_factory):
    out = tmp_path_factory.mktemp("native") / "native.pt"
    run_script("native", out, {"SGLANG_PLUGINS": "none-eagle3-capture-test"})
    return torch.load(out)


def test_without_plugin_stock_sglang_drops_and_shifts(harness, tiny, native):
    """Stock 0.5.23 keeps [-1, 1, 3, 5] as layer inputs: -1 never matches (embedding dropped), 1/3/5 capture the
    inputs of layers 1/3/5 = outputs of layers 0/2/4 (each tap one layer early, the final boundary lost), and the
    packer then refuses the forward."""
    from eagle3_capture.sglang_rules import sglang_0523_native_capture
    from eagle3_capture.spec import LayerOutput

    taps, H = tiny["taps"], tiny["cfg"].hidden_size
    rec = native[str(DECLARED)]
    assert rec["layers_to_capture"] == DECLARED
    predicted = sglang_0523_native_capture(DECLARED, 6, H)
    assert predicted.captured_taps == (LayerOutput(0), LayerOutput(2), LayerOutput(4))
    assert predicted.error == "RuntimeError: captured 3 of 4 aux hidden states"
    for step, rows in zip(rec["steps"], _rows(harness)):
        assert step["aux"] is None and step["error"] == "captured 3 of 4 aux hidden states"
        # what it had packed before refusing: the three shifted taps (HF index k+1 = LayerOutput(k))
        _assert_slots_equal(step["packed"], [taps[1][rows], taps[3][rows], taps[5][rows]], "stock SGLang")


def test_without_plugin_ids_not_starting_at_1_are_shifted(harness, tiny, sglang_plugin, native):
    """Draft ids [0, 2, 4] (outputs of layers 0, 2, 4): stock SGLang completes but serves Embedding, LayerOutput(1),
    LayerOutput(3); with the plugin each slot is the declared tap."""
    taps = tiny["taps"]
    ids = [0, 2, 4]
    rec = native[str(ids)]
    assert rec["layers_to_capture"] == ids
    model, cfg = tiny["model"], tiny["cfg"]
    model.set_eagle3_layers_to_capture(ids)
    assert model.model.layers_to_capture == [1, 3, 5]
    outs = harness.run_sequence(model, cfg)
    for step, out, rows in zip(rec["steps"], outs, _rows(harness)):
        assert step["error"] is None
        _assert_slots_equal(step["aux"], [taps[0][rows], taps[2][rows], taps[4][rows]], "stock SGLang")
        _assert_slots_equal(out.hidden_states, [taps[harness.tap_index(d)][rows] for d in ids], "plugin")
        assert (step["aux"] - out.hidden_states).abs().max() > 1e-2


def test_idle_batch_keeps_k_slots(harness, sglang_plugin):
    """An idle batch (no tokens, no final norm) still returns a [0, K*H] aux buffer with the final boundary."""
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch, ForwardMode
    from sglang.srt.model_executor.forward_context import ForwardContext, forward_context

    cfg = harness.tiny_config(first_k_dense_replace=6)  # SGLang's CPU MoE cannot take 0 tokens
    model = harness.build_sglang(cfg, harness.build_hf(cfg))
    model.set_eagle3_layers_to_capture(list(DECLARED))
    r = harness.SglangRunner(cfg)
    e = torch.empty(0, dtype=torch.int64)
    fb = ForwardBatch(forward_mode=ForwardMode.IDLE, batch_size=0, input_ids=e, req_pool_indices=e.int(),
                      seq_lens=e.int(), seq_lens_cpu=e.int(), out_cache_loc=e, seq_lens_sum=0, positions=e)
    fb.capture_hidden_mode = CaptureHiddenMode.FULL
    with torch.no_grad(), forward_context(ForwardContext(attn_backend=r.backend)):
        r.backend.init_forward_metadata(fb)
        hidden, aux = model.model(fb.input_ids, fb.positions, fb)
    assert hidden.shape == (0, cfg.hidden_size) and aux.shape == (0, len(DECLARED) * cfg.hidden_size)
