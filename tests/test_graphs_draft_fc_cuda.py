"""The draft fc as the plugin's hooks call it, inside CUDA graphs captured and replayed the way SGLang 0.5.23's
draft-extend runner does (tests/graph_protocol.py: two eager warm-ups on the capture stream, several graphs in one
memory pool, largest batch first, replays in random order with new inputs). Each replay is compared with the same
call run eagerly and with the float64 reference.

Covers the three forms the hooks use (per-tap fc_norm through the hooks' own `_norm_stack`, the whole-row
input_norm, plain) at M <= 8 (the decode kernels: the default choice and the split-K kernel with its workspace)
and M > 8 (normalise + cuBLAS); an in-place fc_norm update between replays (what SGLang's update-weights paths do:
`param.data.copy_`, through the parameters' weight loaders); and the decode workspace first needed inside a capture,
shared by a graph captured later and replayed first (in a fresh process, so the workspace does not exist yet)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from torch import nn

from eagle3_capture import ops, reference
from eagle3_capture.sglang import draft
from graph_protocol import GraphRunner, random_order

pytestmark = pytest.mark.cuda

K, H, EPS = 3, 7168, 1e-6
DT = torch.bfloat16
REL = 1e-2  # the op's bf16 bound (tests/test_draft_fc.py)
BATCHES = [1, 2, 4, 8, 12, 16]  # <= 8: decode kernels; > 8: normalise + cuBLAS
HERE = os.path.dirname(os.path.abspath(__file__))


class Norm(nn.Module):
    """What `_norm_stack` reads of SGLang's RMSNorm: a `weight` parameter (the SGLang-class version of these tests
    is tests/plugin/test_graphs_sglang_cuda.py)."""

    def __init__(self, w: torch.Tensor):
        super().__init__()
        self.weight = nn.Parameter(w.clone(), requires_grad=False)


class Draft(nn.Module):
    """The parameters the fc hook reads, on CUDA: fc weight [N, K*H], bias, per-tap fc_norm or a row input_norm."""

    def __init__(self, form: str, n: int, seed: int):
        super().__init__()
        g = torch.Generator(device="cuda").manual_seed(seed)
        self.form = form
        self.fc_weight = nn.Parameter((torch.randn(n, K * H, generator=g, device="cuda") / (K * H) ** 0.5).to(DT),
                                      requires_grad=False)
        self.bias = nn.Parameter(torch.randn(n, generator=g, device="cuda").to(DT), requires_grad=False)
        self.fc_norm = nn.ModuleList([Norm((1 + 0.2 * torch.randn(H, generator=g, device="cuda")).to(DT))
                                      for _ in range(K)]) if form == "fc_norm" else None
        self.input_norm = Norm((1 + 0.2 * torch.randn(K * H, generator=g, device="cuda")).to(DT)) \
            if form == "input_norm" else None

    def fc(self, x: torch.Tensor) -> torch.Tensor:
        """The op call the hooks make (draft._mla_fc / draft._llama_fc) for this form."""
        if self.form == "fc_norm":
            return draft.fused_fc(x, self.fc_weight, draft._norm_stack(self, list(self.fc_norm), x.dtype), EPS,
                                  self.bias)
        if self.form == "input_norm":
            return draft.fused_fc(x, self.fc_weight, None, 1e-6, self.bias,
                                  row_norm_weight=self.input_norm.weight.detach(), row_eps=EPS)
        return draft.fused_fc(x, self.fc_weight, None, 1e-6, self.bias)

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        """reference.draft_fc in float64 (on the GPU: the same plain-torch code, and fast at N = 7168), with the
        weights as they are now."""
        if getattr(self, "_w64", None) is None:
            self._w64, self._b64 = self.fc_weight.double(), self.bias.double()
        x64 = x.double()
        if self.form == "fc_norm":
            g64 = torch.stack([n.weight.double() for n in self.fc_norm])
            return reference.draft_fc(x64, self._w64, g64, EPS, self._b64, round_normed_to=DT)
        if self.form == "input_norm":
            return reference.draft_fc(x64, self._w64, self.input_norm.weight.double().view(1, -1), EPS, self._b64,
                                      round_normed_to=DT)
        return reference.draft_fc(x64, self._w64, None, EPS, self._b64)


def features(bs: int, seed: int) -> torch.Tensor:
    """Packed [bs, K*H] taps of very different scales (as the embedding and deep layers are); never zeros."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.cat([torch.randn(bs, H, generator=g, device="cuda") * s for s in (0.05, 3.0, 30.0)], 1).to(DT)


def rel(got: torch.Tensor, want64: torch.Tensor) -> float:
    g = got.double()
    assert not torch.isnan(g).any(), "NaN in the output: the replay did not write it"
    return float((g - want64).norm() / want64.norm().clamp_min(1e-30))


@pytest.fixture
def decode_kernel(request):
    before = ops._set_draft_fc_decode_kernel(request.param)
    yield request.param
    ops._set_draft_fc_decode_kernel(before)


def _replay_and_compare(model: Draft, runner: GraphRunner, x_buf: torch.Tensor, order, seed: int) -> None:
    for i, bs in enumerate(order):
        x_buf[:bs].copy_(features(bs, seed + i))
        runner.outputs[bs].fill_(float("nan"))  # poison: a replay that does not write its output shows
        got = runner.replay(bs)
        torch.cuda.synchronize()
        eager = model.fc(x_buf[:bs].clone())
        want = model.reference(x_buf[:bs])
        assert got.shape == (bs, model.fc_weight.shape[0])
        assert rel(got, want) <= REL, f"replay {i} (bs {bs}) against the reference"
        assert rel(got, eager.double()) <= REL, f"replay {i} (bs {bs}) against the eager call"


@pytest.mark.parametrize("batches", [BATCHES, [1, 2, 4, 8]], ids=["mixed", "decode"])
@pytest.mark.parametrize("decode_kernel", ["auto", "split"], indirect=True)
@pytest.mark.parametrize("form", ["fc_norm", "input_norm", "plain"])
@pytest.mark.parametrize("n", [896, 7168], ids=["tp8shard", "tp1"])
def test_fc_hook_forms_in_graphs_like_sglang(form, n, decode_kernel, batches):
    """"decode": batch sizes the decode kernels take with the H200's tuning (no cuBLAS: what racecheck can run)."""
    model = Draft(form, n, seed=n + len(form))
    x_buf = features(max(batches), 1)  # the runner's static input buffer; each graph reads its first bs rows
    runner = GraphRunner()
    runner.capture_all(batches, lambda bs: (lambda: model.fc(x_buf[:bs])))
    _replay_and_compare(model, runner, x_buf, random_order(batches, 3 * len(batches), seed=n), seed=100)


def test_in_place_fc_norm_update_reaches_every_replay():
    """RL weight sync: SGLang's update-weights paths load into the existing parameters (`default_weight_loader`:
    `param.data.copy_`). Graphs captured before the update must compute with the new fc_norm weights."""
    model = Draft("fc_norm", 896, seed=3)
    x_buf = features(max(BATCHES), 2)
    runner = GraphRunner()
    runner.capture_all(BATCHES, lambda bs: (lambda: model.fc(x_buf[:bs])))
    _replay_and_compare(model, runner, x_buf, random_order(BATCHES, 8, seed=1), seed=200)
    g = torch.Generator(device="cuda").manual_seed(99)
    for norm in model.fc_norm:
        norm.weight.data.copy_((0.5 + torch.rand(H, generator=g, device="cuda")).to(DT))
    _replay_and_compare(model, runner, x_buf, random_order(BATCHES, 12, seed=2), seed=300)
    # the stack the graphs read is the parameters' storage
    stack = model.__dict__[draft._CACHE_ATTR]
    assert all(n.weight.data_ptr() == stack[k].data_ptr() for k, n in enumerate(model.fc_norm))


def test_norm_stack_is_rebuilt_per_call_when_it_cannot_alias():
    """fp32 fc_norm weights with bf16 activations: no [K, H] bf16 view of the parameters exists, so the stack is
    built in every call (inside the graph too) and replays still read the weights as they are then."""
    model = Draft("fc_norm", 896, seed=4)
    for n in model.fc_norm:
        n.weight.data = n.weight.data.float()
    x_buf = features(8, 3)
    runner = GraphRunner()
    runner.capture_all([4, 8], lambda bs: (lambda: model.fc(x_buf[:bs])))
    for norm in model.fc_norm:
        norm.weight.data.mul_(1.5)
    _replay_and_compare(model, runner, x_buf, [8, 4, 8], seed=400)
    assert draft._CACHE_ATTR not in model.__dict__


def test_workspace_first_needed_inside_a_capture_later_graph_replayed_first():
    """The split decode kernel's workspace first needed inside a capture (no eager warm-up, or a larger (K, N) than
    any eager call), in a fresh process: a graph of the same pool captured before it frees scratch that it fills with
    0xff at every replay; graph A allocates the workspace; graph B, captured later, shares it; B is replayed first,
    right after the scratch graph, then every graph in random order; the process filled and freed memory before, so
    a fresh pool segment is not zero. Each replay must equal the reference."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([HERE] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    proc = subprocess.run([sys.executable, os.path.join(HERE, "graph_workers.py"), "workspace"], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rep = json.loads(proc.stdout.strip().splitlines()[-1])
    assert rep["replays"] == rep["expected"] >= 10 and rep["max_rel"] <= REL, rep
