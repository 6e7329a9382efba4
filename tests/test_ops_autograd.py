"""The ops are inference-only: with grad mode on, any tensor argument that requires grad is refused with an error
naming the op and the argument (no silent gradient loss, no torch-internal message); under torch.no_grad() and
torch.inference_mode() the same calls run and give the reference result."""
import pytest
import torch

from eagle3_capture import ops, reference

H, K, N, M = 16, 3, 8, 4


def _data():
    g = torch.Generator().manual_seed(0)
    return dict(x=torch.randn(M, K * H, generator=g), w=torch.randn(N, K * H, generator=g),
                g=1 + 0.1 * torch.randn(K, H, generator=g), b=torch.randn(N, generator=g))


def _draft_fc_calls():
    d = _data()
    lin = torch.nn.Linear(K * H, N)
    return [
        ("an nn.Linear's weight", "weight", lambda: ops.draft_fc(d["x"], lin.weight, d["g"], 1e-6, None)),
        ("an nn.Linear's bias", "bias", lambda: ops.draft_fc(d["x"], d["w"], d["g"], 1e-6, lin.bias)),
        ("packed x", "x", lambda: ops.draft_fc(d["x"].clone().requires_grad_(), d["w"], d["g"])),
        ("a list tap", "x[1]", lambda: ops.draft_fc([t.clone().requires_grad_(i == 1) for i, t in
                                                    enumerate(d["x"].chunk(K, -1))], d["w"], d["g"])),
        ("norm weights", "norm_weights", lambda: ops.draft_fc(d["x"], d["w"], d["g"].clone().requires_grad_())),
        ("out", "out", lambda: ops.draft_fc(d["x"], d["w"], d["g"], out=torch.empty(M, N, requires_grad=True))),
    ]


@pytest.mark.parametrize("case", range(6))
def test_draft_fc_refuses_inputs_that_require_grad(case):
    what, arg, call = _draft_fc_calls()[case]
    with pytest.raises(RuntimeError) as e:
        call()
    msg = str(e.value)
    assert "eagle3_capture.draft_fc" in msg and "inference-only" in msg and f"'{arg}'" in msg, msg
    assert "torch.no_grad()" in msg


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
def test_draft_fc_runs_without_grad_mode(mode):
    d = _data()
    lin = torch.nn.Linear(K * H, N)
    ctx = torch.no_grad() if mode == "no_grad" else torch.inference_mode()
    with ctx:
        y = ops.draft_fc(d["x"], lin.weight, d["g"], 1e-6, lin.bias)
    want = reference.draft_fc(d["x"].double(), lin.weight.detach().double(), d["g"].double(), 1e-6,
                              lin.bias.detach().double())
    assert not y.requires_grad
    torch.testing.assert_close(y.double(), want, rtol=1e-5, atol=1e-5)


def test_capture_ops_refuse_a_leaf_that_requires_grad():
    """torch refuses an in-place op on a leaf that requires grad; so do the capture ops (with the op's name)."""
    packed = torch.zeros(M, K * H, requires_grad=True)
    h = torch.randn(M, H)
    with pytest.raises(RuntimeError, match=r"eagle3_capture\.capture_ is inference-only.*'packed'"):
        ops.capture_(packed, 0, h)
    with pytest.raises(RuntimeError, match=r"eagle3_capture\.capture_ is inference-only.*'residual'"):
        ops.capture_(torch.zeros(M, K * H), 0, h, torch.randn(M, H, requires_grad=True))
    hidden, residual, w = torch.randn(M, H), torch.randn(M, H), torch.ones(H)
    for name, args in (("hidden", (hidden.clone().requires_grad_(), residual, w)),
                       ("residual", (hidden, residual.clone().requires_grad_(), w)),
                       ("weight", (hidden, residual, torch.nn.Parameter(w)))):
        with pytest.raises(RuntimeError, match=rf"fused_add_rmsnorm_capture_ is inference-only.*'{name}'"):
            ops.fused_add_rmsnorm_capture_(*args, 1e-6, torch.zeros(M, K * H), 0)


def test_capture_ops_under_no_grad_write_as_before():
    packed = torch.zeros(M, K * H, requires_grad=True)
    h, r = torch.randn(M, H), torch.randn(M, H)
    with torch.no_grad():
        ops.capture_(packed, 1, h, r)
    assert torch.equal(packed.detach()[:, H:2 * H], h + r)
    hidden, residual, w = torch.randn(M, H), torch.randn(M, H), torch.nn.Parameter(torch.ones(H))
    out = torch.zeros(M, K * H)
    with torch.no_grad():
        ops.fused_add_rmsnorm_capture_(hidden, residual, w, 1e-6, out, 2)
    assert torch.equal(out[:, 2 * H:], residual)
