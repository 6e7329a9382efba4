"""The torch-native speculative tree kernels of the test-only CPU stand-ins (tests/sglang_cpu_plugin/e3_sglang_cpu/
releases.py), which stand in for sgl_kernel's ``build_tree_kernel_efficient`` / ``verify_tree_greedy`` on SGLang
0.5.12 (no CPU branch there), agree element for element with SGLang 0.5.23's own Triton versions of the same kernels
(``sglang/kernels/ops/speculative/spec_tree.py``, run in Triton's interpreter) on draft trees that SGLang's own
``select_top_k_tokens`` / ``organize_draft_results`` build: chains and trees, both tree-mask modes the stand-in
takes, several requests of different lengths.

The engine smoke on 0.5.12 exercises only the chain; this covers the trees too. Run in a fresh process:
TRITON_INTERPRET must be set before Triton compiles anything, and the reference must be 0.5.23's code whatever
release the calling process imports.
"""
import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.sglang]

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

SCRIPT = r'''
import itertools, sys
import torch
from sglang.kernels.ops.speculative.spec_tree import (TreeMaskMode, sgl_build_tree_kernel_triton,
                                                      verify_tree_greedy_triton)
from sglang.srt.speculative.eagle_utils import organize_draft_results
from sglang.srt.speculative.spec_utils import select_top_k_tokens
from e3_sglang_cpu.releases import build_tree_kernel_efficient_torch, verify_tree_greedy_torch

V = 24
cases = accepted = siblings = 0
for (bs, topk, steps, D), mode, seed in itertools.product(
        [(1, 1, 3, 4), (3, 1, 3, 4), (2, 1, 1, 2), (2, 2, 3, 6), (3, 4, 3, 8), (1, 3, 2, 5), (4, 2, 4, 7)],
        [TreeMaskMode.FULL_MASK, TreeMaskMode.QLEN_ONLY], range(3)):
    g = torch.Generator().manual_seed(seed * 1000 + bs * 100 + topk * 10 + steps)
    # the draft phase as SGLang's EAGLE worker runs it, on random draft probabilities
    scores = hs = None
    score_list, token_list, parents_list = [], [], []
    for i in range(steps):
        probs = torch.softmax(3 * torch.randn(bs if i == 0 else bs * topk, V, generator=g), -1)
        topk_p, topk_index = probs.topk(topk, dim=-1)
        _, hs, scores, info = select_top_k_tokens(i, topk_p, topk_index, hs, scores, topk)
        score_list.append(info[0]); token_list.append(info[1]); parents_list.append(info[2])
    parent_list, sel, draft_tokens = organize_draft_results(score_list, token_list, parents_list, D)
    seq_lens = torch.randint(3, 9, (bs,), generator=g)
    n_mask = int(seq_lens.sum()) * D + D * D * bs if mode == TreeMaskMode.FULL_MASK else D * D * bs
    outs = []
    for build in (sgl_build_tree_kernel_triton, build_tree_kernel_efficient_torch):
        mask = torch.ones(n_mask, dtype=torch.bool)
        pos = torch.full((bs * D,), -7, dtype=torch.long)
        r = torch.full((3, bs, D), -1, dtype=torch.long)
        build(parent_list, sel, seq_lens, mask, pos, r[0], r[1], r[2], topk, steps, D, mode)
        outs.append((mask, pos, r))
    (m1, p1, r1), (m2, p2, r2) = outs
    ctx = f"bs={bs} topk={topk} steps={steps} D={D} mode={int(mode)} seed={seed}"
    assert torch.equal(m1, m2), ctx + " tree_mask"
    assert torch.equal(p1, p2), ctx + f" positions {p1.tolist()} vs {p2.tolist()}"
    assert torch.equal(r1, r2), ctx + f" retrieve {r1.tolist()} vs {r2.tolist()}"
    # the verify: target tokens that follow the tree part of the way, then leave it
    bonus = torch.randint(0, V, (bs,), generator=g)
    candidates = torch.cat([bonus[:, None], draft_tokens], 1)
    nxt = r1[1]
    target = torch.randint(0, V, (bs, D), generator=g)
    follow = torch.rand(bs, D, generator=g) < 0.75
    for b in range(bs):
        for j in range(D):
            c = int(nxt[b, j])
            if follow[b, j] and c != -1:  # the first child's token, or a sibling's when there is one
                s = int(r1[2, b, c])
                target[b, j] = candidates[b, s if s != -1 and bool(torch.rand(1, generator=g) < 0.5) else c]
    vouts = []
    for verify in (verify_tree_greedy_triton, verify_tree_greedy_torch):
        predicts = torch.full((bs * D,), -3, dtype=torch.long)
        acc_idx = torch.full((bs, steps + 1), -1, dtype=torch.long)
        acc_num = torch.zeros(bs, dtype=torch.long)
        verify(predicts, acc_idx, acc_num, candidates, r1[0], r1[1], r1[2], target)
        vouts.append((predicts, acc_idx, acc_num))
    (a1, b1, c1), (a2, b2, c2) = vouts
    assert torch.equal(a1, a2) and torch.equal(b1, b2) and torch.equal(c1, c2), (
        ctx + f" verify {a1.tolist()} {b1.tolist()} {c1.tolist()} vs {a2.tolist()} {b2.tolist()} {c2.tolist()}")
    cases += 1
    accepted += int(c1.sum())
    siblings += int((r1[2] != -1).sum())
print("cases", cases, "accepted", accepted, "siblings", siblings)
'''


def test_torch_tree_kernels_equal_sglangs_triton_kernels():
    # The reference is the environment's own SGLang (0.5.23, installed by `make test`), whatever release the caller
    # put first on PYTHONPATH (`make test-sglang SGLANG=0.5.12` runs this file too, and 0.5.12 has no such kernels):
    # only the stand-ins' directory goes on the path.
    env = dict(os.environ, TRITON_INTERPRET="1", TORCHDYNAMO_DISABLE="1",
               PYTHONPATH=os.path.join(REPO, "tests", "sglang_cpu_plugin"))
    p = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=600, env=env, cwd=REPO)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-5000:]
    # 42 cases, and they exercised acceptance and sibling links (not only empty walks)
    fields = p.stdout.split()
    assert fields[:2] == ["cases", "42"], p.stdout
    assert int(fields[3]) > 0 and int(fields[5]) > 0, p.stdout
