"""SGLang's EAGLE-3 draft models on the CPU, with the plugin's fused draft fc (ops.draft_fc) and with SGLang's own
forward (the original the registry keeps in __wrapped__): same outputs. Covers Eagle3MLAModel (Kimi-K2.5 / MLA
drafts) with and without fc_norm, and llama_eagle3's LlamaForCausalLMEagle3 without norms, with fc_norm, with
norm_before_fc, and with both."""
import logging

import pytest
import torch

from scenarios import run_ranks
from sglang_fixtures import OpCounter, harness, require_sglang, sglang_plugin, tiny  # noqa: F401  (fixtures)

pytestmark = pytest.mark.sglang

VARIANTS = [
    pytest.param("mla", dict(fc_norm=True), id="Eagle3MLAModel-fc_norm"),
    pytest.param("mla", dict(fc_norm=False), id="Eagle3MLAModel"),
    pytest.param("mha", dict(), id="LlamaEagle3"),
    pytest.param("mha", dict(fc_norm=True), id="LlamaEagle3-fc_norm"),
    pytest.param("mha", dict(norm_before_fc=True), id="LlamaEagle3-norm_before_fc"),
    pytest.param("mha", dict(fc_norm=True, norm_before_fc=True), id="LlamaEagle3-fc_norm-norm_before_fc"),
]
TOL = {torch.float32: 2e-5, torch.bfloat16: 2e-2}


@pytest.fixture(scope="module")
def draft_hooks_on(sglang_plugin):
    from eagle3_capture.sglang import draft

    assert draft.unavailable() is None, draft.unavailable()
    assert sglang_plugin.hook_status()["draft_fc"] == "on", sglang_plugin.hook_status()
    return draft


def _build(harness, kind, kw, dtype):
    return (harness.build_mla_draft if kind == "mla" else harness.build_llama_draft)(dtype=dtype, **kw)


def _first_layer(model):
    return model.model.midlayer if hasattr(model.model, "midlayer") else model.model.layers[0]


def _fc_input_of_layer(harness, model, cfg, x, kind, forward=None):
    """The hidden states SGLang's draft layer receives, i.e. the fc output (recorded by a forward pre-hook)."""
    seen = {}

    def pre(module, args):
        seen["h"] = args[2].clone()  # (positions, embeds, hidden_states, forward_batch, ...)

    handle = _first_layer(model).register_forward_pre_hook(pre)
    try:
        out, spec_info = harness.run_draft(model, cfg, x, kind, forward=forward)
    finally:
        handle.remove()
    return seen["h"], out, spec_info


@pytest.mark.parametrize("kind, kw", VARIANTS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_draft_with_fused_fc_equals_sglang(harness, draft_hooks_on, kind, kw, dtype):
    cfg, model = _build(harness, kind, kw, dtype)
    K, H = 4, cfg.hidden_size
    x = harness.target_features(len(harness.PROMPT), H, K, dtype=dtype)
    counter = OpCounter()
    with counter:
        fc_got, out_got, spec_info = _fc_input_of_layer(harness, model, cfg, x, kind)
    assert counter.counts["eagle3_capture.draft_fc.default"] == 1, counter.counts
    assert spec_info.hidden_states is x  # the packed capture is handed back untouched
    stock = type(model.model).forward.__wrapped__
    fc_want, out_want, _ = _fc_input_of_layer(harness, model, cfg, x, kind, forward=stock)
    tol = TOL[dtype]
    scale = max(1.0, fc_want.float().abs().max().item())
    assert (fc_got.float() - fc_want.float()).abs().max().item() <= tol * scale, "fc output"
    for a, b in ((out_got[0], out_want[0]), (out_got[1][0], out_want[1][0])):
        scale = max(1.0, b.float().abs().max().item())
        assert (a.float() - b.float()).abs().max().item() <= tol * scale, "draft output"


def test_norms_matter_in_this_test(harness, draft_hooks_on):
    """Guard against a vacuous comparison: the per-tap norms change the fc output for these features."""
    cfg_n, with_norm = harness.build_llama_draft(fc_norm=True)
    cfg_p, plain = harness.build_llama_draft(fc_norm=False)
    x = harness.target_features(len(harness.PROMPT), cfg_n.hidden_size, 4)
    a, _, _ = _fc_input_of_layer(harness, with_norm, cfg_n, x, "mha")
    b, _, _ = _fc_input_of_layer(harness, plain, cfg_p, x, "mha")
    assert (a - b).abs().max() > 0.1


def test_unfusable_draft_falls_back_to_sglang(harness, draft_hooks_on, caplog):
    """fc_norm with per-tap eps that differ: the op takes one eps, so SGLang's own fc runs (said once)."""
    cfg, model = harness.build_mla_draft(fc_norm=True)
    model.model.fc_norm[1].variance_epsilon = 1e-3
    x = harness.target_features(len(harness.PROMPT), cfg.hidden_size, 4)
    counter = OpCounter()
    with caplog.at_level(logging.WARNING, logger="eagle3_capture.sglang"), counter:
        got, _, _ = _fc_input_of_layer(harness, model, cfg, x, "mla")
    assert counter.counts["eagle3_capture.draft_fc.default"] == 0
    assert any("fc runs SGLang's own code: fc_norm eps differ" in r.getMessage() for r in caplog.records)
    want, _, _ = _fc_input_of_layer(harness, model, cfg, x, "mla", forward=type(model.model).forward.__wrapped__)
    assert torch.equal(got, want)


def test_draft_decode_inputs_skip_the_fc(harness, draft_hooks_on):
    """Draft decode steps feed the draft's own H-wide states: no fc, no op call (as in SGLang)."""
    cfg, model = harness.build_mla_draft(fc_norm=True)
    x = harness.target_features(len(harness.PROMPT), cfg.hidden_size, 1)
    counter = OpCounter()
    with counter:
        got, _, spec_info = _fc_input_of_layer(harness, model, cfg, x, "mla")
    assert counter.counts["eagle3_capture.draft_fc.default"] == 0
    assert torch.equal(got, x) and spec_info.hidden_states is x


def test_draft_fc_at_tp2_gathers_column_shards_with_the_projects_gatherer(harness, tmp_path):
    """TP = 2 on the CPU (two processes, gloo): SGLang's Eagle3MLAModel with its fc column-sharded ([N/2, K*H] per
    rank, full weights loaded through the parameters' own weight loaders). With the plugin, the fused fc's [T, N/2]
    shards are gathered by eagle3_capture.tp.PackedGatherer (layout "columns"); the result equals the float64
    reference of the whole fc and SGLang's own path (its _fc_gatherer) on every rank."""
    import json

    run_ranks("draft_tp", tmp_path, 2)
    for rank in range(2):
        rep = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert rep["fc_shard"] == [32, 256], rep
        assert rep["gatherer"] == "PackedGatherer" and rep["backend"] == "gloo", rep
        assert rep["shape"] == [len(harness.PROMPT), 64], rep
        assert rep["plugin_vs_reference"] < 2e-5 and rep["sglang_vs_reference"] < 2e-5, rep
        assert rep["plugin_vs_sglang"] < 2e-5, rep
