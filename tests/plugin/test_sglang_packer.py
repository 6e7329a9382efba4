"""SGLang's AuxHiddenStatePacker with the plugin's capture hook (writes through eagle3_capture::capture_) against
SGLang's own path (the original append the registry keeps in __wrapped__): same bits, same buffer, for a buffer
the packer allocates and for the decode CUDA-graph runner's preallocated one (for_batch)."""

import pytest
import torch

from sglang_fixtures import (OpCounter, harness, require_sglang, sglang_plugin, skip_unless_sglang_has,  # noqa: F401
                             tiny)

pytestmark = pytest.mark.sglang


@pytest.fixture(autouse=True)
def _packer_in_this_release(require_sglang, harness):
    """The subject of every test here is the plugin's capture hook on SGLang's AuxHiddenStatePacker, which writes
    through the fused op into the slot the packer hands out (`slot()`). Releases before 0.5.18 have no packer (their
    DeepseekV2Model captures into a plain list); 0.5.18-0.5.22's packer has no slot() (its append allocates and
    copies by itself, and the plugin leaves that copy alone)."""
    skip_unless_sglang_has("sglang.srt.layers.aux_hidden_states",
                           "layers/aux_hidden_states.py: AuxHiddenStatePacker (DeepseekV2Model captures into a list)")
    from sglang.srt.layers.aux_hidden_states import AuxHiddenStatePacker

    if not hasattr(AuxHiddenStatePacker, "slot"):
        harness.skip_missing_feature("AuxHiddenStatePacker.slot() (layers/aux_hidden_states.py: its append "
                                     "allocates and copies by itself, so the plugin's fused capture has no slot "
                                     "to write into)")

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
K, H = 3, 48


def _captures(T, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(T, H + 5, generator=g).to(dtype)
    strided = base[:, 2:2 + H]  # row-strided, misaligned start: how a gathered/ sliced residual can arrive
    return [torch.randn(T, H, generator=g).to(dtype), strided, torch.randn(T, H, generator=g).to(dtype)]


def _stock_pack(packer_cls, hiddens, out=None):
    p = packer_cls(K, out=out)
    stock_append = packer_cls.append.__wrapped__
    for h in hiddens:
        stock_append(p, h)  # SGLang's own: self.slot(hidden).copy_(hidden)
    return p.finalize()


def _forward_batch(buffer):
    """A real ForwardBatch carrying a decode-graph aux buffer, as DecodeCudaGraphRunner builds it."""
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode

    T = buffer.shape[0]
    ids = torch.zeros(T, dtype=torch.int64)
    return ForwardBatch(forward_mode=ForwardMode.DECODE, batch_size=T, input_ids=ids,
                        req_pool_indices=ids.int(), seq_lens=ids.int() + 1, seq_lens_cpu=ids.int() + 1,
                        out_cache_loc=ids, seq_lens_sum=T, positions=ids, aux_hidden_states_buffer=buffer)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
@pytest.mark.parametrize("T", [0, 1, 7])
def test_packer_capture_through_fused_op_equals_sglang(sglang_plugin, dtype, T):
    from sglang.srt.layers.aux_hidden_states import AuxHiddenStatePacker

    hiddens = _captures(T, dtype, seed=T)
    want = _stock_pack(AuxHiddenStatePacker, hiddens)
    p = AuxHiddenStatePacker(K)
    counter = OpCounter()
    with counter:
        for h in hiddens:
            p.capture(h)  # what the layer-boundary stage calls
    got = p.finalize()
    assert got.shape == (T, K * H) and got.dtype == dtype
    assert torch.equal(got, want)
    assert counter.counts["eagle3_capture.capture_.default"] == K, counter.counts
    assert counter.counts["aten.copy_.default"] == 0, counter.counts


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
def test_packer_for_batch_writes_the_decode_graph_buffer(sglang_plugin, dtype):
    """for_batch: the packer writes into forward_batch.aux_hidden_states_buffer, the first T rows of the graph
    runner's [max_tokens, K*H] buffer; rows past T are untouched and finalize returns that buffer."""
    from sglang.srt.layers.aux_hidden_states import AuxHiddenStatePacker

    T, max_tokens = 5, 16
    hiddens = _captures(T, dtype, seed=11)
    graph_buf = torch.full((max_tokens, K * H), float("nan"), dtype=dtype)
    stock_buf = graph_buf.clone()
    want = _stock_pack(AuxHiddenStatePacker, hiddens, out=stock_buf[:T])

    p = AuxHiddenStatePacker.for_batch(_forward_batch(graph_buf[:T]), K)
    counter = OpCounter()
    with counter:
        for h in hiddens:
            p.capture(h)
    got = p.finalize()
    assert got.data_ptr() == graph_buf.data_ptr()
    assert torch.equal(got, want)
    assert torch.equal(graph_buf[T:].isnan(), torch.ones_like(graph_buf[T:], dtype=torch.bool))
    assert torch.equal(graph_buf.isnan(), stock_buf.isnan())
    assert counter.counts["eagle3_capture.capture_.default"] == K, counter.counts


def test_packer_rejects_a_wrong_buffer_like_sglang(sglang_plugin):
    from sglang.srt.layers.aux_hidden_states import AuxHiddenStatePacker

    p = AuxHiddenStatePacker(K, out=torch.empty(4, K * H + 1))
    with pytest.raises(ValueError, match=r"aux hidden output buffer is \(4, 145\)"):
        p.capture(torch.randn(4, H))


def test_packer_values_the_op_does_not_take_use_sglangs_copy(sglang_plugin):
    """3-D captures and float64 go through SGLang's own copy_, with the same result."""
    from sglang.srt.layers.aux_hidden_states import AuxHiddenStatePacker

    g = torch.Generator().manual_seed(3)
    for hiddens in ([torch.randn(2, 3, H, generator=g) for _ in range(K)],
                    [torch.randn(4, H, generator=g, dtype=torch.float64) for _ in range(K)]):
        want = _stock_pack(AuxHiddenStatePacker, hiddens)
        p = AuxHiddenStatePacker(K)
        counter = OpCounter()
        with counter:
            p.extend(hiddens)
        assert torch.equal(p.finalize(), want)
        assert counter.counts["eagle3_capture.capture_.default"] == 0


def test_packer_mixed_dtype_capture_converts_like_sglang(sglang_plugin):
    """A float32 value (e.g. an fp32 residual) into a bf16 buffer: SGLang's converting copy_, same result."""
    from sglang.srt.layers.aux_hidden_states import AuxHiddenStatePacker

    g = torch.Generator().manual_seed(4)
    hiddens = [torch.randn(5, H, generator=g).to(torch.bfloat16), torch.randn(5, H, generator=g),
               torch.randn(5, H, generator=g).to(torch.bfloat16)]
    want = _stock_pack(AuxHiddenStatePacker, hiddens)
    p = AuxHiddenStatePacker(K)
    p.extend(hiddens)
    got = p.finalize()
    assert got.dtype == torch.bfloat16 and torch.equal(got, want)


def test_with_grad_mode_off_the_hook_calls_the_op_and_with_it_on_the_api(sglang_plugin, monkeypatch):
    """K captures per target forward: with grad mode off (SGLang's forwards) the hook calls
    torch.ops.eagle3_capture.capture_ itself, not the Python API over it; with grad mode on it goes through
    ops.capture_, whose inference-only check still refuses a tensor that requires grad."""
    from eagle3_capture import ops
    from sglang.srt.layers.aux_hidden_states import AuxHiddenStatePacker

    api = []
    real = ops.capture_
    monkeypatch.setattr(ops, "capture_", lambda *a: api.append(1) or real(*a))
    hiddens = _captures(4, torch.float32, seed=5)
    want = _stock_pack(AuxHiddenStatePacker, hiddens)
    for grad in (False, True):
        api.clear()
        p = AuxHiddenStatePacker(K)
        counter = OpCounter()
        with torch.set_grad_enabled(grad), counter:
            p.extend(hiddens)
        assert torch.equal(p.finalize(), want)
        assert counter.counts["eagle3_capture.capture_.default"] == K, counter.counts
        assert len(api) == (K if grad else 0), (grad, api)
    p = AuxHiddenStatePacker(K)
    with pytest.raises(RuntimeError, match="inference-only"):
        p.capture(torch.randn(4, H, requires_grad=True))
