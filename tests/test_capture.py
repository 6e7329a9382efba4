"""capture_ and fused_add_rmsnorm_capture_ against the float64 reference: fuzzed shapes, strides, offsets and
dtypes; poisoned outputs; untouched neighbours; bad inputs; opcheck; CUDA graphs (marker `cuda`).

One file (just over 400 lines): the CUDA tests at the end reuse the case strategies, the packed-buffer builder and
the outside-the-slot check of the CPU tests above them."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings, strategies as st

from eagle3_capture import ops, reference
from helpers import DTYPES, assert_close_rel, bits, randn, strided_rows
from conftest import DEVICES, fuzz_examples

# H values that exercise the vector body, the scalar tail, and several blocks per row on CUDA (H > 4096 for bf16).
H_VALUES = st.one_of(st.integers(1, 40), st.integers(41, 300), st.sampled_from([4096, 4100, 7168, 7171]))


@st.composite
def capture_cases(draw):
    h = draw(H_VALUES)
    max_t = 40 if h <= 300 else 5
    k = draw(st.integers(1, 4))
    return dict(
        dtype=draw(st.sampled_from(DTYPES)),
        t=draw(st.one_of(st.just(0), st.just(1), st.integers(0, max_t))),
        h=h, k=k, slot=draw(st.integers(0, k - 1)),
        packed_pad=draw(st.integers(0, 9)), packed_off=draw(st.integers(0, 3)),
        hidden_pad=draw(st.integers(0, 9)), hidden_off=draw(st.integers(0, 3)),
        residual_pad=draw(st.integers(0, 9)), residual_off=draw(st.integers(0, 3)),
        with_residual=draw(st.booleans()), seed=draw(st.integers(0, 2**31 - 1)),
    )


def _make_packed(c, device, gen):
    """A row-strided packed view poisoned with NaN in the target slot; its storage's other bytes hold random
    values that must come back unchanged."""
    packed, base = strided_rows(c["t"], c["k"] * c["h"], c["dtype"], device, gen, c["packed_pad"], c["packed_off"])
    h, s = c["h"], c["slot"]
    packed[:, s * h:(s + 1) * h] = float("nan")
    return packed, base


def _assert_outside_slot_unchanged(base_before, base_after, c):
    h, s, off = c["h"], c["slot"], c["packed_off"]
    mask = torch.ones(base_before.shape, dtype=torch.bool)
    mask[:, off + s * h: off + (s + 1) * h] = False
    changed = (bits(base_before.cpu()) != bits(base_after.cpu())) & mask
    assert not changed.any(), f"{int(changed.sum())} packed elements outside slot {s} were written"


@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=fuzz_examples(500))
@given(c=capture_cases())
def test_capture_matches_reference(device, c):
    gen = torch.Generator().manual_seed(c["seed"])
    packed, base = _make_packed(c, device, gen)
    hidden, _ = strided_rows(c["t"], c["h"], c["dtype"], device, gen, c["hidden_pad"], c["hidden_off"])
    residual = None
    if c["with_residual"]:
        residual, _ = strided_rows(c["t"], c["h"], c["dtype"], device, gen, c["residual_pad"], c["residual_off"])
    hidden_before = hidden.clone()
    residual_before = residual.clone() if residual is not None else None
    base_before = base.clone()

    ops.capture_(packed, c["slot"], hidden, residual)

    h, s = c["h"], c["slot"]
    got = packed[:, s * h:(s + 1) * h]
    want64 = reference.capture(packed.double().cpu(), s, hidden.double().cpu(),
                               None if residual is None else residual.double().cpu())[:, s * h:(s + 1) * h]
    assert_close_rel(got, want64, c["dtype"], "capture slot")
    # Bit-exact with torch's own `hidden + residual` (fp32 add, one rounding) or a plain copy.
    exact = hidden if residual is None else hidden + residual
    assert torch.equal(bits(got.contiguous()), bits(exact.contiguous())), "capture differs from torch's add"
    _assert_outside_slot_unchanged(base_before, base, c)
    assert torch.equal(bits(hidden.contiguous()), bits(hidden_before.contiguous())), "hidden was modified"
    if residual is not None:
        assert torch.equal(bits(residual.contiguous()), bits(residual_before.contiguous())), "residual was modified"


@st.composite
def fused_cases(draw):
    c = draw(capture_cases())
    c["weight_off"] = draw(st.integers(0, 3))
    c["eps"] = draw(st.sampled_from([1e-6, 1e-5, 0.1]))
    c["scale"] = draw(st.sampled_from([1.0, 30.0, 1e-3]))
    return c


@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=fuzz_examples(500))
@given(c=fused_cases())
def test_fused_add_rmsnorm_capture_matches_reference(device, c):
    gen = torch.Generator().manual_seed(c["seed"])
    dt, t, h, s = c["dtype"], c["t"], c["h"], c["slot"]
    packed, base = _make_packed(c, device, gen)
    hidden, _ = strided_rows(t, h, dt, device, gen, c["hidden_pad"], c["hidden_off"], c["scale"])
    residual, _ = strided_rows(t, h, dt, device, gen, c["residual_pad"], c["residual_off"], c["scale"])
    wbase = randn((h + c["weight_off"],), dt, device, gen)
    weight = wbase[c["weight_off"]:]
    h64, r64, w64 = hidden.double().cpu(), residual.double().cpu(), weight.double().cpu()
    exact_residual = hidden + residual  # torch's fp32 add with one rounding: what the residual must hold
    base_before = base.clone()

    ops.fused_add_rmsnorm_capture_(hidden, residual, weight, c["eps"], packed, s)

    want_h, want_r, _ = reference.fused_add_rmsnorm_capture(h64, r64, w64, c["eps"], packed.double().cpu(), s)
    assert_close_rel(residual, want_r, dt, "residual")
    assert torch.equal(bits(residual.contiguous()), bits(exact_residual.contiguous())), "residual != torch add"
    got_slot = packed[:, s * h:(s + 1) * h]
    assert torch.equal(bits(got_slot.contiguous()), bits(residual.contiguous())), "captured slot != new residual"
    # fp32 accumulation over H terms plus one rounding of the output.
    rtol = {torch.float32: 2e-5, torch.float16: 2.0 / 1024, torch.bfloat16: 2.0 / 128}[dt]
    assert_close_rel(hidden, want_h, dt, "normed hidden", rtol=rtol)
    _assert_outside_slot_unchanged(base_before, base, c)


# ---------------------------------------------------------------- bad inputs


def _bf16(shape, device="cpu"):
    return torch.randn(shape, device=device).to(torch.bfloat16)


_KEEPALIVE = []


def _misaligned_bf16(n):
    """A bf16 tensor whose data starts at an odd byte address (torch itself never makes one; foreign buffers can)."""
    buf = bytearray(2 * n + 2)
    _KEEPALIVE.append(buf)
    t = torch.frombuffer(buf, dtype=torch.bfloat16, offset=1, count=n)
    assert t.data_ptr() % 2 == 1
    return t


CAPTURE_ERRORS = [
    ("int dtype", lambda: (torch.zeros(2, 8, dtype=torch.int32), 0, torch.zeros(2, 4, dtype=torch.int32), None),
     "float32, float16 or bfloat16"),
    ("dtype mismatch", lambda: (torch.zeros(2, 8), 0, _bf16((2, 4)), None), "dtype of hidden"),
    ("residual dtype", lambda: (_bf16((2, 8)), 0, _bf16((2, 4)), torch.zeros(2, 4)), "dtype of hidden"),
    ("packed 1-D", lambda: (_bf16((8,)), 0, _bf16((2, 4)), None), "2-D"),
    ("hidden 3-D", lambda: (_bf16((2, 8)), 0, _bf16((2, 4, 1)), None), "2-D"),
    ("row mismatch", lambda: (_bf16((3, 8)), 0, _bf16((2, 4)), None), "T=2 rows"),
    ("width not K*H", lambda: (_bf16((2, 9)), 0, _bf16((2, 4)), None), "K*H"),
    ("packed too narrow", lambda: (_bf16((2, 2)), 0, _bf16((2, 4)), None), "K*H"),
    ("slot >= K", lambda: (_bf16((2, 8)), 2, _bf16((2, 4)), None), "out of range"),
    ("slot < 0", lambda: (_bf16((2, 8)), -1, _bf16((2, 4)), None), "out of range"),
    ("hidden column-strided", lambda: (_bf16((4, 8)), 0, _bf16((4, 4)).t(), None), "contiguous rows"),
    ("packed column-strided", lambda: (_bf16((8, 4)).t(), 0, _bf16((4, 4)), None), "contiguous rows"),
    ("residual shape", lambda: (_bf16((2, 8)), 0, _bf16((2, 4)), _bf16((2, 3))), "shape of hidden"),
    ("hidden aliases slot", lambda: (lambda p: (p, 1, p[:, 4:8], None))(_bf16((2, 8))), "share memory"),
    ("overlapping rows", lambda: (torch.as_strided(_bf16((16,)), (2, 8), (4, 1)), 0, _bf16((2, 4)), None),
     "not to overlap"),
    ("misaligned hidden", lambda: (_bf16((1, 8)), 0, _misaligned_bf16(4).view(1, 4), None), "aligned"),
]


@pytest.mark.parametrize("name,make,msg", CAPTURE_ERRORS, ids=[c[0] for c in CAPTURE_ERRORS])
def test_capture_rejects_bad_input(name, make, msg):
    packed, slot, hidden, residual = make()
    before = packed.clone()
    with pytest.raises(RuntimeError, match=msg):
        ops.capture_(packed, slot, hidden, residual)
    assert torch.equal(bits(packed.contiguous()) if packed.dtype != torch.int32 else packed,
                       bits(before.contiguous()) if before.dtype != torch.int32 else before), "written on error"


def _fused_args(h=4, t=2):
    return dict(hidden=_bf16((t, h)), residual=_bf16((t, h)), weight=_bf16((h,)), eps=1e-6,
                packed=_bf16((t, 3 * h)), slot=1)


FUSED_ERRORS = [
    ("weight shape", dict(weight=_bf16((5,))), r"weight of shape \[4\]"),
    ("weight 2-D", dict(weight=_bf16((1, 4))), "1-D"),
    ("weight strided", dict(weight=_bf16((8,))[::2]), "contiguous"),
    ("weight dtype", dict(weight=torch.randn(4)), "dtype of hidden"),
    ("eps negative", dict(eps=-1.0), "eps"),
    ("eps nan", dict(eps=float("nan")), "eps"),
    ("residual shape", dict(residual=_bf16((2, 5))), "shape of hidden"),
    ("slot", dict(slot=3), "out of range"),
    ("packed dtype", dict(packed=torch.randn(2, 12)), "dtype of hidden"),
]


@pytest.mark.parametrize("name,override,msg", FUSED_ERRORS, ids=[c[0] for c in FUSED_ERRORS])
def test_fused_rejects_bad_input(name, override, msg):
    a = _fused_args()
    a.update(override)
    with pytest.raises(RuntimeError, match=msg):
        ops.fused_add_rmsnorm_capture_(a["hidden"], a["residual"], a["weight"], a["eps"], a["packed"], a["slot"])


def test_fused_rejects_aliasing_hidden_residual():
    x = _bf16((2, 4))
    with pytest.raises(RuntimeError, match="share memory"):
        ops.fused_add_rmsnorm_capture_(x, x, _bf16((4,)), 1e-6, _bf16((2, 8)), 0)


# ---------------------------------------------------------------- opcheck


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_opcheck(device, dtype):
    gen = torch.Generator().manual_seed(0)
    for t, h, k, slot in [(5, 16, 3, 1), (3, 7, 2, 0), (0, 8, 1, 0)]:
        base = randn((t, k * h + 4), dtype, device, gen)
        packed = base[:, : k * h]
        hidden = randn((t, h), dtype, device, gen)
        residual = randn((t, h), dtype, device, gen)
        weight = randn((h,), dtype, device, gen)
        torch.library.opcheck(torch.ops.eagle3_capture.capture_.default, (packed, slot, hidden, residual))
        torch.library.opcheck(torch.ops.eagle3_capture.capture_.default, (packed, slot, hidden, None))
        torch.library.opcheck(torch.ops.eagle3_capture.fused_add_rmsnorm_capture_.default,
                              (hidden, residual, weight, 1e-6, packed, slot))


def test_compiles_under_torch_compile():
    gen = torch.Generator().manual_seed(1)

    def step(hidden, residual, weight, packed):
        ops.fused_add_rmsnorm_capture_(hidden, residual, weight, 1e-6, packed, 1)
        return hidden * 2

    h, r, w = (randn(s, torch.float32, "cpu", gen) for s in [(4, 8), (4, 8), (8,)])
    p1, p2 = torch.zeros(4, 16), torch.zeros(4, 16)
    h2, r2 = h.clone(), r.clone()
    eager = step(h, r, w, p1)
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")(h2, r2, w, p2)
    assert torch.allclose(eager, compiled) and torch.equal(p1, p2) and torch.equal(r, r2)


# ---------------------------------------------------------------- meta tensors


def _meta_mix_cases():
    """(what, call) for each capture op with one meta argument among CPU tensors, through the Python API and the
    bare torch.ops entry point."""
    def args(meta):
        t = {"packed": torch.zeros(4, 16), "hidden": torch.randn(4, 8), "residual": torch.randn(4, 8),
             "weight": torch.ones(8)}
        t[meta] = torch.empty_like(t[meta], device="meta")
        return t

    cases = []
    for meta in ("packed", "hidden", "residual"):
        cases.append((f"capture_ {meta}", meta, lambda a: ops.capture_(a["packed"], 1, a["hidden"], a["residual"]), args))
        cases.append((f"torch.ops capture_ {meta}", meta, lambda a: torch.ops.eagle3_capture.capture_(
            a["packed"], 1, a["hidden"], a["residual"]), args))
    for meta in ("packed", "hidden", "residual", "weight"):
        cases.append((f"fused {meta}", meta, lambda a: ops.fused_add_rmsnorm_capture_(
            a["hidden"], a["residual"], a["weight"], 1e-6, a["packed"], 1), args))
        cases.append((f"torch.ops fused {meta}", meta, lambda a: torch.ops.eagle3_capture.fused_add_rmsnorm_capture_(
            a["hidden"], a["residual"], a["weight"], 1e-6, a["packed"], 1), args))
    return cases


@pytest.mark.parametrize("what, meta, call, args", _meta_mix_cases(), ids=[c[0] for c in _meta_mix_cases()])
def test_meta_tensors_mixed_with_cpu_tensors_are_refused(what, meta, call, args):
    """One meta argument sends the call to the Meta (fake) kernel, which writes nothing: refused in the ops'
    BackendSelect check (C++), naming the meta argument and the device of the others. Nothing is written."""
    a = args(meta)
    before = {k: v.clone() for k, v in a.items() if not v.is_meta}
    with pytest.raises(RuntimeError, match=rf"{meta} is on the meta device but \w+ is on cpu"):
        call(a)
    for k, v in before.items():
        assert torch.equal(a[k], v), f"{k} was written"


def test_meta_only_calls_still_trace():
    """All-meta arguments are a shape check (what tracing does): accepted, nothing computed."""
    m = {k: torch.empty(s, device="meta") for k, s in (("p", (4, 16)), ("h", (4, 8)), ("r", (4, 8)), ("w", (8,)))}
    ops.capture_(m["p"], 1, m["h"], m["r"])
    ops.fused_add_rmsnorm_capture_(m["h"], m["r"], m["w"], 1e-6, m["p"], 0)
    with pytest.raises(RuntimeError, match="slot 2 out of range"):
        ops.capture_(m["p"], 2, m["h"])


# ---------------------------------------------------------------- CUDA only


@pytest.mark.cuda
def test_cuda_graph_capture_and_replay():
    dev, dt, t, h, k = "cuda", torch.bfloat16, 64, 7168, 3
    gen = torch.Generator().manual_seed(2)
    packed = torch.full((t, k * h), float("nan"), dtype=dt, device=dev)
    hid, res, w = (randn(s, dt, dev, gen) for s in [(t, h), (t, h), (h,)])
    emb = randn((t, h), dt, dev, gen)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up outside the graph
        ops.capture_(packed, 0, emb)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        ops.capture_(packed, 0, emb)
        ops.capture_(packed, 2, hid, res)
        ops.fused_add_rmsnorm_capture_(hid, res, w, 1e-6, packed, 1)
    for trial in range(3):
        packed.fill_(float("nan"))
        for src in (hid, res, w, emb):
            src.copy_(randn(src.shape, dt, dev, gen))
        h64, r64, w64, e64 = (x.double().cpu() for x in (hid, res, w, emb))
        g.replay()
        torch.cuda.synchronize()
        want_h, want_r, _ = reference.fused_add_rmsnorm_capture(h64, r64, w64, 1e-6, torch.zeros(t, k * h), 1)
        assert_close_rel(packed[:, :h], e64, dt, f"replay {trial} slot 0")
        assert_close_rel(packed[:, 2 * h:], h64 + r64, dt, f"replay {trial} slot 2")
        assert_close_rel(packed[:, h:2 * h], want_r, dt, f"replay {trial} slot 1")
        assert_close_rel(hid, want_h, dt, f"replay {trial} hidden", rtol=2.0 / 128)


@pytest.mark.cuda
def test_cuda_many_rows_walks_grid():
    """T above the 65535 grid-y limit (capture) and above the fused kernel's block cap."""
    gen = torch.Generator().manual_seed(3)
    t, h = 70000, 24
    packed = torch.full((t, 2 * h), float("nan"), dtype=torch.float16, device="cuda")
    hid, res = (randn((t, h), torch.float16, "cuda", gen) for _ in range(2))
    ops.capture_(packed, 1, hid, res)
    assert torch.equal(bits(packed[:, h:].contiguous()), bits((hid + res).contiguous()))
    w = randn((h,), torch.float16, "cuda", gen)
    want_h, want_r, _ = reference.fused_add_rmsnorm_capture(hid.double(), res.double(), w.double(), 1e-6,
                                                            packed.double(), 0)
    ops.fused_add_rmsnorm_capture_(hid, res, w, 1e-6, packed, 0)
    assert_close_rel(hid, want_h, torch.float16, "hidden", rtol=2.0 / 1024)
    assert torch.equal(bits(packed[:, :h].contiguous()), bits(res.contiguous()))


@pytest.mark.cuda
@pytest.mark.parametrize("dt", [torch.bfloat16, torch.float32])
def test_cuda_fused_many_rows_at_h7168(dt):
    """More rows than SMs at the first user's H: the launcher's occupancy rule picks the block size (tuning.h; 896 on
    the H200, 448 on sm_120, several vectors a thread there)."""
    gen = torch.Generator().manual_seed(7168)
    t, h = 600, 7168
    hid, res = (randn((t, h), dt, "cuda", gen) for _ in range(2))
    w = randn((h,), dt, "cuda", gen)
    packed = torch.full((t, 2 * h), float("nan"), dtype=dt, device="cuda")
    exact_residual = hid + res
    want_h, want_r, _ = reference.fused_add_rmsnorm_capture(hid.double(), res.double(), w.double(), 1e-6,
                                                            packed.double(), 1)
    ops.fused_add_rmsnorm_capture_(hid, res, w, 1e-6, packed, 1)
    assert torch.equal(bits(res.contiguous()), bits(exact_residual.contiguous()))
    assert torch.equal(bits(packed[:, h:].contiguous()), bits(res.contiguous()))
    assert_close_rel(hid, want_h, dt, "hidden", rtol=2.0 / 128 if dt == torch.bfloat16 else 1e-5)


@pytest.mark.cuda
def test_cuda_malformed_tuning_override_is_an_error_naming_it():
    """The device's tuning is read once per process, so a fresh one: the CUDA op raises, naming the variable."""
    import os
    import subprocess
    import sys

    code = ("import torch; from eagle3_capture import ops\n"
            "x = torch.ones(2, 64, dtype=torch.bfloat16, device='cuda')\n"
            "try:\n"
            "    ops.fused_add_rmsnorm_capture_(x, x.clone(), x[0].clone(), 1e-6, x.clone(), 0)\n"
            "except RuntimeError as e:\n"
            "    print('raised:', e)\n")
    env = dict(os.environ, EAGLE3_CAPTURE_FUSED_NORM_THREADS="100")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert "raised:" in out.stdout and "EAGLE3_CAPTURE_FUSED_NORM_THREADS must be an integer in 0..1024" in out.stdout, (
        out.stdout + out.stderr)


@pytest.mark.cuda
def test_cuda_fused_large_hidden_uses_big_shared_memory():
    gen = torch.Generator().manual_seed(4)
    t, h = 3, 20000  # fp32 row of 80 KB: above the default 48 KB dynamic shared memory
    hid, res = (randn((t, h), torch.bfloat16, "cuda", gen) for _ in range(2))
    w = randn((h,), torch.bfloat16, "cuda", gen)
    packed = torch.full((t, h), float("nan"), dtype=torch.bfloat16, device="cuda")
    want_h, _, _ = reference.fused_add_rmsnorm_capture(hid.double(), res.double(), w.double(), 1e-5,
                                                       packed.double(), 0)
    ops.fused_add_rmsnorm_capture_(hid, res, w, 1e-5, packed, 0)
    assert_close_rel(hid, want_h, torch.bfloat16, "hidden", rtol=2.0 / 128)


@pytest.mark.cuda
def test_cuda_rejects_mixed_devices():
    with pytest.raises(RuntimeError, match="device"):
        ops.capture_(_bf16((2, 8), "cuda"), 0, _bf16((2, 4)), None)
    with pytest.raises(RuntimeError, match="device"):
        ops.capture_(_bf16((2, 8), "cuda"), 0, _bf16((2, 4), "cuda"), _bf16((2, 4)))
    with pytest.raises(RuntimeError, match="device"):
        ops.fused_add_rmsnorm_capture_(_bf16((2, 4), "cuda"), _bf16((2, 4), "cuda"), _bf16((4,)), 1e-6,
                                       _bf16((2, 8), "cuda"), 0)


@pytest.mark.cuda
def test_cuda_runs_on_current_stream():
    gen = torch.Generator().manual_seed(5)
    s = torch.cuda.Stream()
    hid = randn((128, 512), torch.bfloat16, "cuda", gen)
    packed = torch.full((128, 1024), float("nan"), dtype=torch.bfloat16, device="cuda")
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        ops.capture_(packed, 1, hid)
        out = packed[:, 512:].clone()  # ordered after the capture on s
    torch.cuda.synchronize()
    assert torch.equal(bits(out), bits(hid))
