"""SGLang's speculative loop replayed (doctor/sglang_model/serving.py): the walk and its meta_info figures on hand-made
per-anchor results, and the tree drafting against a direct, unvectorised rendering of SGLang's algorithm. The
figures are checked against SGLang's real serving loop by the engine tests (tests/engine)."""
import os

import pytest
import torch
from hypothesis import given, settings, strategies as st

from doctor_helpers import demo_fast
from eagle3_capture.doctor.sglang_model.serving import Served, step_acceptance, total, tree_accepted, tree_candidates, walk


def test_walk_by_hand():
    # prefill gives token 1; anchor 0 accepts 3 (+1 bonus: 5 tokens), next anchor 4 accepts 0 (6), anchor 5 ...
    acc = [3, 9, 9, 9, 0, 2, 9, 9, 1, 9, 9]
    s = walk(acc, 10)
    assert s.accepted == [3, 0, 2, 1] and s.verify_ct == 4
    assert s.histogram == [1, 1, 1, 1]
    assert s.completion_tokens == 10  # 1 + 4 + 1 + 3 + 2 = 11, the last run is cut at max_new_tokens
    assert s.served_accept_length == pytest.approx(10 / 4)
    assert walk([0] * 20, 2).verify_ct == 1 and walk([5], 1).verify_ct == 0


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 4), min_size=40, max_size=40), st.integers(2, 30))
def test_walk_invariants(acc, n):
    s = walk(acc, n)
    assert s.completion_tokens == n
    assert sum(s.histogram) == s.verify_ct == len(s.accepted)
    assert s.histogram == [s.accepted.count(i) for i in range(len(s.histogram))] and s.histogram[-1] > 0
    # the tokens produced before the last verify fall short of n, the last verify reaches it
    assert 1 + sum(a + 1 for a in s.accepted[:-1]) < n <= 1 + sum(a + 1 for a in s.accepted)


def test_walk_needs_enough_anchors():
    with pytest.raises(ValueError, match="anchors were evaluated"):
        walk([0, 0], 10)


def test_totals_and_step_acceptance():
    a, b = Served(16, 5, [1, 0, 0, 4]), Served(16, 13, [12, 0, 1])
    t = total([a, b])
    assert (t.completion_tokens, t.verify_ct, t.histogram) == (32, 18, [13, 0, 1, 4])
    assert t.correct_drafts == 2 + 12
    acc = step_acceptance(t.histogram, 3)
    assert acc == pytest.approx([5 / 18, 5 / 5, 4 / 5])
    assert step_acceptance([3], 2)[1] != step_acceptance([3], 2)[1]  # NaN: no verify reached step 2


# ----------------------------------------------------------------------------------------------------------------
# the tree, against a direct rendering of SGLang 0.5.23's EAGLE worker for one anchor
# ----------------------------------------------------------------------------------------------------------------

def sglang_tree_one_anchor(draft, taps, seq, greedy, t, S, k, D):
    """One anchor t, written out as SGLang's draft / organize_draft_results / build_tree / verify do it, with
    the draft KV laid out per row slot (select_top_k_tokens, assign_draft_cache_locs)."""
    from eagle3_capture.doctor.draft.model import DraftKV

    T = taps.shape[1]
    pos = torch.arange(T)[None]
    logits, hidden, kv = draft.first_step(taps, seq[:, 1:T + 1], pos)
    kv = DraftKV(kv.prefix_k[:, :, : t + 1], kv.prefix_v[:, :, : t + 1])  # the KV cache holds positions <= t
    probs = torch.softmax(logits[0, t].float(), -1)
    p, ix = probs.topk(k)
    score_list, token_list, parents_list = [p], [draft.to_target_ids(ix)], [list(range(-1, k))]
    rows_tok, rows_hid, rows_score = draft.to_target_ids(ix), hidden[0, t].expand(k, -1), p
    for i in range(S - 1):
        lg, ho = draft.rows_step(rows_tok[None, None], rows_hid[None, None], torch.tensor([[t + 1 + i]]), kv)
        cp, ci = torch.softmax(lg[0, 0].float(), -1).topk(k, -1)  # [k, k]
        expand = rows_score[:, None] * cp
        score_list.append(expand.flatten())
        token_list.append(draft.to_target_ids(ci).flatten())
        rows_score, sel = expand.flatten().topk(k)
        parents_list.append((sel + (k * k * i + k)).tolist())
        rows_tok = draft.to_target_ids(ci).flatten()[sel]
        rows_hid = ho[0, 0][sel // k]
    scores, tokens = torch.cat(score_list), torch.cat(token_list)
    parent_list = sum(parents_list[:-1], [])
    top = sorted(scores.topk(D - 1).indices.tolist())
    node_of = {c: n + 1 for n, c in enumerate(top)}  # node 0 is the root (the bonus token)
    parent_node, depth = {}, {0: 0}
    for n, c in enumerate(top, 1):
        ptb = c // k
        parent_node[n] = 0 if ptb == 0 else node_of[parent_list[ptb]]
        depth[n] = depth[parent_node[n]] + 1
    last, accepted = 0, 0
    for _ in range(S):  # VerifyTreeGreedy: children of the last accepted node in sibling (node) order
        children = [n for n in range(1, D) if parent_node[n] == last]
        hit = [n for n in children if int(tokens[top[n - 1]]) == int(greedy[0, t + depth[n]])]
        if not hit:
            break
        last, accepted = hit[0], accepted + 1
    return accepted, scores, tokens, top


@pytest.mark.parametrize("S,k,D", [(3, 2, 6), (2, 3, 7), (4, 2, 8), (1, 4, 3)])
def test_tree_matches_a_direct_rendering(S, k, D):
    from eagle3_capture.doctor.draft.checkpoint import load_draft
    from eagle3_capture.doctor.target_side.model import build_demo_target, greedy_continue, residual_stream

    res, out = demo_fast()
    draft = load_draft(os.path.join(out, "draft"))
    model = build_demo_target(0)
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(2, 256, (1, 20), generator=g)
    seq = greedy_continue(model, ids, 10 + S)
    stack, _, greedy = residual_stream(model, seq)
    idx = [0, 1, 4]
    with torch.no_grad():
        fast = tree_accepted(draft, stack, seq, greedy, idx, S, k, D, first_anchor=19)
        Tp = seq.shape[1] - S
        taps = stack[:, :Tp, idx].reshape(1, Tp, -1)
        direct = [sglang_tree_one_anchor(draft, taps, seq, greedy, t, S, k, D) for t in range(19, Tp)]
        tree = tree_candidates(draft, taps, seq, S, k, D)
    assert fast[0].tolist() == [d[0] for d in direct]
    assert max(d[0] for d in direct) > 0  # a trained draft accepts something
    for t, (_, scores, tokens, top) in zip(range(19, Tp), direct):
        torch.testing.assert_close(tree.score[0, t], scores, rtol=1e-5, atol=1e-7)
        assert tree.token[0, t].tolist() == tokens.tolist()
        assert tree.selected[0, t].nonzero().flatten().tolist() == top


def test_tree_refuses_too_many_draft_tokens():
    from eagle3_capture.doctor.common import DoctorError

    with pytest.raises(DoctorError, match="num-draft-tokens 8"):
        tree_accepted(None, torch.zeros(1, 4, 2, 2), torch.zeros(1, 4, dtype=torch.long), None, [0], 2, 2, 8, 0)
