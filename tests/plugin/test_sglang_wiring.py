"""The wiring proof, end to end: SGLang's real DeepseekV3ForCausalLM (weights loaded from a seeded transformers
DeepseekV3 through its load_weights) runs prefill and a decode step on the CPU; every slot of SGLang's captured aux
buffer must equal the HF hidden state at the tap the draft declares. The same run without the plugin (a fresh
process) records what stock SGLang (the installed release) captures instead."""

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
    # every capture went through the fused op where the release hands out a packed slot (0.5.23): K per forward;
    # elsewhere SGLang's own copy stays (the taps above are exact either way). SGLang's model is HF's model.
    fused = "capture" in sglang_plugin.registered
    assert counter.counts["eagle3_capture.capture_.default"] == (2 * len(DECLARED) if fused else 0), counter.counts
    assert (prefill.next_token_logits[0] - tiny["logits"][len(harness.PROMPT) - 1]).abs().max() < 1e-4
    assert (decode.next_token_logits[0] - tiny["logits"][-1]).abs().max() < 1e-4


@pytest.fixture(scope="module")
def native(harness, tmp_path_factory):
    out = tmp_path_factory.mktemp("native") / "native.pt"
    run_script("native", out, {"SGLANG_PLUGINS": "none-eagle3-capture-test"})
    return torch.load(out)


def _stock_captured(stored):
    """Layer inputs stock SGLang captures from `stored` (its layers_to_capture), in slot order: every i of 0..L-1
    its layer loop meets (an entry outside that range never matches; a repeated one matches once)."""
    return [i for i in range(6) if i in stored]


def test_without_plugin_stock_sglang_misses_the_declared_taps(harness, tiny, native):
    """Draft ids [-1, 1, 3, 5] (Embedding and LayerOutput(1), (3), (5)): stock SGLang stores them by the installed
    release's own rule (asked of its real set_eagle3_layers_to_capture: 0.5.23 keeps them, 0.5.12 adds 1 to each)
    and serves no forward with the declared taps: it refuses it (0.5.18 on: the packer's count check, -1 never
    matching; 0.5.12: layer input 0 with a residual still None) or captures other taps. Whatever it did capture is
    the HF hidden state at each layer input it stored."""
    taps = tiny["taps"]
    rec = native[str(DECLARED)]
    stored = harness.stock_layers_to_capture(DECLARED, 6)
    assert rec["layers_to_capture"] == stored
    captured = _stock_captured(stored)
    for step, rows in zip(rec["steps"], _rows(harness)):
        declared = [taps[harness.tap_index(d)][rows] for d in DECLARED]
        if step["error"] is None:
            got = _slots(step["aux"], tiny["cfg"].hidden_size)
            assert len(got) != len(declared) or any((g - w).abs().max() > 1e-2 for g, w in zip(got, declared))
        if step["packed"] is not None:  # what it had captured (before refusing, where it refused)
            _assert_slots_equal(step["packed"], [taps[i][rows] for i in captured], "stock SGLang")


def test_the_doctors_model_of_this_releases_stock_sglang(harness, tiny, native):
    """eagle3_capture.sglang_releases' model of the installed release (what `doctor check --sglang-version X` reports)
    is what that release's stock SGLang does, on [-1, 1, 3, 5] and [0, 2, 4]: the layer inputs it stores, the HF
    hidden states it captures, and the error it raises at the target forward (0.5.12: TypeError at layer input 0;
    0.5.17-0.5.19: the packer's AssertionError; 0.5.20 on: its RuntimeError) or, where a short list goes on to the
    draft's fc (0.5.13-0.5.16), no error at the target forward."""
    from eagle3_capture.sglang_releases import ERROR_AT_FORWARD, native_capture

    taps, H = tiny["taps"], tiny["cfg"].hidden_size
    version = harness.sglang_release()
    for ids in (list(DECLARED), [0, 2, 4]):
        rec = native[str(ids)]
        predicted = native_capture(ids, 6, H, version)
        assert rec["layers_to_capture"] == list(predicted.stored), (version, ids, predicted)
        captured = [taps[i] for i in predicted.captured_inputs]
        for step, rows in zip(rec["steps"], _rows(harness)):
            if predicted.error_at == ERROR_AT_FORWARD:
                # the model's error is SGLang's, word for word, plus a parenthesis saying why
                said = step["error"] or ""
                assert said and (predicted.error == said or predicted.error.startswith(said + " (")), \
                    (version, ids, step["error"], predicted.error)
                assert step["aux"] is None
            else:
                assert step["error"] is None, (version, ids, step["error"], predicted)
                _assert_slots_equal(step["aux"], [t[rows] for t in captured], f"stock SGLang {version} {ids}")
            if step["packed"] is not None:  # what it had captured (before refusing, where it refused)
                _assert_slots_equal(step["packed"], [t[rows] for t in captured], f"stock SGLang {version} {ids}")


def test_without_plugin_ids_not_starting_at_1_are_shifted(harness, tiny, sglang_plugin, native):
    """Draft ids [0, 2, 4] (outputs of layers 0, 2, 4): stock SGLang completes, serving the layer inputs its rule
    stored (0.5.14 on: [0, 2, 4] = Embedding, LayerOutput(1), LayerOutput(3); 0.5.12: [1, 3, 5], the declared
    taps); with the plugin each slot is the declared tap."""
    taps = tiny["taps"]
    ids = [0, 2, 4]
    rec = native[str(ids)]
    stored = harness.stock_layers_to_capture(ids, 6)
    assert rec["layers_to_capture"] == stored
    model, cfg = tiny["model"], tiny["cfg"]
    model.set_eagle3_layers_to_capture(ids)
    assert model.model.layers_to_capture == [1, 3, 5]
    outs = harness.run_sequence(model, cfg)
    for step, out, rows in zip(rec["steps"], outs, _rows(harness)):
        assert step["error"] is None
        _assert_slots_equal(step["aux"], [taps[i][rows] for i in stored], "stock SGLang")
        _assert_slots_equal(out.hidden_states, [taps[harness.tap_index(d)][rows] for d in ids], "plugin")
        # stock differs from the plugin exactly where its rule stored other layer inputs than the plugin's
        differs = bool((step["aux"] - out.hidden_states).abs().max() > 1e-2)
        assert differs == (stored != [1, 3, 5]), (stored, differs)


def test_idle_batch_keeps_k_slots(harness, sglang_plugin):
    """An idle batch (no tokens, no final norm) still returns a [0, K*H] aux buffer with the final boundary."""
    cfg = harness.tiny_config(first_k_dense_replace=6)  # SGLang's CPU MoE cannot take 0 tokens
    model = harness.build_sglang(cfg, harness.build_hf(cfg))
    model.set_eagle3_layers_to_capture(list(DECLARED))
    r = harness.SglangRunner(cfg)
    hidden, aux = r.run(lambda b: model.model(b.input_ids, b.positions, b), r.idle_batch())
    aux = harness.packed_aux(aux)
    assert hidden.shape == (0, cfg.hidden_size) and aux.shape == (0, len(DECLARED) * cfg.hidden_size)
