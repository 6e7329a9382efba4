"""On the GPU machine (no SGLang there): the exact op calls the plugin's hooks make, on CUDA tensors, against the
plain-torch reference -- the capture write into one slot of SGLang's packed buffer (its own allocation and the
decode CUDA-graph runner's row slice, captured and replayed in a CUDA graph), and the draft fc in each form the
draft hooks use (per-tap fc_norm, whole-row input_norm, none; with and without bias), at Kimi-K2.5's width."""
import pytest
import torch

from eagle3_capture import reference
from eagle3_capture.sglang.taps import capture
from eagle3_capture.sglang import draft

pytestmark = pytest.mark.cuda

REL = {torch.bfloat16: 1e-2, torch.float16: 2e-3, torch.float32: 1e-4}


def _rel(got, want64):
    g = got.double().cpu()
    assert not torch.isnan(g).any(), "NaN in output"
    return float((g - want64).norm() / want64.norm().clamp_min(1e-30))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("T", [1, 64, 3000])
def test_write_slot_into_packed_buffer(dtype, T):
    K, H = 3, 7168
    g = torch.Generator(device="cuda").manual_seed(T)
    packed = torch.full((T, K * H), float("nan"), dtype=dtype, device="cuda")
    base = torch.randn(T, H + 8, generator=g, device="cuda").to(dtype)
    taps = [torch.randn(T, H, generator=g, device="cuda").to(dtype), base[:, 8:], 2 * base[:, :H]]
    want = packed.clone()
    for s, h in enumerate(taps):
        capture.write_slot(packed[:, s * H:(s + 1) * H], h)  # the view AuxHiddenStatePacker.slot() returns
        want = reference.capture(want, s, h)
    torch.cuda.synchronize()
    assert torch.equal(packed, want)


def test_write_slot_decode_graph_buffer_in_a_cuda_graph():
    """The decode runner's buffer: the first T rows of a [max_tokens, K*H] tensor, written inside a CUDA graph
    and replayed with new inputs; the rows past T stay untouched."""
    K, H, T, max_tokens = 3, 7168, 48, 160
    dtype = torch.bfloat16
    buf = torch.full((max_tokens, K * H), float("nan"), dtype=dtype, device="cuda")
    inputs = [torch.zeros(T, H, dtype=dtype, device="cuda") for _ in range(K)]
    view = buf[:T]
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for s in range(K):  # warm-up outside the graph
            capture.write_slot(view[:, s * H:(s + 1) * H], inputs[s])
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for s in range(K):
            capture.write_slot(view[:, s * H:(s + 1) * H], inputs[s])
    for rep in range(3):
        g = torch.Generator(device="cuda").manual_seed(rep)
        for t in inputs:
            t.copy_(torch.randn(T, H, generator=g, device="cuda").to(dtype))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(buf[:T], torch.cat(inputs, dim=1))
        assert buf[T:].isnan().all()


@pytest.mark.parametrize("form", ["fc_norm", "input_norm", "plain"])
@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("N", [7168, 896], ids=["tp1", "tp8shard"])
@pytest.mark.parametrize("T", [1, 8, 64, 300])
def test_fused_fc_as_the_draft_hooks_call_it(form, bias, N, T):
    K, H, dtype, eps = 3, 7168, torch.bfloat16, 1e-6
    g = torch.Generator(device="cuda").manual_seed(1000 * T + N)
    # taps of very different scales, as the embedding and deep layers are
    x = torch.cat([torch.randn(T, H, generator=g, device="cuda") * s for s in (0.05, 3.0, 30.0)], 1).to(dtype)
    w = (torch.randn(N, K * H, generator=g, device="cuda") / (K * H) ** 0.5).to(dtype)
    b = torch.randn(N, generator=g, device="cuda").to(dtype) if bias else None
    x64, w64, b64 = x.double().cpu(), w.double().cpu(), None if b is None else b.double().cpu()
    if form == "fc_norm":  # Eagle3MLAModel / LlamaEagle3 with fc_norm: [K, H] per-tap weights
        gw = (1 + 0.2 * torch.randn(K, H, generator=g, device="cuda")).to(dtype)
        got = draft.fused_fc(x, w, gw, eps, b)
        want = reference.draft_fc(x64, w64, gw.double().cpu(), eps, b64, round_normed_to=dtype)
    elif form == "input_norm":  # LlamaEagle3 norm_before_fc: one RMSNorm over the K*H row
        rw = (1 + 0.2 * torch.randn(K * H, generator=g, device="cuda")).to(dtype)
        got = draft.fused_fc(x, w, None, 1e-6, b, row_norm_weight=rw, row_eps=eps)
        want = reference.draft_fc(x64, w64, rw.double().cpu().view(1, -1), eps, b64, round_normed_to=dtype)
    else:
        got = draft.fused_fc(x, w, None, 1e-6, b)
        want = reference.draft_fc(x64, w64, None, eps, b64)
    assert got.shape == (T, N) and got.dtype == dtype
    assert _rel(got, want) <= REL[dtype]
