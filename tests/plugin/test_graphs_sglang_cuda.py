"""The plugin's hooks on SGLang 0.5.23's real classes, on CUDA tensors, inside CUDA graphs captured and replayed the
way SGLang's runners do (tests/graph_protocol.py: two eager warm-ups on the capture stream, every batch size's graph
in one pool, largest first, replays in random order with new inputs), each replay against the float64 reference.
Markers `cuda` and `sglang`: they run wherever SGLang imports on a GPU (the GPU machine has no SGLang of its own; see
docs/status.md for how they are run there).

- the capture write: SGLang's AuxHiddenStatePacker (the plugin's append hook in place) writing the decode graph
  runner's preallocated [max_tokens, K*H] buffer, as `AuxHiddenStatePacker.for_batch` hands it each batch size;
- the draft fc: SGLang's Eagle3MLAModel (fc_norm + ColumnParallelLinear + its _fc_gatherer) and LlamaEagle3 (plain,
  fc_norm, norm_before_fc) in bf16, through the functions the plugin's forward hooks call, with the draft's fc_norm
  weights updated in place between replays through the model's own `load_weights` (SGLang's update-weights path).

Not covered here: SGLang's full target forward (attention, the final norm's residual stream) inside its own graph
runner; that is the real serving loop's comparison, graphs on against off (scripts/gpu_sglang.sh).
"""
import pytest
import torch

from eagle3_capture import reference
from graph_protocol import GraphRunner, random_order
from sglang_fixtures import OpCounter, harness, require_sglang, sglang_plugin  # noqa: F401  (fixtures)

pytestmark = [pytest.mark.cuda, pytest.mark.sglang]

BATCHES = [1, 2, 4, 8, 12, 16]


def test_packer_append_hook_writes_the_decode_runners_buffer_in_graphs(sglang_plugin):
    from sglang.srt.layers.aux_hidden_states import AuxHiddenStatePacker

    assert sglang_plugin.hook_status()["capture"] == "on", sglang_plugin.hook_status()
    K, H, max_tokens, dt = 3, 7168, 64, torch.bfloat16
    buf = torch.full((max_tokens, K * H), float("nan"), dtype=dt, device="cuda")  # the runner's aux buffer
    taps = [torch.zeros(max_tokens, H, dtype=dt, device="cuda") for _ in range(K)]  # static layer outputs

    def forward(bs):
        def fn():
            packer = AuxHiddenStatePacker(K, out=buf[:bs])  # what for_batch(forward_batch, K) builds
            for k in range(K):
                packer.append(taps[k][:bs])
            return packer.finalize()
        return fn

    counter = OpCounter()
    with counter:
        forward(2)()
    assert counter.counts["eagle3_capture.capture_.default"] == K, counter.counts  # the hook's op, not copy_
    runner = GraphRunner()
    runner.capture_all(BATCHES, forward)
    for i, bs in enumerate(random_order(BATCHES, 24, seed=3)):
        g = torch.Generator(device="cuda").manual_seed(i)
        for t in taps:
            t.copy_(torch.randn(max_tokens, H, generator=g, device="cuda").to(dt))
        buf.fill_(float("nan"))
        out = runner.replay(bs)
        torch.cuda.synchronize()
        assert out.data_ptr() == buf.data_ptr() and out.shape == (bs, K * H)
        want = buf.new_empty(bs, K * H).fill_(float("nan"))
        for k in range(K):
            want = reference.capture(want, k, taps[k][:bs])
        assert torch.equal(buf[:bs], want), f"replay {i} (bs {bs})"
        assert buf[bs:].isnan().all(), f"replay {i} wrote past its rows"


DRAFTS = [
    pytest.param("mla", dict(fc_norm=True), id="Eagle3MLAModel-fc_norm"),
    pytest.param("mha", dict(), id="LlamaEagle3"),
    pytest.param("mha", dict(fc_norm=True), id="LlamaEagle3-fc_norm"),
    pytest.param("mha", dict(norm_before_fc=True), id="LlamaEagle3-norm_before_fc"),
]


def _draft_on_cuda(harness, kind, kw):
    build = harness.build_mla_draft if kind == "mla" else harness.build_llama_draft
    cfg, model = build(dtype=torch.bfloat16, **kw)
    return cfg, model.cuda()


@torch.no_grad()
def _reference(model, x: torch.Tensor) -> torch.Tensor:
    inner = model.model
    eps = None
    x64 = x.double()
    if getattr(inner, "input_norm", None) is not None and inner.fc_norm is None:
        g = inner.input_norm.weight.double().view(1, -1)
        eps = inner.input_norm.variance_epsilon
    elif inner.fc_norm is not None:
        g = torch.stack([n.weight.double() for n in inner.fc_norm])
        eps = inner.fc_norm[0].variance_epsilon
    else:
        g = None
    bias = getattr(inner.fc, "bias", None)
    return reference.draft_fc(x64, inner.fc.weight.double(), g, eps or 1e-6,
                              None if bias is None else bias.double(),
                              round_normed_to=torch.bfloat16 if g is not None else None)


@pytest.mark.parametrize("kind, kw", DRAFTS)
def test_sglang_draft_fc_in_graphs_and_an_in_place_weight_update(harness, sglang_plugin, kind, kw):
    from eagle3_capture.sglang import draft

    assert sglang_plugin.hook_status()["draft_fc"] == "on", sglang_plugin.hook_status()
    cfg, model = _draft_on_cuda(harness, kind, kw)
    K, H = 4, cfg.hidden_size
    fc = draft._mla_fc if kind == "mla" else draft._llama_fc  # what the forward hooks call
    x_buf = harness.target_features(max(BATCHES), H, K, dtype=torch.bfloat16).cuda()

    def forward(bs):
        def fn():
            with torch.no_grad():  # SGLang's forwards run without autograd
                return fc(model.model, x_buf[:bs])
        return fn

    counter = OpCounter()
    with counter:
        assert forward(4)() is not None, "the fused fc fell back to SGLang's code"
    assert counter.counts["eagle3_capture.draft_fc.default"] == 1, counter.counts
    runner = GraphRunner()
    runner.capture_all(BATCHES, forward)

    def replays(seed):
        for i, bs in enumerate(random_order(BATCHES, 18, seed=seed)):
            x_buf[:bs].copy_(harness.target_features(bs, H, K, seed=1000 * seed + i, dtype=torch.bfloat16))
            runner.outputs[bs].fill_(float("nan"))
            got = runner.replay(bs)
            torch.cuda.synchronize()
            want = _reference(model, x_buf[:bs])
            err = float((got.double() - want).norm() / want.norm())
            assert err <= 1e-2, f"seed {seed} replay {i} (bs {bs}): relative error {err}"

    replays(1)
    if kw.get("fc_norm"):
        g = torch.Generator().manual_seed(5)
        model.load_weights([(f"fc_norm.{k}.weight", (0.5 + torch.rand(H, generator=g)).to(torch.bfloat16))
                            for k in range(K)])
        replays(2)  # the graphs captured before the update compute with the new weights
