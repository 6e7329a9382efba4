"""Near-ties: where rounding, not the capture, may have decided a served verify (``doctor online``).

A server in bf16 computes the target's logits in its verify pass, and the doctor reads the target's argmax from
another pass of the same sequence (its teacher-forced prefill) and computes the draft's logits itself. Two passes
of different shapes round differently: where the top two logits are within a few units in the last place (ulp) of
each other, their order can differ between the passes. So the doctor follows the path the server served (its
output tokens are the verify pass's own argmax: the label of every draft step is the served token) and lists every
decision a near-tie could have taken the other way:

* **target**: the served token is not the teacher-forced argmax but its runner-up, the two within
  :func:`target_tie_gap` (the doctor sees the server's logprobs, whose gap equals the logit gap, but not the logits'
  magnitude: it is bounded by :data:`TARGET_LOGIT_BOUND`);
* **draft**: at a verify on the walk, a draft step that decided the accept count (every accepted step and the one
  that was rejected) had its top two logits within the resolution.

**Resolution** (:func:`is_near_tie`): top-2 logits l1 >= l2 of a pass in ``dtype`` are a near-tie when
``l1 - l2 <= NEAR_TIE_ULPS * ulp(max(|l1|, |l2|))``, with ``ulp(x) = 2 ** (floor(log2 |x|) - mantissa bits)``
(bf16 7, float16 10, float32 23). Passes of different shapes were seen to flip an argmax with gaps up to 2 ulps
(tests/doctor/test_doctor_near_ties.py builds real bf16 flips); the definition takes twice that. In float32 a
near-tie needs a gap below about 5e-7 of the logit: the CPU servers' figures are predicted exactly, none listed.

A prompt whose served counts differ from the prediction is *explained* when flipping some of its listed draft
decisions (each to the outcome the runner-up gives) reproduces the served verify count and histogram
(:func:`explains`); the verdict then says so and lists them, rather than calling the server lossy.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from ..sglang_model.serving import Served, walk

MANTISSA_BITS = {torch.bfloat16: 7, torch.float16: 10, torch.float32: 23, torch.float64: 52}
NEAR_TIE_ULPS = 4
TARGET_LOGIT_BOUND = 32.0
MAX_FLIPS = 12  # listed decisions of one prompt searched for an explanation (2**12 walks at most)


def mantissa_bits(dtype: torch.dtype) -> int:
    if dtype not in MANTISSA_BITS:
        raise ValueError(f"no rounding resolution for {dtype}: expected one of {list(MANTISSA_BITS)}")
    return MANTISSA_BITS[dtype]


def ulp(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The spacing of ``dtype``'s numbers at |x| (elementwise; at 0 the smallest normal's)."""
    bits = mantissa_bits(dtype)
    tiny = torch.finfo(dtype).tiny
    mag = x.detach().abs().to(torch.float64).clamp(min=tiny)
    return torch.pow(2.0, torch.floor(torch.log2(mag)) - bits)


def is_near_tie(top1: torch.Tensor, top2: torch.Tensor, dtype: torch.dtype,
                ulps: float = NEAR_TIE_ULPS) -> torch.Tensor:
    """Whether logits top1 >= top2 (elementwise) are within the resolution of ``dtype`` (module docstring)."""
    gap = (top1.double() - top2.double())
    if bool((gap < 0).any()):
        raise ValueError("top1 must be >= top2")
    return gap <= ulps * ulp(torch.maximum(top1.abs(), top2.abs()), dtype)


def target_tie_gap(dtype: torch.dtype) -> float:
    """The largest logprob gap between the teacher-forced argmax and the served runner-up counted as a near-tie."""
    return float(NEAR_TIE_ULPS * ulp(torch.tensor(TARGET_LOGIT_BOUND), dtype))


@dataclass
class NearTie:
    prompt: int
    position: int           # output token index (0: the prefill's token) the decision is about
    side: str               # "target" (the served token vs the teacher-forced argmax) or "draft" (its proposal)
    gap: float              # top-2 gap (logits for the draft, logprobs for the target)
    ulps: Optional[float]   # the gap in ulps of the larger logit (None on the target side: magnitude unknown)
    tokens: Tuple[int, int]  # the pass's top-1 and runner-up (target ids)
    served: int             # the token the server served there
    step: Optional[int] = None    # the draft step (draft side)
    anchor: Optional[int] = None  # the verify's anchor, as an index after the prompt's last token (draft side)
    flipped_accept: Optional[int] = None  # what that verify accepts if the tie went the other way (draft side)

    def to_json(self) -> dict:
        out = {"prompt": self.prompt, "position": self.position, "side": self.side, "gap": round(self.gap, 6),
               "tokens": list(self.tokens), "served": self.served}
        for k in ("ulps", "step", "anchor", "flipped_accept"):
            v = getattr(self, k)
            if v is not None:
                out[k] = round(v, 3) if isinstance(v, float) else v
        return out

    def line(self) -> str:
        if self.side == "target":
            return (f"prompt {self.prompt}, output token {self.position}: the server served {self.served}, the "
                    f"teacher-forced pass's argmax is {self.tokens[0]} by a logprob gap of {self.gap:.3g} (a "
                    "near-tie of the target's verify token)")
        return (f"prompt {self.prompt}, verify at output token {self.anchor + 1}, draft step {self.step}: the draft's "
                f"top two ({self.tokens[0]}, {self.tokens[1]}) are {self.ulps:.2g} ulp apart (gap {self.gap:.3g}); the "
                f"other way that verify accepts {self.flipped_accept} (a near-tie of the draft's proposal)")


def flipped_accept(correct: Sequence[bool], j: int, runner_up_right: bool) -> int:
    """A chain verify's accepted count if step j's (1-based) proposal had gone the other way: a right proposal
    becomes wrong (accept j - 1), a wrong one becomes right only when the runner-up is the served token (then the
    following steps count as computed, their inputs being the served tokens either way)."""
    c = [bool(x) for x in correct]
    lead = 0
    while lead < len(c) and c[lead]:
        lead += 1
    if c[j - 1]:
        return j - 1 if j - 1 < lead else lead
    if not runner_up_right or j - 1 != lead:
        return lead
    k = j
    while k < len(c) and c[k]:
        k += 1
    return k


def draft_ties(prompt: int, correct: torch.Tensor, accepted: torch.Tensor, top_vals: torch.Tensor,
               top_ids: torch.Tensor, labels: torch.Tensor, dtype: torch.dtype, new_tokens: int) -> List[NearTie]:
    """The draft near-ties that decided a verify some walk may visit: every anchor whose deciding steps (the
    accepted ones and the first rejected one) include a near-tie. correct [A, S] bool, accepted [A], top_vals /
    top_ids [A, S, 2] (draft logits and their target ids), labels [A, S] (the served token each step is checked
    against)."""
    out: List[NearTie] = []
    A, S = correct.shape
    near = is_near_tie(top_vals[..., 0], top_vals[..., 1], dtype)
    for a in range(min(A, new_tokens - 1)):
        acc = int(accepted[a])
        for j in range(1, min(acc + 1, S) + 1):
            if not bool(near[a, j - 1]):
                continue
            runner_right = int(top_ids[a, j - 1, 1]) == int(labels[a, j - 1])
            flip = flipped_accept(correct[a].tolist(), j, runner_right)
            if flip == acc:
                continue  # the other way would not change what this verify accepts
            l1, l2 = float(top_vals[a, j - 1, 0]), float(top_vals[a, j - 1, 1])
            u = float(ulp(torch.tensor(max(abs(l1), abs(l2))), dtype))
            out.append(NearTie(prompt, a + j, "draft", l1 - l2, (l1 - l2) / u,
                               (int(top_ids[a, j - 1, 0]), int(top_ids[a, j - 1, 1])), int(labels[a, j - 1]), j, a,
                               flip))
    return out


def explains(served: Served, accepted: Sequence[int], ties: Sequence[NearTie], new_tokens: int) -> bool:
    """Whether flipping some of the listed draft decisions of one prompt reproduces the served verify count and
    histogram (each anchor's accept count either as computed or as its tie's flip gives; the verify count alone
    when the server reported no histogram)."""
    want = (served.verify_ct, list(served.histogram))
    with_hist = bool(served.histogram)
    options: Dict[int, List[int]] = {}
    for t in ties:
        if t.side == "draft" and t.anchor is not None and t.flipped_accept is not None:
            options.setdefault(t.anchor, [int(accepted[t.anchor])])
            if t.flipped_accept not in options[t.anchor]:
                options[t.anchor].append(t.flipped_accept)
    anchors = sorted(options)[:MAX_FLIPS]

    def norm(h: List[int]) -> List[int]:
        h = list(h)
        while h and h[-1] == 0:
            h.pop()
        return h

    target = (want[0], norm(want[1]) if with_hist else None)
    base = [int(x) for x in accepted]

    def search(i: int, acc: List[int]) -> bool:
        if i == len(anchors):
            w = walk(acc, new_tokens)
            return (w.verify_ct, norm(w.histogram) if with_hist else None) == target
        a = anchors[i]
        for v in options[a]:
            acc2 = list(acc)
            acc2[a] = v
            if search(i + 1, acc2):
                return True
        return False

    return search(0, base)


def summary_line(ties: Sequence[NearTie]) -> str:
    d = sum(t.side == "draft" for t in ties)
    return f"{len(ties)} near-tie decision(s) listed ({d} of the draft's proposals, {len(ties) - d} of the target's)"


__all__ = ["NEAR_TIE_ULPS", "TARGET_LOGIT_BOUND", "MANTISSA_BITS", "mantissa_bits", "ulp", "is_near_tie",
           "target_tie_gap", "NearTie", "flipped_accept", "draft_ties", "explains", "summary_line"]
