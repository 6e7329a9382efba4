"""The torch stand-ins for sgl_kernel (scripts/gpu_sglang/standins/sgl_kernel/native.py) against float64 references
written here, fuzzed with hypothesis, on the CPU and (marked `cuda`) on a GPU, where each is also captured in a
CUDA graph and replayed with new inputs. A wrong stand-in would make the GPU serving comparison meaningless, so
each keeps sgl_kernel's convention: argument order, in-place outputs, untouched bytes where the kernel writes none.

native.py is loaded by its path under its own name: putting ``sgl_kernel`` in this process's modules would change
which branches SGLang takes in the CPU tests that share it.
"""
import importlib.util
import math
import os

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import DEVICES, fuzz_examples

HERE = os.path.dirname(os.path.abspath(__file__))
PROGRAMS = os.path.join(os.path.dirname(os.path.dirname(HERE)), "scripts", "gpu_sglang")  # the GPU programs
_spec = importlib.util.spec_from_file_location("e3_sgl_kernel_native",
                                               os.path.join(PROGRAMS, "standins", "sgl_kernel", "native.py"))
nat = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(nat)

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
TOL = {torch.float32: 2e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}
POISON = float("nan")


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _rand(shape, dtype, device, seed, scale=1.0):
    return (torch.randn(shape, generator=_gen(seed), dtype=torch.float64) * scale).to(dtype).to(device)


def _close(got, ref64, dtype):
    tol = TOL[dtype]
    assert torch.isfinite(got).all(), "non-finite output (a poisoned byte left unwritten?)"
    err = (got.double().cpu() - ref64.cpu()).abs()
    bound = tol * (1 + ref64.cpu().abs())
    assert (err <= bound).all(), f"max error {err.max().item():.3g} (tol {tol} relative)"


shapes = st.tuples(st.integers(1, 37), st.sampled_from([4, 8, 16, 64, 96, 136]))


# ------------------------------------------------------------------------------------------------------------------
# RMSNorm family
# ------------------------------------------------------------------------------------------------------------------

def _ref_norm(x, w, eps, gemma):
    x = x.double()
    w = w.double()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * ((1 + w) if gemma else w)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("gemma", [False, True], ids=["rmsnorm", "gemma"])
@settings(max_examples=fuzz_examples(40))
@given(shape=shapes, dtype=st.sampled_from(DTYPES), seed=st.integers(0, 2**31 - 1),
       eps=st.sampled_from([1e-6, 1e-5]), given_out=st.booleans())
def test_rmsnorm_matches_float64(device, gemma, shape, dtype, seed, eps, given_out):
    x = _rand(shape, dtype, device, seed, scale=3.0)
    w = _rand(shape[-1:], dtype, device, seed + 1)
    x0 = x.clone()
    fn = nat.gemma_rmsnorm if gemma else nat.rmsnorm
    if given_out:
        out = torch.full_like(x, POISON)
        got = fn(x, w, eps, out=out)
        assert got is out
    else:
        got = fn(x, w, eps)
    assert got.dtype == dtype and got.shape == x.shape
    assert torch.equal(x, x0), "rmsnorm must not write its input"
    _close(got, _ref_norm(x0, w, eps, gemma), dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("gemma", [False, True], ids=["rmsnorm", "gemma"])
@settings(max_examples=fuzz_examples(40))
@given(shape=shapes, dtype=st.sampled_from(DTYPES), seed=st.integers(0, 2**31 - 1))
def test_fused_add_rmsnorm_writes_both_in_place(device, gemma, shape, dtype, seed):
    x = _rand(shape, dtype, device, seed, scale=2.0)
    r = _rand(shape, dtype, device, seed + 1, scale=2.0)
    w = _rand(shape[-1:], dtype, device, seed + 2)
    x0, r0 = x.clone(), r.clone()
    fn = nat.gemma_fused_add_rmsnorm if gemma else nat.fused_add_rmsnorm
    assert fn(x, r, w, 1e-6) is None
    s = x0.double() + r0.double()
    # residual: the sum, rounded once to its dtype (the kernel adds in float32)
    assert torch.equal(r, (x0.float() + r0.float()).to(dtype))
    _close(x, _ref_norm(s, w, 1e-6, gemma), dtype)


def test_norms_reject_bad_shapes():
    x = torch.randn(3, 8)
    with pytest.raises(ValueError, match="last dimension"):
        nat.rmsnorm(x, torch.ones(7))
    with pytest.raises(ValueError, match="residual shape"):
        nat.fused_add_rmsnorm(x, torch.randn(3, 4), torch.ones(8))
    with pytest.raises(TypeError, match="torch.Tensor"):
        nat.rmsnorm([1.0], torch.ones(1))


# ------------------------------------------------------------------------------------------------------------------
# act(x[:d]) * x[d:]
# ------------------------------------------------------------------------------------------------------------------

def _ref_act(name, x):
    x = x.double()
    d = x.shape[-1] // 2
    a, b = x[..., :d], x[..., d:]
    if name == "silu":
        g = a / (1 + torch.exp(-a))
    elif name == "gelu":
        g = 0.5 * a * (1 + torch.erf(a / math.sqrt(2)))
    else:
        g = 0.5 * a * (1 + torch.tanh(math.sqrt(2 / math.pi) * (a + 0.044715 * a ** 3)))
    return g * b


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["silu", "gelu", "gelu_tanh"])
@settings(max_examples=fuzz_examples(40))
@given(shape=shapes, dtype=st.sampled_from(DTYPES), seed=st.integers(0, 2**31 - 1), given_out=st.booleans())
def test_act_and_mul_matches_float64(device, name, shape, dtype, seed, given_out):
    x = _rand((shape[0], 2 * shape[1]), dtype, device, seed, scale=3.0)
    x0 = x.clone()
    fn = getattr(nat, f"{name}_and_mul")
    if given_out:
        out = torch.full((shape[0], shape[1]), POISON, dtype=dtype, device=device)
        assert fn(x, out) is out  # SGLang passes out positionally
        got = out
    else:
        got = fn(x)
    assert torch.equal(x, x0)
    _close(got, _ref_act(name, x0), dtype)


def test_act_and_mul_rejects_a_wrong_out():
    with pytest.raises(ValueError, match="out shape"):
        nat.silu_and_mul(torch.randn(2, 8), torch.empty(2, 8))
    with pytest.raises(ValueError, match="even"):
        nat.silu_and_mul(torch.randn(2, 7))


# ------------------------------------------------------------------------------------------------------------------
# MoE
# ------------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=fuzz_examples(40))
@given(t=st.integers(1, 70), k=st.integers(1, 8), h=st.sampled_from([8, 64, 72]), dtype=st.sampled_from(DTYPES),
       scale=st.sampled_from([1.0, 2.5, 0.37]), seed=st.integers(0, 2**31 - 1))
def test_moe_sum_reduce_matches_float64(device, t, k, h, dtype, scale, seed):
    x = _rand((t, k, h), dtype, device, seed)
    out = torch.full((t, h), POISON, dtype=dtype, device=device)
    assert nat.moe_sum_reduce(x, out, scale) is None
    _close(out, x.double().sum(1) * scale, dtype)


def _align_reference(ids, num_buckets, block):
    """moe_align_block_size in plain Python: (per bucket padded start, padded total, token ids per bucket)."""
    flat = [int(v) + 1 for v in ids.reshape(-1).tolist()]
    members = [[i for i, b in enumerate(flat) if b == e] for e in range(num_buckets)]
    starts, pos = [], 0
    for m in members:
        starts.append(pos)
        pos += -(-len(m) // block) * block
    return starts, pos, members


@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=fuzz_examples(60))
@given(tokens=st.integers(0, 90), topk=st.integers(1, 4), experts=st.integers(1, 12),
       block=st.sampled_from([1, 4, 16, 64]), pad=st.booleans(), invalid=st.booleans(),
       wide=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_moe_align_block_size_as_sgl_kernel(device, tokens, topk, experts, block, pad, invalid, wide, seed):
    g = _gen(seed)
    lo = -1 if invalid else 0
    ids = torch.randint(lo, experts, (tokens, topk), generator=g, dtype=torch.int32).to(device)
    if wide:
        ids = ids.to(torch.int64)
    nb = experts + 1  # SGLang passes num_experts + 1 (the bucket of filtered experts, id -1)
    numel = ids.numel()
    # sizes as SGLang's moe_align_block_size allocates them
    max_pad = numel * block if numel < nb else numel + nb * (block - 1)
    max_pad = (max_pad + 3) // 4 * 4
    blocks = -(-max_pad // block)
    sentinel = -77
    sorted_ids = torch.full((max(max_pad, 1),), sentinel, dtype=torch.int32, device=device)
    expert_ids = torch.full((max(blocks, 1),), sentinel, dtype=torch.int32, device=device)
    post = torch.full((1,), sentinel, dtype=torch.int32, device=device)
    cumsum = torch.full((nb + 1,), sentinel, dtype=torch.int32, device=device)
    assert nat.moe_align_block_size(ids, nb, block, sorted_ids, expert_ids, post, cumsum, pad) is None
    starts, total, members = _align_reference(ids.cpu(), nb, block)
    assert post.item() == total
    assert cumsum.cpu().tolist() == starts + [total]
    s = sorted_ids.cpu().tolist()
    e = expert_ids.cpu().tolist()
    for b, (start, m) in enumerate(zip(starts, members)):
        span = -(-len(m) // block) * block
        assert s[start:start + len(m)] == m, f"bucket {b}: token ids"
        assert s[start + len(m):start + span] == [numel if pad else sentinel] * (span - len(m))
        for j in range(start // block, (start + span) // block):
            assert e[j] == b - 1, f"block {j} belongs to bucket {b} (expert {b - 1})"
    assert e[total // block:] == [sentinel] * (len(e) - total // block), "blocks past the total stay untouched"
    assert s[total:] == [numel if pad else sentinel] * (len(s) - total)


def test_moe_align_rejects_bad_buffers():
    ids = torch.zeros(2, 2, dtype=torch.int32)
    i32 = lambda n: torch.zeros(n, dtype=torch.int32)  # noqa: E731
    with pytest.raises(TypeError, match="int32"):
        nat.moe_align_block_size(ids, 3, 4, i32(16), torch.zeros(4, dtype=torch.int64), i32(1), i32(4))
    with pytest.raises(ValueError, match="cumsum_buffer"):
        nat.moe_align_block_size(ids, 3, 4, i32(16), i32(4), i32(1), i32(3))
    with pytest.raises(TypeError, match="int32 or int64"):
        nat.moe_align_block_size(ids.float(), 3, 4, i32(16), i32(4), i32(1), i32(4))


# ------------------------------------------------------------------------------------------------------------------
# sampling renorm: brute-force float64 semantics, ties included (probabilities drawn from a few levels)
# ------------------------------------------------------------------------------------------------------------------

def _probs(rows, vocab, seed, device, levels):
    g = _gen(seed)
    w = torch.randint(1, levels + 1, (rows, vocab), generator=g).double()
    return (w / w.sum(-1, keepdim=True)).float().to(device)


@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=fuzz_examples(40))
@given(rows=st.integers(1, 6), vocab=st.integers(1, 40), levels=st.integers(1, 6), seed=st.integers(0, 2**31 - 1),
       per_row=st.booleans(), data=st.data())
def test_top_k_renorm_prob_keeps_the_top_k_and_ties(device, rows, vocab, levels, seed, per_row, data):
    p = _probs(rows, vocab, seed, device, levels)
    ks = [data.draw(st.integers(0, vocab + 2)) for _ in range(rows)]
    k_arg = torch.tensor(ks, dtype=torch.int32, device=device) if per_row else ks[0]
    got = nat.top_k_renorm_prob(p, k_arg)
    for r in range(rows):
        k = ks[r] if per_row else ks[0]
        row = p[r].double().cpu()
        k = vocab if k <= 0 or k > vocab else k
        kth = sorted(row.tolist(), reverse=True)[k - 1]
        keep = torch.where(row >= kth, row, torch.zeros_like(row))
        assert torch.allclose(got[r].double().cpu(), keep / keep.sum(), atol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=fuzz_examples(40))
@given(rows=st.integers(1, 6), vocab=st.integers(1, 40), levels=st.integers(1, 6), seed=st.integers(0, 2**31 - 1),
       top_p=st.sampled_from([0.05, 0.3, 0.5, 0.9, 1.0]))
def test_top_p_renorm_prob_keeps_the_smallest_top_set(device, rows, vocab, levels, seed, top_p):
    p = _probs(rows, vocab, seed, device, levels)
    got = nat.top_p_renorm_prob(p, top_p)
    for r in range(rows):
        row = p[r].double().cpu()
        vals = row.tolist()
        above = torch.tensor([sum(v for v in vals if v > x) for x in vals], dtype=torch.float64)
        keep = torch.where(above < top_p - 1e-6, row, torch.zeros_like(row))
        # a value whose mass above sits on the boundary (float32 sums) may go either way: compare the rest
        edge = (above - top_p).abs() <= 1e-6
        g = got[r].double().cpu()
        ref = keep / keep.sum() if keep.sum() > 0 else keep
        if not edge.any():
            assert torch.allclose(g, ref, atol=1e-6)
        assert abs(g.sum().item() - 1.0) < 1e-5


# ------------------------------------------------------------------------------------------------------------------
# weak_ref_tensor and is_arch_support_pdl
# ------------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32, torch.bool])
def test_weak_ref_tensor_aliases_without_owning(device, dtype):
    base = (torch.arange(60) % 7).to(dtype).to(device)
    t = base.reshape(6, 10)[1:5, 2:9]  # a strided view with an offset
    w = nat.weak_ref_tensor(t)
    assert (w.shape, w.stride(), w.dtype, w.device, w.data_ptr()) == (t.shape, t.stride(), t.dtype, t.device,
                                                                        t.data_ptr())
    assert torch.equal(w, t)
    st_ = t.untyped_storage()
    assert w.untyped_storage()._cdata != st_._cdata, "the alias must not share the owning storage object"
    uses = torch._C._storage_Use_Count(st_._cdata)
    w2 = nat.weak_ref_tensor(t)
    assert torch._C._storage_Use_Count(st_._cdata) == uses, "a weak reference must not add an owner"
    w2[0, 0] = t[0, 1]
    assert t[0, 0] == t[0, 1], "writes through the alias reach the memory"


def test_is_arch_support_pdl_follows_the_device():
    want = torch.cuda.is_available() and torch.cuda.get_device_capability(torch.cuda.current_device())[0] >= 9
    assert nat.is_arch_support_pdl() is bool(want)


# ------------------------------------------------------------------------------------------------------------------
# CUDA graphs: SGLang captures these inside its decode / prefill graphs
# ------------------------------------------------------------------------------------------------------------------

def _capture(fn):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):  # SGLang's two eager warm-ups on a side stream
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g


@pytest.mark.cuda
@pytest.mark.parametrize("seed", [0, 1])
def test_stand_ins_capture_and_replay_in_a_cuda_graph(seed):
    dev = "cuda"
    T, H, K, E, B = 24, 64, 2, 8, 16
    x = torch.empty(T, H, device=dev)
    r = torch.empty(T, H, device=dev)
    w = _rand((H,), torch.float32, dev, seed + 9)
    xs = torch.empty(T, K, H, device=dev)
    out = torch.empty(T, H, device=dev)
    gate = torch.empty(T, 2 * H, device=dev)
    act = torch.empty(T, H, device=dev)
    ids = torch.empty(T, K, dtype=torch.int32, device=dev)
    numel = T * K
    max_pad = (numel + (E + 1) * (B - 1) + 3) // 4 * 4
    sorted_ids = torch.empty(max_pad, dtype=torch.int32, device=dev)
    eids = torch.empty(-(-max_pad // B), dtype=torch.int32, device=dev)
    post = torch.empty(1, dtype=torch.int32, device=dev)
    cums = torch.empty(E + 2, dtype=torch.int32, device=dev)
    normed = torch.empty(T, H, device=dev)

    def step():
        nat.fused_add_rmsnorm(x, r, w, 1e-6)
        nat.rmsnorm(r, w, 1e-6, out=normed)
        nat.moe_sum_reduce(xs, out, 2.5)
        nat.silu_and_mul(gate, act)
        nat.moe_align_block_size(ids, E + 1, B, sorted_ids, eids, post, cums, True)
        nat.weak_ref_tensor(out)

    def fill(s):
        for i, t in enumerate((x, r, xs, gate)):
            t.copy_(_rand(t.shape, torch.float32, dev, s * 10 + i))
        ids.copy_(torch.randint(-1, E, ids.shape, generator=_gen(s), dtype=torch.int32))

    fill(seed)
    g = _capture(step)
    for s in (seed + 100, seed + 200):
        fill(s)
        x0, r0, xs0, gate0, ids0 = x.clone(), r.clone(), xs.clone(), gate.clone(), ids.clone()
        for t in (normed, out, act, sorted_ids, eids, post):
            t.fill_(-1 if not t.is_floating_point() else POISON)
        g.replay()
        torch.cuda.synchronize()
        got = [t.clone() for t in (x, r, normed, out, act, sorted_ids, eids, post)]
        x.copy_(x0), r.copy_(r0), xs.copy_(xs0), gate.copy_(gate0), ids.copy_(ids0)
        for t in (normed, out, act, sorted_ids, eids, post):
            t.fill_(-1 if not t.is_floating_point() else POISON)
        step()
        eager = [x, r, normed, out, act, sorted_ids, eids, post]
        for a, b in zip(got, eager):
            assert torch.equal(a, b), "replay differs from eager"


def test_top_p_boundary_is_the_smallest_set_reaching_top_p():
    # exact binary fractions: {0.5} alone reaches top_p = 0.5, so 0.25 (mass above it: exactly 0.5) is dropped
    p = torch.tensor([[0.125, 0.5, 0.25, 0.125]])
    assert nat.top_p_renorm_prob(p, 0.5).tolist() == [[0.0, 1.0, 0.0, 0.0]]
    assert torch.allclose(nat.top_p_renorm_prob(p, 0.75), torch.tensor([[0.0, 2 / 3, 1 / 3, 0.0]]))
    # ties at the boundary stay together: both 0.125 have mass 0.75 above them
    assert nat.top_p_renorm_prob(p, 0.8).tolist() == [[0.125, 0.5, 0.25, 0.125]]
