"""The draft replayed over what a target side gives: at every anchor of each prompt's continuation, the draft's
chain (teacher-forced correctness per step) and, for the server's flags, what SGLang's verify there accepts (the
chain, or the tree for eagle-topk > 1). ``accept``, ``online`` and ``demo`` run this; where the target's tokens and
taps come from is the target side's business (``target_side.side``)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence

import torch

from ...spec import EMBEDDING, TapSpec
from ..bad_rows import BLAME, BadRows, row_flags
from ..common import DoctorError
from ..sglang_model.release import MODELLED
from ..sglang_model.serving import Served, chain_accepted, tree_accepted_taps, walk


@torch.no_grad()
def chain_correct_taps(draft, taps: torch.Tensor, seq: torch.Tensor, greedy: torch.Tensor, steps: int,
                       first_anchor: int, use_op: bool = True, with_top2: bool = False):
    """Correctness [B, A, steps] of the draft chain at anchors first_anchor..T-1-steps.

    taps: [B, T, K*H] the residual stream at the draft's taps; seq: [B, T] tokens; greedy: [B, T] the target's
    greedy token after each position. ``with_top2``: also the draft's top two logits at each anchor and step and
    their target ids ([B, A, steps, 2] each; the first is the argmax the proposal is), for near-ties."""
    B, T = seq.shape
    A = T - steps - first_anchor
    if A <= 0:
        empty = torch.zeros(B, 0, steps, dtype=torch.bool)
        return (empty, torch.zeros(B, 0, steps, 2), torch.zeros(B, 0, steps, 2, dtype=torch.int64)) if with_top2 \
            else empty
    x = taps[:, : T - steps].to(next(draft.parameters()).dtype)
    logits = draft.unroll(x, seq[:, 1:], steps, use_op=use_op)
    out, vals, ids = [], [], []
    for j, lg in enumerate(logits, start=1):
        top = lg.argmax(-1)
        pred = draft.to_target_ids(top)
        out.append((pred == greedy[:, j: j + T - steps])[:, first_anchor:])
        if with_top2:  # the runner-up: the best of the rest (argmax's own choice among exact ties stays the proposal)
            rest = lg.scatter(-1, top[..., None], float("-inf"))
            second = rest.argmax(-1)
            v = torch.stack([lg.gather(-1, top[..., None])[..., 0], rest.gather(-1, second[..., None])[..., 0]], -1)
            vals.append(v[:, first_anchor:].float())
            ids.append(torch.stack([pred, draft.to_target_ids(second)], -1)[:, first_anchor:])
    correct = torch.stack(out, -1).cpu()
    if with_top2:
        return correct, torch.stack(vals, 2).cpu(), torch.stack(ids, 2).cpu()
    return correct


@dataclass
class PromptRun:
    """One prompt's offline run: its continuation and, per anchor, the chain's correctness and what a verify
    there accepts under the server flags."""

    prompt: List[int]
    seq: torch.Tensor          # [P + continuation] prompt + greedy continuation
    correct: torch.Tensor      # [A, S] bool
    accepted: Optional[torch.Tensor]  # [A] int64, None when the flags are refused
    expected: Optional[torch.Tensor] = None  # the target's own token at each position (outputs are checked
    #                                          against it); seq when None
    bad: Optional[BadRows] = None  # rows of its taps that are bad data: the run is left out of every figure
    top_vals: Optional[torch.Tensor] = None  # [A, S, 2] the draft's top two logits per anchor and step (chains)
    top_ids: Optional[torch.Tensor] = None   # [A, S, 2] their target ids
    labels: Optional[torch.Tensor] = None    # [A, S] the token each step was checked against
    dtype: Optional[torch.dtype] = None      # the taps' dtype (the server's, for a dump): the rounding resolution


def unserved_reason(res) -> Optional[str]:
    """Why no served accept length can be predicted for these resolved flags (None: it can)."""
    if res.error:
        return f"SGLang {MODELLED} refuses the flags ({res.error})"
    if res.steps is None or res.topk is None or res.draft_tokens is None:
        return ("num-steps / eagle-topk / num-draft-tokens are not all known before serving (e.g. "
                "--speculative-adaptive changes them while serving)")
    return None


def continuation_for(new_tokens: int, steps: int) -> int:
    """Tokens after each prompt the replay needs: the new tokens, and the draft steps that the verifies near the end
    look past them (SGLang counts what those accept though it cuts them from the output)."""
    return new_tokens + steps


def bad_taps(taps: torch.Tensor, spec: TapSpec, what: str) -> Optional[BadRows]:
    """The rows of one prompt's taps [T, K*H] that are bad data (:mod:`..bad_rows`: a NaN or Inf in any tap, or a
    tap past the embedding all zero), None when there is none. One bad row spoils the whole prompt's replay: the
    draft's cache at every later position attends to it."""
    H = spec.hidden_size
    nf = torch.zeros(taps.shape[0], dtype=torch.bool)
    zero = torch.zeros_like(nf)
    first_tap = {}
    for k, tap in enumerate(spec.taps):
        a, z = row_flags(taps[:, k * H:(k + 1) * H].cpu())
        z = z if tap != EMBEDDING else torch.zeros_like(z)  # an embedding row may be zero (a padding token's)
        for r in (a | z).nonzero().flatten().tolist()[:1]:
            first_tap.setdefault(r, tap)
        nf, zero = nf | a, zero | z
    bad = nf | zero
    if not bool(bad.any()):
        return None
    r = int(bad.nonzero()[0])
    return BadRows(what, int(nf.sum()), int((zero & ~nf).sum()), int(taps.shape[0]),
                   f"position {r}, tap {first_tap.get(r, '?')}")


def usable_runs(runs: Sequence[PromptRun], what: str) -> List[int]:
    """The prompts whose taps carry no bad row; DoctorError (bad input) when no prompt is left."""
    good = [i for i, r in enumerate(runs) if r.bad is None]
    if not good:
        b = runs[0].bad
        raise DoctorError(f"{what}: every prompt's taps hold bad rows (prompt 0: {b.line()}): nothing to predict "
                          f"from -- {BLAME}")
    return good


def evaluate(target_side, draft, prompts: List[List[int]], spec: TapSpec, S: int, new_tokens: int, res,
             batch_size: int, progress: bool, desc: str = "accept") -> List[PromptRun]:
    """Per-anchor chain correctness and served acceptance for every prompt (in the prompts' order)."""
    runs: List[Optional[PromptRun]] = [None] * len(prompts)
    predict = unserved_reason(res) is None
    for b in target_side.batches(prompts, continuation_for(new_tokens, S), spec, batch_size, progress, desc):
        dev = next(draft.parameters()).device
        seq, greedy, taps = b.seq.to(dev), b.greedy.to(dev), b.taps.to(dev)
        P = b.prompt_len
        c, top_vals, top_ids = chain_correct_taps(draft, taps, seq, greedy, S, first_anchor=P - 1, use_op=True,
                                                  with_top2=True)
        T = seq.shape[1]
        labels = torch.stack([greedy[:, j: j + T - S] for j in range(1, S + 1)], -1)[:, P - 1:].cpu()
        acc = None
        if predict:
            if res.topk == 1:
                acc = chain_accepted(c, res.steps)
            else:
                acc = tree_accepted_taps(draft, taps, seq, greedy, res.steps, res.topk, res.draft_tokens,
                                         first_anchor=P - 1, use_op=True)
        for j, i in enumerate(b.indices):
            runs[i] = PromptRun(prompts[i], b.seq[j].cpu(), c[j], None if acc is None else acc[j],
                                None if b.expected is None else b.expected[j].cpu(),
                                bad_taps(b.taps[j], spec, target_side.prompt_name(i)), top_vals[j], top_ids[j],
                                labels[j], b.taps.dtype)
    missing = [i for i, r in enumerate(runs) if r is None]
    if missing:
        raise RuntimeError(f"the target side gave no sequence for prompt {missing[0]}")
    return runs


def served_walks(runs: Sequence[PromptRun], new_tokens: int) -> List[Served]:
    return [walk(r.accepted.tolist(), new_tokens) for r in runs] if runs and runs[0].accepted is not None else []


__all__ = ["chain_correct_taps", "PromptRun", "bad_taps", "usable_runs", "unserved_reason", "continuation_for", "evaluate", "served_walks"]
