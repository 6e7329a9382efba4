"""Near-ties (doctor/replay/near_ties.py, doctor online): the resolution checked on real bf16 argmax flips between
two passes of different shapes (split-K against one GEMM), the alternative outcome of a draft decision, the
explanation search on a real draft's bf16 near-ties, the target side (a served token that is the teacher-forced
pass's runner-up), and float32, where nothing is listed."""
import json
import os

import pytest
import torch

from dump_helpers import TeacherForced
from doctor_helpers import demo_fast
from eagle3_capture.doctor.commands.online import draft_near_ties, target_near_ties
from eagle3_capture.doctor.replay.evaluate import PromptRun, chain_correct_taps, evaluate, served_walks
from eagle3_capture.doctor.replay.near_ties import (NEAR_TIE_ULPS, draft_ties, explains, flipped_accept,
                                                   is_near_tie, target_tie_gap, ulp)
from eagle3_capture.doctor.sglang_model.flag_rules import SpecResolution
from eagle3_capture.doctor.sglang_model.serving import chain_accepted, walk

N = 12


def _two_passes(dtype, n=1024, h=512, v=2048, seed=0):
    """Logits of one two-layer net for the same rows, computed twice: each layer one GEMM, and the first layer as
    two K-halves added after rounding to `dtype` (a split-K kernel's partials). Real roundings, no value set by
    hand."""
    g = torch.Generator().manual_seed(seed)
    w1 = (torch.randn(h, h, generator=g) / h ** 0.5).to(dtype)
    w2 = (torch.randn(v, h, generator=g) / h ** 0.5 * 4).to(dtype)
    x = torch.randn(n, h, generator=g).to(dtype)
    one = torch.nn.functional.silu(x @ w1.T) @ w2.T
    half = h // 2
    split = torch.nn.functional.silu(x[:, :half] @ w1[:, :half].T + x[:, half:] @ w1[:, half:].T) @ w2.T
    return one.float(), split.float()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_every_real_flip_between_two_passes_is_within_the_resolution(dtype):
    a, b = _two_passes(dtype)
    flips = (a.argmax(-1) != b.argmax(-1)).nonzero().flatten()
    for x in (a, b):
        top = x.topk(2, -1).values
        near = is_near_tie(top[:, 0], top[:, 1], dtype)
        assert bool(near[flips].all()), (dtype, flips.tolist())
        if dtype == torch.bfloat16:
            assert flips.numel() > 0                          # the experiment does flip argmaxes in bf16
            assert float(near.float().mean()) < 0.4           # and the resolution is not most positions
        else:
            assert float(near.float().mean()) < 0.01          # float32: hardly any position is a near-tie
    # the gaps of the flips observed, in ulps of the larger logit: within half the definition's NEAR_TIE_ULPS
    top = a.topk(2, -1).values[flips]
    gaps = (top[:, 0] - top[:, 1]).double() / ulp(top[:, 0], dtype)
    assert bool((gaps <= NEAR_TIE_ULPS / 2).all()), gaps.tolist()


def test_the_resolution_by_dtype():
    assert float(ulp(torch.tensor(1.0), torch.bfloat16)) == 2 ** -7
    assert float(ulp(torch.tensor(-12.0), torch.bfloat16)) == 2 ** -4
    assert float(ulp(torch.tensor(3.0), torch.float32)) == 2 ** -22
    assert bool(is_near_tie(torch.tensor(10.0), torch.tensor(10.0 - 4 * 2 ** -4), torch.bfloat16))
    assert not bool(is_near_tie(torch.tensor(10.0), torch.tensor(10.0 - 5 * 2 ** -4), torch.bfloat16))
    assert target_tie_gap(torch.bfloat16) == 4 * 2 ** -2 and target_tie_gap(torch.float32) < 1e-4
    with pytest.raises(ValueError, match="top1 must be >= top2"):
        is_near_tie(torch.tensor(1.0), torch.tensor(2.0), torch.bfloat16)
    with pytest.raises(ValueError, match="no rounding resolution"):
        ulp(torch.tensor(1.0), torch.int32)


@pytest.mark.parametrize("correct,j,runner_right,want", [
    ([1, 1, 0], 1, False, 0), ([1, 1, 0], 2, False, 1), ([1, 1, 0], 3, True, 3), ([1, 1, 0], 3, False, 2),
    ([0, 1, 1], 1, True, 3), ([1, 0, 1], 2, True, 3), ([1, 0, 1], 2, False, 1), ([1, 1, 1], 3, False, 2)])
def test_a_decision_taken_the_other_way(correct, j, runner_right, want):
    assert flipped_accept(correct, j, runner_right) == want


@pytest.fixture(scope="module")
def tf():
    _, out = demo_fast()
    prompts = json.load(open(os.path.join(out, "prompts.json")))[:6]
    return TeacherForced(prompts, os.path.join(out, "draft"), N)


def test_float32_lists_no_near_tie_and_predicts_the_served_counts(tf):
    """The demo pair in float32 (the CPU engine tests' dtype): no draft decision is a near-tie, and the served
    counts are predicted exactly."""
    runs = evaluate(tf.side, tf.draft_side.draft, tf.prompts, tf.draft_side.taps, 3, N, SpecResolution(3, 1, 4), 8,
                    False)
    assert all(r.dtype == torch.float32 for r in runs)
    predicted = served_walks(runs, N)
    responses = [type("R", (), {"served": s, "histogram": s.histogram})() for s in tf.served]
    ties, explained = draft_near_ties(runs, list(range(len(runs))), responses, predicted, N, [])
    assert ties == [] and explained == []
    assert [(p.verify_ct, p.histogram) for p in predicted] == [(s.verify_ct, s.histogram) for s in tf.served]


def _bf16_draft_case(seed: int):
    """A random draft run in bf16 (as a bf16 server's draft runs) against labels from its own float32 forward on
    the same tokens: where the two differ a rounding decided, and its near-ties are real."""
    from eagle3_capture.doctor.draft.model import DraftArch, Eagle3Draft

    torch.manual_seed(seed)
    arch = DraftArch(hidden_size=64, target_hidden_size=64, num_aux=3, vocab_size=64, draft_vocab_size=64,
                     num_attention_heads=4, num_key_value_heads=4, head_dim=16, intermediate_size=128,
                     layer_ids=[0, 2, 5])
    d32 = Eagle3Draft(arch)
    with torch.no_grad():
        d32.lm_head.weight.mul_(0.05)  # logits close together: near-ties in bf16
    g = torch.Generator().manual_seed(seed)
    T, P = 40, 4
    seq = torch.randint(0, 64, (1, T), generator=g)
    taps = torch.randn(1, T, 3 * 64, generator=g)
    with torch.no_grad():
        own = d32.unroll(taps[:, :T - 3], seq[:, 1:], 3)[0].argmax(-1)  # step 1's float32 proposals
    greedy = torch.full_like(seq, -1)
    greedy[:, 1:T - 2] = own
    seq = torch.cat([seq[:, :2], greedy[:, 1:T - 2], seq[:, T - 2:]], 1)[:, :T]  # the proposals are the text
    greedy = torch.roll(seq, -1, 1)
    d16 = Eagle3Draft(arch)
    d16.load_state_dict(d32.state_dict())
    d16 = d16.to(torch.bfloat16)
    c, vals, ids = chain_correct_taps(d16, taps.to(torch.bfloat16), seq, greedy, 3, P - 1, use_op=False,
                                      with_top2=True)
    labels = torch.stack([greedy[:, j: j + T - 3] for j in range(1, 4)], -1)[0, P - 1:]
    return c[0], chain_accepted(c[0], 3), vals[0], ids[0], labels


def test_a_real_bf16_near_tie_of_the_draft_explains_a_served_difference():
    """A served walk that took one of the listed bf16 near-ties the other way is explained; one that differs where
    no near-tie is listed is not."""
    n, case = 30, None
    for seed in range(20):
        c, acc, vals, ids, labels = _bf16_draft_case(seed)
        ties = draft_ties(0, c, acc, vals, ids, labels, torch.bfloat16, n)
        base = walk(acc.tolist(), n)
        for t in ties:
            flipped = acc.tolist()
            flipped[t.anchor] = t.flipped_accept
            w = walk(flipped, n)
            if (w.verify_ct, w.histogram) != (base.verify_ct, base.histogram):
                case = (acc, ties, t, w)
                break
        if case:
            break
    assert case is not None, "no bf16 near-tie that changes a walk in 20 random drafts"
    acc, ties, t, served = case
    assert t.side == "draft" and t.ulps <= NEAR_TIE_ULPS and t.flipped_accept != int(acc[t.anchor])
    assert explains(served, acc.tolist(), ties, n)
    listed = {x.anchor for x in ties}
    base = walk(acc.tolist(), n)
    for a in range(n - 1):  # a difference at an anchor with no listed near-tie is not explained
        if a in listed:
            continue
        other = acc.tolist()
        other[a] = 3 if other[a] != 3 else 0
        w = walk(other, n)
        if (w.verify_ct, w.histogram) != (base.verify_ct, base.histogram):
            assert not explains(w, acc.tolist(), ties, n)
            break
    else:
        raise AssertionError("no anchor without a near-tie changes the walk")


def test_a_served_token_that_is_the_teacher_forced_runner_up_is_a_target_near_tie():
    """The served output differs from the teacher-forced argmax at one position where the served token is that
    pass's runner-up: within the bf16 gap a listed near-tie (the server stays lossless), beyond it a lossy
    difference."""
    from eagle3_capture.doctor.target_side.dump_side import StreamedPrompt

    prompt, served = [7, 8, 9], [4, 5, 6, 2]
    x = torch.tensor(prompt + served + [1, 1, 1, 1])
    forced = torch.full_like(x, -1)
    forced[2:2 + 4] = torch.tensor([4, 3, 6, 2])       # the teacher-forced pass put 3 first at output token 1
    runner = torch.full_like(x, -1)
    runner[3] = 5
    for gap, tie in ((0.125, True), (3.0, False)):
        g = torch.full((x.numel(),), float("nan"), dtype=torch.float64)
        g[3] = gap
        side = type("S", (), {"streamed": [StreamedPrompt(x, x, None, forced, runner, g)]})()
        run = PromptRun(prompt, x, torch.zeros(0, 3, dtype=torch.bool), None, dtype=torch.bfloat16)
        want = [4, 3, 6, 2]
        ties, lossy = target_near_ties(side, 0, run, want, served)
        if tie:
            assert lossy == [] and len(ties) == 1 and ties[0].position == 1 and ties[0].tokens == (3, 5)
            assert "near-tie of the target's verify token" in ties[0].line()
        else:
            assert ties == [] and lossy == [1]
