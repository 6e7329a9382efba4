"""draft_fc against the float64 reference: fuzzed shapes, packed and list inputs, with and without per-tap norms
and bias, poisoned outputs, both CUDA paths (decode kernels M <= 8 by default, up to 16 by the knob; normalise +
GEMM above), every decode kernel, bad inputs, opcheck, CUDA graphs.

One file (over 400 lines) because the CPU and CUDA tests share one fuzz strategy, one checker against the reference
and the decode-kernel settings; the CUDA tests are the second half."""
from __future__ import annotations

import contextlib

import pytest
import torch
from hypothesis import given, settings, strategies as st

from eagle3_capture import ops, reference
from helpers import randn
from conftest import DEVICES, fuzz_examples

# The op's norm-wise relative error bounds: bf16 1e-2, fp16 2e-3 (fp32: CPU and the CUDA GEMM path).
REL = {torch.bfloat16: 1e-2, torch.float16: 2e-3, torch.float32: 1e-4}


def rel_err(got: torch.Tensor, want64: torch.Tensor, scale64: torch.Tensor | None = None) -> float:
    """||got - want|| / max(||want||, ||scale||): norm-wise relative error. `scale` is the quadrature magnitude of
    the terms of each output, sqrt(sum_j (xn_j w_ij)^2 + b_i^2), which only matters where the terms cancel (a
    single output of M=N=1 can land near zero by chance; its rounding error is set by its terms, not its value)."""
    g = got.double().cpu()
    assert not torch.isnan(g).any(), "NaN in output (unwritten poison?)"
    denom = want64.norm() if scale64 is None else torch.maximum(want64.norm(), scale64.norm())
    return float((g - want64).norm() / denom.clamp_min(1e-30))


def term_scale(taps64, weight64, g64, eps, bias64):
    """sqrt(sum_j (xn_j * w_ij)^2 + b_i^2) for every output, xn the normalised concatenated taps (float64)."""
    if g64 is not None:
        taps64 = [reference.rmsnorm(t, g64[k], eps) for k, t in enumerate(taps64)]
    xn = torch.cat(taps64, dim=-1)
    sq = (xn * xn) @ (weight64 * weight64).t()
    if bias64 is not None:
        sq = sq + bias64 * bias64
    return sq.sqrt()


@st.composite
def fc_cases(draw, device):
    dtypes = [torch.bfloat16, torch.float16] + ([torch.float32] if device == "cpu" else [torch.float32])
    k = draw(st.integers(1, 4))
    big = draw(st.integers(0, 9)) == 0
    h = 7168 if big else 8 * draw(st.integers(1, 40))
    n = draw(st.sampled_from([896, 130])) if big else draw(st.integers(1, 200))
    m = draw(st.one_of(st.just(0), st.just(1), st.integers(1, 8), st.integers(9, 64), st.integers(65, 140)))
    if big:
        m = min(m, 70)
        if device == "cpu":
            # The CPU op normalises each row (the width is what its accumulation sees) and hands the rest to torch's
            # GEMM: the real width with few rows and outputs checks the same, at a tenth of the float64 reference's
            # cost. Rows and outputs stay wide on CUDA, where they pick the decode kernels or the GEMM path.
            m, n = min(m, 16), 130
    return dict(dtype=draw(st.sampled_from(dtypes)), m=m, k=k, h=h, n=n,
                packed=draw(st.booleans()), norm=draw(st.booleans()), bias=draw(st.booleans()),
                out=draw(st.booleans()), pad=8 * draw(st.integers(0, 2)), seed=draw(st.integers(0, 2**31 - 1)),
                scale=draw(st.sampled_from([1.0, 20.0, 0.01])))


def make_inputs(c, device):
    gen = torch.Generator().manual_seed(c["seed"])
    dt, m, k, h, n = c["dtype"], c["m"], c["k"], c["h"], c["n"]
    if c["packed"]:
        base = randn((m, k * h + c["pad"]), dt, device, gen, c["scale"])
        x = base[:, : k * h]
        taps64 = [t.double().cpu() for t in x.chunk(k, dim=-1)]
    else:
        x = [randn((m, h + c["pad"]), dt, device, gen, c["scale"])[:, :h] for _ in range(k)]
        taps64 = [t.double().cpu() for t in x]
    weight = randn((n, k * h), dt, device, gen, 1.0 / (k * h) ** 0.5)
    g = (randn((k, h), dt, device, gen) + 1.0) if c["norm"] else None
    b = randn((n,), dt, device, gen) if c["bias"] else None
    return x, taps64, weight, g, b


@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=fuzz_examples(400))
@given(data=st.data())
def test_draft_fc_matches_reference(device, data):
    check_case(data.draw(fc_cases(device)), device)


def check_case(c, device):
    """Runs one drawn case against the float64 reference, output poisoned first when `out` is given."""
    x, taps64, weight, g, b = make_inputs(c, device)
    if not c["norm"] and c["packed"]:
        # Without norms the packed row is one input; the reference sees the same concatenation.
        taps64 = [torch.cat(taps64, dim=-1)] if taps64 else taps64
    w64, g64, b64 = weight.double().cpu(), None if g is None else g.double().cpu(), None if b is None else b.double().cpu()
    want = reference.draft_fc(taps64, w64, g64, 1e-6, b64)
    out = None
    if c["out"]:
        out = torch.full((c["m"], c["n"]), float("nan"), dtype=c["dtype"], device=device)
    y = ops.draft_fc(x, weight, g, 1e-6, b, out=out)
    assert y.shape == (c["m"], c["n"]) and y.dtype == c["dtype"] and y.device.type == device
    if out is not None:
        assert y.data_ptr() == out.data_ptr()
    if c["m"] == 0:
        return
    err = rel_err(y, want, term_scale(taps64, w64, g64, 1e-6, b64))
    assert err <= REL[c["dtype"]], f"relative error {err:.3g} > {REL[c['dtype']]} for {c}"


# ---------------------------------------------------------------- bad inputs


def _bf(*shape, device="cpu"):
    return torch.randn(*shape, device=device).to(torch.bfloat16)


FC_ERRORS = [
    ("K*H mismatch", lambda: ([_bf(2, 48)], _bf(8, 40), None, None, None), r"in_features K\*H = 1\*48 = 48"),
    ("norm K*H mismatch", lambda: ([_bf(2, 40)], _bf(8, 40), _bf(3, 16), None, None), "cannot hold"),
    ("list shape", lambda: ([_bf(2, 16), _bf(2, 24)], _bf(8, 32), None, None, None), "shape of x"),
    ("H not multiple of 8", lambda: ([_bf(2, 12)], _bf(8, 12), None, None, None), "multiple of 8"),
    ("dtype", lambda: ([torch.randn(2, 16)], _bf(8, 16), None, None, None), "dtype of x"),
    ("int dtype", lambda: ([torch.ones(2, 16, dtype=torch.int32)], _bf(8, 16), None, None, None), "bfloat16"),
    ("weight non-contiguous", lambda: ([_bf(2, 16)], _bf(16, 8).t(), None, None, None), "contiguous"),
    ("weight 1-D", lambda: ([_bf(2, 16)], _bf(16), None, None, None), "2-D"),
    ("norm shape", lambda: ([_bf(2, 16), _bf(2, 16)], _bf(8, 32), _bf(2, 8), None, None), r"norm_weight \[K, H\]"),
    ("bias shape", lambda: ([_bf(2, 16)], _bf(8, 16), None, _bf(7), None), r"bias \[N\]"),
    ("out shape", lambda: ([_bf(2, 16)], _bf(8, 16), None, None, _bf(2, 7)), r"out \[M, N\]"),
    ("out dtype", lambda: ([_bf(2, 16)], _bf(8, 16), None, None, torch.zeros(2, 8)), "dtype of x"),
    ("x column-strided", lambda: ([_bf(16, 2).t()], _bf(8, 16), None, None, None), "contiguous rows"),
    ("too many list taps", lambda: ([_bf(1, 8)] * 17, _bf(8, 136), None, None, None), "at most 16"),
]


@pytest.mark.parametrize("name,make,msg", FC_ERRORS, ids=[c[0] for c in FC_ERRORS])
def test_draft_fc_rejects_bad_input(name, make, msg):
    x, w, g, b, out = make()
    with pytest.raises(RuntimeError, match=msg):
        ops.draft_fc(x, w, g, 1e-6, b, out=out)


def test_draft_fc_empty_list_is_a_type_error():
    with pytest.raises(TypeError, match="non-empty list"):
        ops.draft_fc([], _bf(8, 16))


# ---------------------------------------------------------------- opcheck


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("m", [0, 3, 70])
def test_opcheck(device, m):
    gen = torch.Generator().manual_seed(m)
    dt = torch.bfloat16
    x = randn((m, 3 * 32), dt, device, gen)
    taps = [randn((m, 32), dt, device, gen) for _ in range(3)]  # fresh tensors: opcheck cannot clone empty views
    w = randn((40, 96), dt, device, gen, 0.1)
    g = randn((3, 32), dt, device, gen)
    b = randn((40,), dt, device, gen)
    out = torch.empty(m, 40, dtype=dt, device=device)
    # Non-deterministic fp32 atomics (decode kernel) may flip a last bit between opcheck's repeated runs, so
    # compare with tolerance rather than exactly.
    for args in [([x], w, g, 1e-6, b), (taps, w, g, 1e-6, None), ([x], w, None, 1e-6, None)]:
        torch.library.opcheck(torch.ops.eagle3_capture.draft_fc.default, args, rtol=2e-2, atol=2e-2)
        torch.library.opcheck(torch.ops.eagle3_capture.draft_fc_out.default, args + (out,), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("meta", ["x", "x1", "weight", "norm", "bias", "out"])
def test_meta_tensors_mixed_with_cpu_tensors_are_refused(meta):
    """A meta argument among CPU tensors used to send draft_fc to its fake kernel, which returned a meta tensor
    (draft_fc_out wrote nothing): refused in C++ ahead of every backend, for the Python API and torch.ops alike."""
    def m(t, name):
        return torch.empty_like(t, device="meta") if name == meta else t

    x = [m(torch.randn(3, 8), "x"), m(torch.randn(3, 8), "x1")]
    w, norm, bias = m(torch.randn(5, 16), "weight"), m(torch.ones(2, 8), "norm"), m(torch.randn(5), "bias")
    out = m(torch.full((3, 5), float("nan")), "out")
    name = {"x": r"x\[0\]", "x1": r"x\[1\]", "weight": "weight", "norm": "norm_weight", "bias": "bias",
            "out": "out"}[meta]
    if meta != "out":
        with pytest.raises(RuntimeError, match=rf"{name} is on the meta device but \S+ is on cpu"):
            ops.draft_fc(x, w, norm, bias=bias)
        with pytest.raises(RuntimeError, match=rf"{name} is on the meta device"):
            torch.ops.eagle3_capture.draft_fc(x, w, norm, 1e-6, bias)
    with pytest.raises(RuntimeError, match=rf"{name} is on the meta device"):
        torch.ops.eagle3_capture.draft_fc_out(x, w, norm, 1e-6, bias, out)
    if not out.is_meta:
        assert torch.isnan(out).all()  # nothing written


def test_meta_only_draft_fc_traces_and_compiles():
    """All-meta arguments still give the output's shape; under torch.compile (FakeTensors) the op traces and the
    compiled result equals eager."""
    y = ops.draft_fc([torch.empty(3, 8, device="meta")] * 2, torch.empty(5, 16, device="meta"))
    assert y.is_meta and y.shape == (3, 5)
    gen = torch.Generator().manual_seed(3)
    x, w, norm = randn((4, 16), torch.float32, "cpu", gen), randn((6, 16), torch.float32, "cpu", gen), \
        randn((2, 8), torch.float32, "cpu", gen)

    def f(x, w, norm):
        return ops.draft_fc(x, w, norm) * 2

    with torch.no_grad():
        assert torch.equal(torch.compile(f, fullgraph=True, backend="aot_eager")(x, w, norm), f(x, w, norm))


def test_decode_threshold_knob_is_clamped_and_restorable():
    prev = ops._set_draft_fc_decode_max_rows(100)
    try:
        assert prev == -1  # the default: each device's tuned threshold
        assert ops._set_draft_fc_decode_max_rows(-3) == 16  # 100 was clamped to 16 (two token groups)
        assert ops._set_draft_fc_decode_max_rows(0) == -1  # -3 means the device's threshold again
        assert ops._set_draft_fc_decode_max_rows(prev) == 0
    finally:
        ops._set_draft_fc_decode_max_rows(prev)


def test_decode_kernel_knob_checks_and_restores():
    prev = ops._set_draft_fc_decode_kernel("split")
    try:
        assert prev == "auto"  # the default
        assert ops._set_draft_fc_decode_kernel("cluster") == "split"
        with pytest.raises(ValueError, match="cluster"):
            ops._set_draft_fc_decode_kernel("fast")
        assert ops._set_draft_fc_decode_kernel("auto") == "cluster"  # the bad name changed nothing
    finally:
        ops._set_draft_fc_decode_kernel(prev)


@contextlib.contextmanager
def decode_settings(kernel=None, rows=None):
    """The decode knobs set for the block (None leaves one as it is) and restored after it."""
    prev_kernel = ops._set_draft_fc_decode_kernel(kernel) if kernel is not None else None
    prev_rows = ops._set_draft_fc_decode_max_rows(rows) if rows is not None else None
    try:
        yield
    finally:
        if prev_kernel is not None:
            ops._set_draft_fc_decode_kernel(prev_kernel)
        if prev_rows is not None:
            ops._set_draft_fc_decode_max_rows(prev_rows)


@pytest.fixture(params=["cluster", "split"])
def decode_kernel(request):
    """Runs a CUDA test once per register decode kernel (auto picks one by shape), with the decode threshold at its
    maximum, 16 rows, so M = 9..16 takes the two-token-group kernels (opt-in by default)."""
    with decode_settings(request.param, 16):
        yield request.param


def capture_fc(x, w, g, out) -> torch.cuda.CUDAGraph:
    """A CUDA graph of one draft_fc(x, w, g) call into `out`."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ops.draft_fc(x, w, g, 1e-6, out=out)
    return graph


def replay_and_check(graph, x, w, g, out, gen, tol, label=""):
    """Fresh activations into x, `out` poisoned, one replay, out checked against the float64 reference; returns the
    reference."""
    x.copy_(randn(x.shape, x.dtype, "cuda", gen))
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    want = reference.draft_fc(x.double().cpu(), w.double().cpu(), None if g is None else g.double().cpu(), 1e-6)
    assert rel_err(out, want) <= tol, f"replay {label}"
    return want


# ---------------------------------------------------------------- CUDA only


@pytest.mark.cuda
def test_cuda_cluster_kernel_first_launch_inside_capture():
    """The first launch of a cluster-kernel instantiation inside a CUDA-graph capture: auto's one-wave check asks the
    runtime how many clusters fit (cudaOccupancyMaxActiveClusters, cached per instantiation and cluster size) during
    the capture. fp16 without norm at M = 13 (two token groups, the threshold raised to 16) is used by no other fixed
    test, and this test runs near the top of the CUDA section, before the fuzz tests that could draw it. On GPUs
    without clusters the split kernel runs."""
    gen = torch.Generator().manual_seed(1300)
    dt = torch.float16
    x = randn((13, 3 * 1024), dt, "cuda", gen)
    w = randn((896, 3 * 1024), dt, "cuda", gen, 0.03)
    out = torch.full((13, 896), float("nan"), dtype=dt, device="cuda")
    with decode_settings("auto", 16):
        ops.draft_fc(x[:1], w, None, 1e-6)  # eager, one token group: the decode workspace exists before capture
        graph = capture_fc(x, w, None, out)
        for trial in range(2):
            want = replay_and_check(graph, x, w, None, out, gen, 2e-3, trial)
        eager = ops.draft_fc(x, w, None, 1e-6)
    assert rel_err(eager, want) <= 2e-3


@pytest.mark.cuda
@pytest.mark.parametrize("kernel", ["auto", "cluster"])
@pytest.mark.parametrize("m", [1, 12])
def test_cuda_cluster_refusal_falls_back_to_split(kernel, m, capfd):
    """A cluster launch the device refuses (pretended here: cudaErrorInvalidClusterSize, 912) runs the split kernel:
    the result matches the reference, and stderr says so once per process, not per call."""
    gen = torch.Generator().manual_seed(9120 + m)
    dt = torch.bfloat16
    x = randn((m, 3 * 7168), dt, "cuda", gen)
    w = randn((896, 3 * 7168), dt, "cuda", gen, 0.01)  # N = 896: auto's cluster shape
    g = randn((3, 7168), dt, "cuda", gen) + 1
    want = reference.draft_fc(x.double().cpu(), w.double().cpu(), g.double().cpu(), 1e-6)
    prev = ops._set_draft_fc_cluster_fault(912)
    try:
        with decode_settings(kernel, 16):
            capfd.readouterr()
            outs = [ops.draft_fc(x, w, g, 1e-6) for _ in range(3)]
            torch.cuda.synchronize()
            err = capfd.readouterr().err
    finally:
        ops._set_draft_fc_cluster_fault(prev)
    for y in outs:
        assert rel_err(y, want) <= 1e-2
    assert err.count("the draft fc cluster kernel cannot launch") == 1, err
    assert "cudaErrorInvalidClusterSize" in err and "the split-K kernel runs instead" in err


def test_cluster_fault_knob_checks_its_value():
    with pytest.raises(ValueError, match="cudaError_t value >= 0"):
        ops._set_draft_fc_cluster_fault(-1)
    assert ops._set_draft_fc_cluster_fault(0) == 0


@pytest.mark.cuda
@pytest.mark.parametrize("m", [1, 7, 8, 9, 16, 33])
def test_cuda_decode_repeated_calls_and_shapes(m, decode_kernel):
    """The decode workspace re-zeroes itself: repeated calls and calls with other K/N give the same answer."""
    gen = torch.Generator().manual_seed(m)
    dt = torch.bfloat16
    x = randn((m, 3 * 7168), dt, "cuda", gen)
    w = randn((896, 3 * 7168), dt, "cuda", gen, 0.01)
    g = randn((3, 7168), dt, "cuda", gen) + 1
    want = reference.draft_fc(x.double().cpu(), w.double().cpu(), g.double().cpu(), 1e-6)
    first = ops.draft_fc(x, w, g, 1e-6)
    other = ops.draft_fc(randn((5, 2 * 512), dt, "cuda", gen), randn((300, 1024), dt, "cuda", gen), None, 1e-6)
    assert other.shape == (5, 300)
    again = ops.draft_fc(x, w, g, 1e-6)
    for y in (first, again):
        assert rel_err(y, want) <= 1e-2
    assert rel_err(again, first.double().cpu()) <= 1e-3


@pytest.mark.cuda
@pytest.mark.parametrize("m", [20, 300])
def test_cuda_normalise_both_forms(m):
    """M > 8 normalises then runs the GEMM: few rows keep x in registers across the reduction, many rows (more
    (row, tap) blocks than two per SM) re-read it; H = 1000 leaves a partial vector set per thread."""
    gen = torch.Generator().manual_seed(m)
    dt = torch.bfloat16
    x = randn((m, 3 * 1000), dt, "cuda", gen)
    w = randn((130, 3000), dt, "cuda", gen, 0.03)
    g = randn((3, 1000), dt, "cuda", gen) + 1
    want = reference.draft_fc(x.double().cpu(), w.double().cpu(), g.double().cpu(), 1e-6)
    got = ops.draft_fc(x, w, g, 1e-6)
    assert rel_err(got, want) <= 1e-2


@pytest.mark.cuda
def test_cuda_decode_and_prefill_paths_agree():
    gen = torch.Generator().manual_seed(11)
    dt = torch.float16
    x = randn((130, 2 * 1024), dt, "cuda", gen)
    w = randn((512, 2048), dt, "cuda", gen, 0.03)
    g = randn((2, 1024), dt, "cuda", gen) + 1
    b = randn((512,), dt, "cuda", gen)
    full = ops.draft_fc(x, w, g, 1e-5, b)            # prefill path (M > 16)
    one = ops.draft_fc(x[:8], w, g, 1e-5, b)         # decode kernel, one token group
    with decode_settings(rows=16):
        two = ops.draft_fc(x[:13], w, g, 1e-5, b)    # decode kernel, two token groups
    want = reference.draft_fc(x.double().cpu(), w.double().cpu(), g.double().cpu(), 1e-5, b.double().cpu())
    assert rel_err(full, want) <= 2e-3 and rel_err(one, want[:8]) <= 2e-3 and rel_err(two, want[:13]) <= 2e-3


@pytest.mark.cuda
@pytest.mark.parametrize("graph", [False, True])
def test_cuda_decode_right_after_its_producers(graph, decode_kernel):
    """The decode kernel reads the activations and weights that the kernels just before it wrote, eagerly and inside
    a CUDA graph (back-to-back launches, each call a different input)."""
    gen = torch.Generator().manual_seed(14)
    dt = torch.bfloat16
    m, k, h, n = 5, 3, 1024, 200
    xs = [randn((m, k * h), dt, "cuda", gen) for _ in range(4)]
    wts = [randn((n, k * h), dt, "cuda", gen, 0.03) for _ in range(4)]
    g = randn((k, h), dt, "cuda", gen) + 1
    x, w = torch.empty_like(xs[0]), torch.empty_like(wts[0])
    outs = [torch.full((m, n), float("nan"), dtype=dt, device="cuda") for _ in range(4)]

    def run():
        for i in range(4):
            x.copy_(xs[i])
            w.copy_(wts[i])
            ops.draft_fc(x, w, g, 1e-6, out=outs[i])

    run()  # eager (also allocates the workspace before any capture)
    if graph:
        for o in outs:
            o.fill_(float("nan"))
        cg = torch.cuda.CUDAGraph()
        with torch.cuda.graph(cg):
            run()
        for o in outs:
            o.fill_(float("nan"))
        cg.replay()
    torch.cuda.synchronize()
    for i in range(4):
        want = reference.draft_fc(xs[i].double().cpu(), wts[i].double().cpu(), g.double().cpu(), 1e-6)
        assert rel_err(outs[i], want) <= 1e-2, f"call {i}"


@pytest.mark.cuda
@pytest.mark.parametrize("m", [1, 5, 8, 9, 16, 17])
def test_cuda_decode_threshold_knob_keeps_results(m):
    """_set_draft_fc_decode_max_rows only moves M between the decode kernel and normalise + cuBLAS."""
    gen = torch.Generator().manual_seed(15 + m)
    dt = torch.bfloat16
    x = randn((m, 2 * 7168), dt, "cuda", gen)
    w = randn((300, 2 * 7168), dt, "cuda", gen, 0.01)
    g = randn((2, 7168), dt, "cuda", gen) + 1
    want = reference.draft_fc(x.double().cpu(), w.double().cpu(), g.double().cpu(), 1e-6)
    prev = ops._set_draft_fc_decode_max_rows(0)
    try:
        via_cublas = ops.draft_fc(x, w, g, 1e-6)
        ops._set_draft_fc_decode_max_rows(64)
        via_decode = ops.draft_fc(x, w, g, 1e-6)  # M = 17 stays on normalise + cuBLAS: the knob is clamped to 16
    finally:
        ops._set_draft_fc_decode_max_rows(prev)
    assert rel_err(via_cublas, want) <= 1e-2 and rel_err(via_decode, want) <= 1e-2


@pytest.mark.cuda
@pytest.mark.parametrize("kernel", ["auto", "cluster", "split"])
@settings(max_examples=fuzz_examples(120))
@given(data=st.data())
def test_cuda_every_decode_kernel_matches_reference(kernel, data):
    """Every decode kernel on M <= 16 (one or two token groups, the threshold raised to 16): auto, cluster (sm_90+,
    K <= 8; K > 8 runs split) and split."""
    with decode_settings(kernel, 16):
        case = data.draw(fc_cases("cuda"))
        case["m"] = data.draw(st.integers(1, 16))
        if case["dtype"] == torch.float32:
            case["dtype"] = torch.bfloat16  # float32 never takes a decode kernel
        check_case(case, "cuda")


@pytest.mark.cuda
def test_cuda_graph_capture_and_replay(decode_kernel):
    gen = torch.Generator().manual_seed(12)
    dt = torch.bfloat16
    x = randn((8, 3 * 1024), dt, "cuda", gen)
    w = randn((256, 3 * 1024), dt, "cuda", gen, 0.03)
    g = randn((3, 1024), dt, "cuda", gen) + 1
    out = torch.full((8, 256), float("nan"), dtype=dt, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        ops.draft_fc(x, w, g, 1e-6, out=out)  # eager warm-up: allocates the decode workspace
    torch.cuda.current_stream().wait_stream(s)
    graph = capture_fc(x, w, g, out)
    for trial in range(3):
        replay_and_check(graph, x, w, g, out, gen, 1e-2, trial)


@pytest.mark.cuda
def test_cuda_capture_without_warmup_then_eager():
    """A workspace first needed inside a capture is allocated there; replays and later eager calls are right."""
    gen = torch.Generator().manual_seed(13)
    dt = torch.bfloat16
    x = randn((4, 4 * 1024), dt, "cuda", gen)
    w = randn((40000, 4 * 1024), dt, "cuda", gen, 0.02)  # larger K*N than any earlier call: a new workspace
    g = randn((4, 1024), dt, "cuda", gen) + 1
    out = torch.full((4, 40000), float("nan"), dtype=dt, device="cuda")
    graph = capture_fc(x, w, g, out)
    for trial in range(2):
        want = replay_and_check(graph, x, w, g, out, gen, 1e-2, trial)
        eager = ops.draft_fc(x, w, g, 1e-6)
        assert rel_err(eager, want) <= 1e-2, f"eager after replay {trial}"


@pytest.mark.cuda
def test_cuda_rejects_misaligned_rows_and_mixed_devices():
    x = _bf(4, 3 * 64 + 4, device="cuda")[:, : 3 * 64]  # row stride 196: not a multiple of 8
    with pytest.raises(RuntimeError, match="multiple of 8 elements"):
        ops.draft_fc(x, _bf(16, 192, device="cuda"))
    with pytest.raises(RuntimeError, match="device"):
        ops.draft_fc(_bf(4, 64, device="cuda"), _bf(16, 64))
