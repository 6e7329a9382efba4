"""SGLang's speculative loop (read in 0.5.23) replayed offline: what a server reports for a draft, computed as it
computes it.

The server (``EAGLEWorkerV2``, greedy) works per request: the prefill gives the first output token; then each
*verify* starts from the last accepted position t (the anchor; the target has just produced x_{t+1}), drafts from
the target's taps at t, and accepts the longest drafted prefix that equals the target's greedy tokens plus one
bonus token, so the next anchor is t + accepted + 1; this repeats until ``max_new_tokens`` tokens are out (a last
run past the limit is cut from the output, not from the counters). Its ``meta_info`` then reports
``completion_tokens``, ``spec_verify_ct``, ``spec_correct_drafts_histogram`` (verifies per number of accepted
draft tokens) and ``spec_accept_length = completion_tokens / spec_verify_ct``.

Two figures therefore describe one draft, and they differ:

* **tau** (``replay.metrics``): the mean of 1 + accepted over *every* position of the continuation;
* **served accept length** (:func:`walk`): tokens / verifies along the server's walk, which visits a position
  only when the previous verify ended there, so hard stretches (short accepts) are visited more often, and it
  counts the prefill token as free and the cut tail as lost. This is the figure to compare with a server's.

Drafting, per anchor (:func:`chain_accepted` for ``eagle-topk`` 1, :func:`tree_accepted` above):

* topk 1: a chain of ``num_steps`` argmax tokens; accepted = leading correct steps.
* topk k > 1: the depth-1 candidates are the top k of the step-1 softmax; each of ``num_steps - 1`` draft forwards
  runs k rows (row r: a selected node's token, its parent row's output hidden), takes the top k of each row's
  softmax, scores the k*k children by the product of probabilities along their path, and keeps the k best as the
  next rows. The candidates (k at depth 1, k*k at each deeper depth, in that order) compete for the
  ``num_draft_tokens - 1`` tree slots by score (``torch.topk``, as SGLang's ``organize_draft_results``); greedy
  verify walks the tree from the root taking the child whose token is the target's greedy token. Like SGLang's
  draft attention, row r of a step attends to the prefix and to the keys earlier steps wrote in *row slot r*
  (the draft KV is laid out per slot, not per ancestor), not to its own ancestors'.

Exact ties of float32 scores are broken by ``torch.topk`` here and by SGLang's kernel there; they are the only
known way the two can part on the same inputs.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Sequence

import torch

from ..common import DoctorError


@dataclass
class Served:
    """What SGLang's ``meta_info`` reports for one request (or, summed, for several)."""

    completion_tokens: int
    verify_ct: int
    histogram: List[int] = field(default_factory=list)  # [n] = verifies that accepted n draft tokens
    accepted: List[int] = field(default_factory=list)   # per verify, in order (one request only)

    @property
    def served_accept_length(self) -> float:
        return self.completion_tokens / self.verify_ct if self.verify_ct else float("nan")

    @property
    def correct_drafts(self) -> int:
        return sum(n * c for n, c in enumerate(self.histogram))

    def __add__(self, other: "Served") -> "Served":
        return Served(self.completion_tokens + other.completion_tokens, self.verify_ct + other.verify_ct,
                      add_histograms(self.histogram, other.histogram))

    def to_json(self) -> dict:
        return {"served_accept_length": round(self.served_accept_length, 6), "completion_tokens":
                self.completion_tokens, "verify_ct": self.verify_ct, "correct_drafts_histogram": list(self.histogram)}


def add_histograms(a: Sequence[int], b: Sequence[int]) -> List[int]:
    n = max(len(a), len(b))
    return [(a[i] if i < len(a) else 0) + (b[i] if i < len(b) else 0) for i in range(n)]


def total(items: Sequence[Served]) -> Served:
    out = Served(0, 0, [])
    for s in items:
        out = out + s
    return out


def walk(accepted_by_anchor: Sequence[int], new_tokens: int) -> Served:
    """The server's walk over one request: ``accepted_by_anchor[i]`` is how many draft tokens a verify anchored at
    the i-th position after the prompt's last one accepts (i = 0: the anchor right after prefill)."""
    if new_tokens < 1:
        raise ValueError(f"new_tokens must be >= 1, got {new_tokens}")
    produced, i = 1, 0  # the prefill's token
    hist: List[int] = []
    acc: List[int] = []
    while produced < new_tokens:
        if i >= len(accepted_by_anchor):
            raise ValueError(f"the walk reached anchor {i} but only {len(accepted_by_anchor)} anchors were "
                             f"evaluated (need new_tokens - 1 = {new_tokens - 1})")
        n = int(accepted_by_anchor[i])
        if n >= len(hist):
            hist.extend([0] * (n + 1 - len(hist)))
        hist[n] += 1
        acc.append(n)
        produced += n + 1
        i += n + 1
    return Served(min(produced, new_tokens), len(acc), hist, acc)


def step_acceptance(histogram: Sequence[int], steps: int) -> List[float]:
    """Per draft step k = 1..steps: of the verifies that accepted steps 1..k-1, the share that accepted step k
    (from a ``spec_correct_drafts_histogram``; NaN where no verify reached step k)."""
    out = []
    for k in range(1, steps + 1):
        reached = sum(histogram[k - 1:])
        out.append(sum(histogram[k:]) / reached if reached else float("nan"))
    return out


@torch.no_grad()
def chain_accepted(correct: torch.Tensor, steps: int) -> torch.Tensor:
    """topk 1: accepted draft tokens per anchor for a chain of ``steps`` from per-step correctness [..., S]."""
    if correct.shape[-1] < steps:
        raise ValueError(f"correct has {correct.shape[-1]} steps, the chain needs {steps}")
    return correct[..., :steps].to(torch.int64).cumprod(-1).sum(-1)


@dataclass
class TreeCandidates:
    """Every anchor's draft candidates in SGLang's layout: k at depth 1, then k*k per deeper depth (parent row,
    child rank), [B, Tp, C] each; ``parent`` is a candidate index (-1: the root); ``selected``: the
    num_draft_tokens - 1 that make the tree."""

    score: torch.Tensor
    token: torch.Tensor
    parent: torch.Tensor
    depth: List[int]
    selected: torch.Tensor


def _check_tree(steps: int, topk: int, draft_tokens: int) -> int:
    k, S = int(topk), int(steps)
    if k < 2 or S < 1:
        raise ValueError(f"a tree needs topk >= 2 and steps >= 1, got topk {k}, steps {S}")
    n_cand = k + (S - 1) * k * k
    if not 2 <= draft_tokens <= n_cand + 1:
        raise DoctorError(f"num-draft-tokens {draft_tokens} with num-steps {S} and eagle-topk {k}: SGLang draws the "
                          f"tree's {draft_tokens - 1} non-root tokens from {n_cand} candidates (k + (steps-1)*k*k); "
                          f"it needs 2 <= num-draft-tokens <= {n_cand + 1}")
    return n_cand


@torch.no_grad()
def tree_candidates(draft, taps: torch.Tensor, seq: torch.Tensor, steps: int, topk: int,
                    draft_tokens: int, use_op: bool = True) -> TreeCandidates:
    """SGLang's draft tree at every anchor 0..Tp-1 of taps [B, Tp, K*H] (seq [B, >= Tp+1] tokens)."""
    k, S = int(topk), int(steps)
    _check_tree(S, k, draft_tokens)
    B, Tp = taps.shape[:2]
    pos0 = torch.arange(Tp, device=seq.device)[None].expand(B, Tp)
    logits, hidden, kv = draft.first_step(taps, seq[:, 1: Tp + 1], pos0, use_op)
    p, ix = torch.softmax(logits.float(), -1).topk(k, -1)                        # [B, Tp, k]
    scores, tokens, parents, depths = [p], [draft.to_target_ids(ix)], [torch.full_like(ix, -1)], [1] * k
    rows_tok, rows_hid = tokens[0], hidden[:, :, None].expand(B, Tp, k, hidden.shape[-1])
    rows_score, rows_cand = p, torch.arange(k, device=seq.device).expand(B, Tp, k)
    for i in range(S - 1):
        base = k + i * k * k
        logits, hid_out = draft.rows_step(rows_tok, rows_hid, pos0 + 1 + i, kv)
        cp, ci = torch.softmax(logits.float(), -1).topk(k, -1)                 # [B, Tp, k rows, k children]
        expand = (rows_score[..., None] * cp).flatten(-2)                       # path scores of the k*k children
        child_tok = draft.to_target_ids(ci).flatten(-2)
        scores.append(expand)
        tokens.append(child_tok)
        parents.append(rows_cand[..., :, None].expand(B, Tp, k, k).flatten(-2))
        depths += [i + 2] * (k * k)
        rows_score, sel = expand.topk(k, -1)
        rows_tok = child_tok.gather(-1, sel)
        rows_hid = hid_out.gather(2, (sel // k)[..., None].expand(B, Tp, k, hid_out.shape[-1]))
        rows_cand = base + sel
    score = torch.cat(scores, -1)
    selected = torch.zeros_like(score, dtype=torch.bool)
    selected.scatter_(-1, score.topk(draft_tokens - 1, -1).indices, True)
    return TreeCandidates(score, torch.cat(tokens, -1), torch.cat(parents, -1), depths, selected)


@torch.no_grad()
def tree_accepted(draft, stack: torch.Tensor, seq: torch.Tensor, greedy: torch.Tensor, tap_idx: Sequence[int],
                  steps: int, topk: int, draft_tokens: int, first_anchor: int, use_op: bool = True) -> torch.Tensor:
    """topk > 1: accepted draft tokens [B, A] of SGLang's tree at anchors first_anchor..T-1-steps.

    stack: [B, T, L+1, H] residual-stream taps; seq: [B, T] tokens; greedy: [B, T] target argmax tokens."""
    _check_tree(int(steps), topk, draft_tokens)
    B, T = seq.shape
    return tree_accepted_taps(draft, stack[:, :, list(tap_idx)].reshape(B, T, -1), seq, greedy, steps, topk,
                              draft_tokens, first_anchor, use_op)


@torch.no_grad()
def tree_accepted_taps(draft, taps: torch.Tensor, seq: torch.Tensor, greedy: torch.Tensor, steps: int, topk: int,
                       draft_tokens: int, first_anchor: int, use_op: bool = True) -> torch.Tensor:
    """:func:`tree_accepted` from the packed taps [B, T, K*H] at every position."""
    S = int(steps)
    n_cand = _check_tree(S, topk, draft_tokens)
    B, T = seq.shape
    if T - S - first_anchor <= 0:
        return torch.zeros(B, 0, dtype=torch.int64)
    Tp = T - S
    taps = taps[:, :Tp].to(next(draft.parameters()).dtype)
    tree = tree_candidates(draft, taps, seq, S, topk, draft_tokens, use_op)
    want = torch.stack([greedy[:, d: d + Tp] for d in range(1, S + 1)], -1)      # [B, Tp, S]: depth d's token
    matched = torch.zeros_like(tree.selected)
    accepted = torch.zeros(B, Tp, dtype=torch.int64, device=seq.device)
    for c in range(n_cand):  # a parent's candidate index is always lower than its children's
        d = tree.depth[c]
        ok = tree.selected[..., c] & (tree.token[..., c] == want[..., d - 1])
        if d > 1:
            ok &= matched.gather(-1, tree.parent[..., c].clamp(min=0)[..., None])[..., 0]
        matched[..., c] = ok
        accepted = torch.where(ok, torch.full_like(accepted, d), accepted)
    return accepted[:, first_anchor:].cpu()


__all__ = ["Served", "add_histograms", "total", "walk", "step_acceptance", "chain_accepted", "TreeCandidates",
           "tree_candidates", "tree_accepted", "tree_accepted_taps"]
