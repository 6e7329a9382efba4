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


def test_draft_fc_at_tp2_gathers_column_shards_with_sglangs_communicator_off_p2p(harness, tmp_path):
    """TP = 2 on the CPU (two processes, gloo): SGLang's Eagle3MLAModel with its fc column-sharded ([N/2, K*H] per
    rank, full weights loaded through the parameters' own weight loaders). With the plugin, the fused fc's [T, N/2]
    shards are gathered by SGLang's own _fc_gatherer: the project's gatherer replaces it only where its p2p kernel
    runs (gloo here, like NCCL on a GPU box without peer access, leaves SGLang's communicator in charge, which is
    what SGLang captures in its graphs). The result equals the float64 reference of the whole fc and SGLang's own
    path on every rank."""
    import json

    from sglang.srt.layers.linear import ColumnParallelLinear

    _, probe = harness.build_mla_draft(fc_norm=True, fill=False)  # skips where the MLA draft has no fc_norm
    if not isinstance(probe.model.fc, ColumnParallelLinear):
        harness.skip_missing_feature(f"column-parallel fc in kimi_k25_eagle3.Eagle3MLAModel (its fc is a "
                                     f"{type(probe.model.fc).__name__}: not sharded over TP ranks)")
    run_ranks("draft_tp", tmp_path, 2)
    for rank in range(2):
        rep = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert rep["fc_shard"] == [32, 256], rep
        assert rep["gatherer"] == "'off'" and rep["backend"] is None, rep
        assert rep["shape"] == [len(harness.PROMPT), 64], rep
        assert rep["plugin_vs_reference"] < 2e-5 and rep["sglang_vs_reference"] < 2e-5, rep
        assert rep["plugin_vs_sglang"] < 2e-5, rep


@pytest.mark.parametrize("kind, kw", [pytest.param("mla", dict(fc_norm=True), id="Eagle3MLAModel-fc_norm"),
                                      pytest.param("mha", dict(fc_norm=True), id="LlamaEagle3-fc_norm")])
def test_fc_norm_weights_loaded_in_place_reach_the_fused_fc(harness, draft_hooks_on, kind, kw):
    """RL weight sync: SGLang's update-weights paths load new weights into the existing parameters through the
    model's own load_weights (`param.data.copy_`, which leaves the parameter's version counter alone). The fused fc
    must then use the new fc_norm weights, as SGLang's own forward does; the stack it reads is the parameters'
    storage, which is what CUDA graphs bake in (tests/test_graphs_draft_fc_cuda.py replays graphs across such an
    update)."""
    cfg, model = _build(harness, kind, kw, torch.float32)
    K, H = 4, cfg.hidden_size
    x = harness.target_features(len(harness.PROMPT), H, K)
    before, _, _ = _fc_input_of_layer(harness, model, cfg, x, kind)
    g = torch.Generator().manual_seed(77)
    model.load_weights([(f"fc_norm.{k}.weight", 0.5 + torch.rand(H, generator=g)) for k in range(K)])
    counter = OpCounter()
    with counter:
        got, _, _ = _fc_input_of_layer(harness, model, cfg, x, kind)
    assert counter.counts["eagle3_capture.draft_fc.default"] == 1, counter.counts
    want, _, _ = _fc_input_of_layer(harness, model, cfg, x, kind, forward=type(model.model).forward.__wrapped__)
    assert (want - before).abs().max() > 0.05, "the update must change the fc output for this test to mean anything"
    assert (got - want).abs().max() <= 2e-5 * max(1.0, want.abs().max().item())
    stack = model.model.__dict__[draft_hooks_on._CACHE_ATTR]
    assert all(n.weight.data_ptr() == stack[k].data_ptr() for k, n in enumerate(model.model.fc_norm))


class _Gatherer:
    """Stands in for a PackedGatherer whose backend the plan and probe decided (what _build_gatherer reads)."""

    def __init__(self, backend, reason):
        from types import SimpleNamespace

        self.backend, self.plan, self.closed = backend, SimpleNamespace(reason=reason), False
        self.signal, self.hidden_size, self.max_rows_per_rank, self.timeout_s = "atomic", 64, 512, 600.0

    def close(self):
        self.closed = True


@pytest.mark.parametrize("backend", ["nccl", "gloo", "p2p"])
def test_only_a_p2p_gatherer_replaces_sglangs_communicator(draft_hooks_on, monkeypatch, backend):
    """Where the plan or the probe leaves NCCL (or gloo), SGLang's own _fc_gatherer does the gather: under SGLang's
    graph_capture that is its GroupCoordinator / pynccl, never torch's ProcessGroupNCCL recorded into its graphs."""
    from types import SimpleNamespace

    from eagle3_capture import tp

    made = []

    def fake(*args, **kwargs):
        made.append(kwargs)
        return _Gatherer(backend, "p2p probe failed: rank 1: simulated")

    monkeypatch.setattr(tp, "PackedGatherer", fake)
    model = SimpleNamespace()
    group = SimpleNamespace(device_group=object(), world_size=2)
    state = draft_hooks_on._build_gatherer(model, group, torch.zeros(4, 32), 2)
    assert made and made[0]["timeout_s"] == tp.default_timeout_s() == 600.0
    if backend == "p2p":
        assert isinstance(state, _Gatherer) and not state.closed
    else:
        assert state == draft_hooks_on._GATHER_OFF


class _FailedGather:
    def __init__(self, why):
        self.why = why

    def failure(self):
        return self.why


def test_gather_poll_hook_raises_a_gather_timeout_around_the_draft_extend(draft_hooks_on, monkeypatch):
    """The poll AROUND the EAGLE worker's draft extend: nothing failed -> the call runs; a gather of an earlier
    replay timed out -> GatherTimeout before the call; a CUDA error from inside the call while a gather's error word
    is set -> the GatherTimeout that explains it, chained to the CUDA error."""
    import weakref

    from eagle3_capture import tp

    monkeypatch.setattr(tp, "_LIVE_P2P", weakref.WeakSet())
    calls = []
    assert draft_hooks_on.gather_poll_hook(lambda self, *a: calls.append(a) or "out", None, 1, 2) == "out"
    failed = _FailedGather("rank 0 timed out after 600 s in gather #9, waiting for the peer to enter the gather "
                           "(rank 3)")
    tp._LIVE_P2P.add(failed)
    with pytest.raises(tp.GatherTimeout, match="gather #9.*rank 3"):
        draft_hooks_on.gather_poll_hook(lambda self, *a: calls.append(a), None, 3)
    assert calls == [(1, 2)]
    tp._LIVE_P2P.discard(failed)
    late = _FailedGather(None)
    tp._LIVE_P2P.add(late)

    def replay_fails(self):
        late.why = "rank 0 timed out after 600 s in gather #10, waiting for the peer's rows to arrive (rank 1)"
        raise RuntimeError("CUDA error: unspecified launch failure")

    with pytest.raises(tp.GatherTimeout, match="gather #10") as info:
        draft_hooks_on.gather_poll_hook(replay_fails, None)
    assert "unspecified launch failure" in str(info.value.__cause__)
    tp._LIVE_P2P.discard(late)


def test_gather_hooks_target_sglangs_draft_extend():
    """The poll's dotted paths name methods the installed SGLang has (the load test checks they are hooked)."""
    import pkgutil

    from eagle3_capture.sglang import draft
    from eagle3_capture.sglang.installed import internals

    hooks = draft.gather_hooks(internals.current())
    assert hooks or not internals.current().mla_fc_sharded, "a sharded MLA fc and no draft extend to poll"
    for path, hook in hooks:
        obj_path, attr = path.rsplit(".", 1)
        assert callable(getattr(pkgutil.resolve_name(obj_path), attr)), path
        assert hook is draft.gather_poll_hook


def test_the_fc_hook_reads_the_build_info_once(harness, draft_hooks_on, monkeypatch):
    """The extension's build info (a JSON parse and device queries) does not change in a process: the fc hook, which
    runs at every draft extend, reads it once, not at every call."""
    from eagle3_capture import native

    calls = []
    real = native.build_info
    monkeypatch.setattr(native, "build_info", lambda: calls.append(1) or real())
    monkeypatch.setattr(draft_hooks_on, "_backend_list", None, raising=False)  # (read anew here)
    cfg, model = harness.build_llama_draft(fc_norm=True)
    x = harness.target_features(3, cfg.hidden_size, 4)
    with torch.no_grad():
        outs = [draft_hooks_on._llama_fc(model.model, x) for _ in range(3)]
    assert all(o is not None for o in outs) and len(calls) == 1, calls


def _fc_forms(harness):
    """(name, draft model, hook compute) for each form the hooks call the op in."""
    from eagle3_capture.sglang import draft

    forms = []
    for name, kind, kw in (("mla fc_norm", "mla", dict(fc_norm=True)), ("llama plain", "mha", {}),
                           ("llama input_norm", "mha", dict(norm_before_fc=True)),
                           ("llama fc_norm + input_norm", "mha", dict(fc_norm=True, norm_before_fc=True))):
        _, model = _build(harness, kind, kw, torch.float32)
        model.requires_grad_(False)  # as SGLang's weights (the inference-only check is tested on its own)
        forms.append((name, model.model, draft._mla_fc if kind == "mla" else draft._llama_fc))
    return forms


def test_the_fc_hook_calls_the_op_as_the_api_does_bit_for_bit(harness, draft_hooks_on):
    """With grad mode off (SGLang's forwards) the hook calls torch.ops.eagle3_capture.draft_fc itself; with it on, it
    goes through ops.draft_fc and its inference-only check. Same bits either way, in every form."""
    x = harness.target_features(5, 64, 4)
    for name, inner, fc in _fc_forms(harness):
        with torch.no_grad():
            fast = fc(inner, x)
        slow = fc(inner, x)  # grad mode on: ops.draft_fc
        assert fast is not None and torch.equal(fast, slow), name
    _, inner, fc = _fc_forms(harness)[1]
    inner.fc.weight.requires_grad_(True)
    with pytest.raises(RuntimeError, match="inference-only"):
        fc(inner, x)


def test_the_fc_plan_follows_module_changes(harness, draft_hooks_on):
    """What the op can take is decided once per set of modules and decided again when one changes: an fc_norm eps,
    a norm module, the fc module, K."""
    from sglang.srt.layers.layernorm import RMSNorm

    cfg, model = harness.build_mla_draft(fc_norm=True)
    inner = model.model
    x = harness.target_features(3, cfg.hidden_size, 4)
    fc = draft_hooks_on._mla_fc
    with torch.no_grad():
        assert fc(inner, x) is not None
        inner.fc_norm[1].variance_epsilon = 1e-3
        assert fc(inner, x) is None  # eps differ across taps
        inner.fc_norm[1].variance_epsilon = inner.fc_norm[0].variance_epsilon
        assert fc(inner, x) is not None
        old = inner.fc_norm[2]
        inner.fc_norm[2] = RMSNorm(cfg.hidden_size, eps=old.variance_epsilon, cast_x_before_out_mul=True)
        assert fc(inner, x) is None
        inner.fc_norm[2] = torch.nn.LayerNorm(cfg.hidden_size)  # not an RMSNorm, no variance_epsilon
        assert fc(inner, x) is None
        inner.fc_norm[2] = old
        assert fc(inner, x) is not None
        inner.num_aux_hidden_states = 2  # 4 fc_norm modules for 2 taps
        assert fc(inner, x) is None
        inner.num_aux_hidden_states = 4
        old_fc = inner.fc
        quantized = torch.nn.Linear(4 * cfg.hidden_size, cfg.hidden_size)
        quantized.quant_method = type("Fp8LinearMethod", (), {})()
        inner.fc = quantized
        assert fc(inner, x) is None
        inner.fc = old_fc
        assert fc(inner, x) is not None


def test_a_norm_weight_replaced_by_a_new_tensor_reaches_the_fused_fc(harness, draft_hooks_on):
    """A fc_norm weight replaced by another parameter (not loaded in place) after the first call: its values are
    copied into its row of the stack the op reads (the same stack: graphs hold its pointer) and used."""
    cfg, model = harness.build_llama_draft(fc_norm=True)
    inner = model.model
    K, H = 4, cfg.hidden_size
    x = harness.target_features(3, H, K)
    with torch.no_grad():
        before = draft_hooks_on._llama_fc(inner, x)
        stack = inner.__dict__[draft_hooks_on._CACHE_ATTR]
        inner.fc_norm[2].weight = torch.nn.Parameter(inner.fc_norm[2].weight.detach() * 3.0)
        got = draft_hooks_on._llama_fc(inner, x)
        assert inner.__dict__[draft_hooks_on._CACHE_ATTR] is stack
        want = draft_hooks_on.fused_fc(x, inner.fc.weight, torch.stack([n.weight.detach() for n in inner.fc_norm]),
                                       inner.fc_norm[0].variance_epsilon, inner.fc.bias)
    assert torch.equal(got, want) and not torch.equal(got, before)
    assert all(n.weight.data_ptr() == stack[k].data_ptr() for k, n in enumerate(inner.fc_norm))
