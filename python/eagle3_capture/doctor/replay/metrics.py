"""What the replay measures, per draft step and over the chain (``accept``, ``online`` and ``demo`` report them):

* teacher-forced accuracy of step j: top-1 agreement with the target's greedy token over all anchors (the chain is
  fed the target's tokens);
* conditional accuracy of step j: over the anchors whose steps 1..j-1 were all correct -- exactly the anchors a
  server would still be verifying at step j, where the target's tokens and the draft's coincide;
* tau for a chain of n draft tokens: 1 + sum_{k=1..n} prod_{i<=k} acc_i (conditional accuracies), the mean over
  every anchor of 1 + (number of leading correct steps, at most n).

The served accept length (``sglang_model.serving``) is another figure: SGLang's own walk, which visits hard stretches
more often than tau weighs them; it, not tau, is what a server's ``spec_accept_length`` is compared with.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Sequence

import torch

from ..common import DoctorError
from .evaluate import chain_correct_taps

SERVED_MEANS = ("served accept length: completion tokens / verifies along SGLang's own loop (its meta_info "
                "spec_accept_length), the figure to compare with a server's")
TAU_MEANS = ("tau: the mean of 1 + accepted draft tokens over every position of the continuations, each weighed "
             "alike (no server reports it)")


@torch.no_grad()
def chain_correct(draft, stack: torch.Tensor, seq: torch.Tensor, greedy: torch.Tensor, tap_idx: Sequence[int],
                  steps: int, first_anchor: int, use_op: bool = True) -> torch.Tensor:
    """Correctness [B, A, steps] of the draft chain at anchors first_anchor..T-1-steps.

    stack: [B, T, L+1, H] residual-stream taps; seq: [B, T] tokens; greedy: [B, T] target argmax tokens."""
    B, T = seq.shape
    return chain_correct_taps(draft, stack[:, :, list(tap_idx)].reshape(B, T, -1), seq, greedy, steps, first_anchor,
                              use_op)


@dataclass
class Metrics:
    steps: int
    anchors: int
    teacher_forced: List[float]
    conditional: List[float]
    conditional_support: List[int]
    tau_by_chain: List[float]  # tau for chains of 1..steps draft tokens

    def tau(self, n: int) -> float:
        n = max(0, min(n, self.steps))
        return 1.0 if n == 0 else self.tau_by_chain[n - 1]

    def to_json(self) -> dict:
        return {"steps": self.steps, "anchors": self.anchors,
                "teacher_forced": [round(v, 6) for v in self.teacher_forced],
                "conditional": [round(v, 6) for v in self.conditional],
                "conditional_support": self.conditional_support,
                "tau_by_chain_length": {str(n + 1): round(v, 6) for n, v in enumerate(self.tau_by_chain)}}


def metrics(correct: torch.Tensor) -> Metrics:
    """correct: [N, S] bool over anchors."""
    N, S = correct.shape
    if N == 0:
        raise DoctorError("no anchor positions to evaluate: prompts plus continuations are shorter than "
                          f"{S + 1} tokens; use more --new-tokens")
    c = correct.to(torch.bool)
    tf = c.float().mean(0).tolist()
    cond, sup = [], []
    prefix = torch.ones(N, dtype=torch.bool)
    for j in range(S):
        n = int(prefix.sum())
        sup.append(n)
        cond.append(float((c[:, j] & prefix).sum()) / n if n else 0.0)
        prefix = prefix & c[:, j]
    taus, prod, tau = [], 1.0, 1.0
    for j in range(S):
        prod *= cond[j]
        tau += prod
        taus.append(tau)
    return Metrics(S, N, tf, cond, sup, taus)


__all__ = ["SERVED_MEANS", "TAU_MEANS", "chain_correct", "Metrics", "metrics"]
