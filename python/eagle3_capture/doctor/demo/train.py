"""Training the demo's EAGLE-3 draft on the target's own greedy continuations (plain torch, a few hundred Adam
steps on CPU), with the multi-step unroll EAGLE-3 trains with ("training-time test", see draft/model.py).

The learning rate is per weight matrix, scaled by its fan-in: ``lr * min(1, lr_fan_in / fan_in)``. Adam moves
every coordinate by about the learning rate whatever the gradient's size, so one step moves a matrix's output by
about lr x fan_in: the same lr that trains a 256-wide draft smoothly moves a 7168-wide one's logits 28 times as
far per step. At Kimi-K2.5's width (kimi_accept's draft, lr 2e-3) the loss fell for the warm-up, then climbed
from 25.4 to 37 as the learning rate peaked (iteration 30 of 300) and only slowly recovered (2.25 at 300); the
same lr x fan_in at 512 wide shows the same climb on the CPU. Scaled by fan-in, every width takes the steps the
loop was tuned at (256 wide and below: unchanged). Vectors (norm weights, biases) keep the learning rate."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, List, Optional

import torch
import torch.nn.functional as F

from ..draft.model import DraftArch, Eagle3Draft


@dataclass
class TrainConfig:
    iters: int = 400
    batch: int = 32
    steps: int = 3            # unrolled draft steps per anchor
    lr: float = 3e-3
    lr_fan_in: int = 256      # a matrix whose fan-in is above this gets lr * lr_fan_in / fan_in (module docstring)
    weight_decay: float = 0.0
    step_decay: float = 0.8   # loss weight of step j: step_decay ** (j-1)
    seed: int = 0
    time_limit_s: Optional[float] = None


def init_draft_from_target(arch: DraftArch, target, seed: int) -> Eagle3Draft:
    """A fresh draft: embedding copied from the target (and frozen, as EAGLE-3 does), lm_head and final norm
    initialised from the target's, everything else seeded random."""
    torch.manual_seed(seed)
    draft = Eagle3Draft(arch)
    inner = target.model
    with torch.no_grad():
        draft.embed_tokens.weight.copy_(inner.get_input_embeddings().weight)
        draft.lm_head.weight.copy_(inner.get_output_embeddings().weight)
        draft.norm.weight.copy_(inner.model.norm.weight)
        g = torch.Generator().manual_seed(seed)
        for name, p in sorted(draft.named_parameters(), key=lambda kv: kv[0]):
            if name.startswith(("embed_tokens", "lm_head", "norm.")) or "norm" in name.split(".")[-2]:
                continue
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[1] ** 0.5)
    draft.embed_tokens.weight.requires_grad_(False)
    return draft


IGNORE = -100  # a label the loss skips: a target token outside the draft's vocabulary, or one the source left unknown


def label_map(draft: Eagle3Draft) -> Optional[torch.Tensor]:
    """Target id -> draft id for a draft with a reduced vocabulary (SpecForge's d2t: draft id i proposes target id
    i + d2t[i]); IGNORE for target ids it cannot propose. None when the draft's vocabulary is the target's."""
    d2t = draft.d2t
    n, V = d2t.numel(), draft.arch.vocab_size
    if n == V and not bool((d2t != 0).any()):
        return None
    target_ids = torch.arange(n, device=d2t.device) + d2t
    if int(target_ids.min()) < 0 or int(target_ids.max()) >= V or target_ids.unique().numel() != n:
        raise ValueError(f"the draft's d2t maps its {n} ids onto target ids outside [0, {V}) or onto one id twice")
    out = torch.full((V,), IGNORE, dtype=torch.int64, device=d2t.device)
    out[target_ids] = torch.arange(n, device=d2t.device)
    return out


def draft_labels(labels: torch.Tensor, to_draft: Optional[torch.Tensor]) -> torch.Tensor:
    """Target-id labels as the draft's lm_head indexes them; unknown labels (< 0) become IGNORE."""
    known = labels >= 0
    if to_draft is not None:
        labels = to_draft[labels.clamp(min=0)]
    return torch.where(known, labels, torch.full_like(labels, IGNORE))


def step_losses(draft: Eagle3Draft, taps: torch.Tensor, seq: torch.Tensor, greedy: torch.Tensor, steps: int,
                use_op: bool = False) -> List[torch.Tensor]:
    """Per-step logits for anchors 0..T-steps-1 of a batch: taps [B, T, K*H], seq [B, T] tokens, greedy [B, T]."""
    T = seq.shape[1]
    return draft.unroll(taps[:, : T - steps], seq[:, 1:], steps, use_op=use_op)


def fan_in_lr(p: torch.Tensor, lr: float, lr_fan_in: int) -> float:
    """The learning rate of one parameter: a matrix's scaled down by its fan-in above ``lr_fan_in``, a vector's
    unchanged."""
    if p.dim() < 2 or p.shape[1] <= lr_fan_in:
        return lr
    return lr * lr_fan_in / p.shape[1]


def param_groups(draft: Eagle3Draft, lr: float, lr_fan_in: int) -> List[dict]:
    """The trainable parameters in one optimizer group per learning rate (:func:`fan_in_lr`)."""
    if not (isinstance(lr_fan_in, int) and lr_fan_in >= 1) or not lr > 0:
        raise ValueError(f"lr must be > 0 and lr_fan_in an integer >= 1, got {lr!r}, {lr_fan_in!r}")
    by_lr: dict = {}
    for p in draft.parameters():
        if p.requires_grad:
            by_lr.setdefault(fan_in_lr(p, lr, lr_fan_in), []).append(p)
    return [{"params": ps, "lr": v} for v, ps in sorted(by_lr.items(), reverse=True)]


def train_draft(draft: Eagle3Draft, taps: torch.Tensor, seq: torch.Tensor, greedy: torch.Tensor,
                cfg: TrainConfig, progress: Optional[Callable[[int, float], None]] = None) -> dict:
    """Train on taps [N, T, K*H], sequences [N, T], target greedy tokens [N, T] (the label of step j at anchor t is
    greedy[t + j]; a negative label, a token the source does not know, is skipped). A draft with a reduced
    vocabulary (d2t) learns the target tokens it can propose; the others are skipped. Returns a small log (loss
    curve, iterations run, seconds)."""
    gen = torch.Generator().manual_seed(cfg.seed)
    params = [p for p in draft.parameters() if p.requires_grad]
    groups = param_groups(draft, cfg.lr, cfg.lr_fan_in)
    opt = torch.optim.AdamW(groups, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.98))
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=[g["lr"] for g in groups], total_steps=cfg.iters,
                                                pct_start=0.1)
    N, T = seq.shape
    S = cfg.steps
    to_draft = label_map(draft)
    losses = []
    t0 = time.perf_counter()
    draft.train()
    it = 0
    for it in range(cfg.iters):
        idx = torch.randint(0, N, (min(cfg.batch, N),), generator=gen)
        logits = step_losses(draft, taps[idx], seq[idx], greedy[idx], S)
        loss = 0.0
        for j, lg in enumerate(logits, start=1):
            labels = draft_labels(greedy[idx][:, j: j + T - S], to_draft)
            if not bool((labels != IGNORE).any()):
                continue  # nothing the draft can learn at this step of this batch (a mean over none is NaN)
            loss = loss + (cfg.step_decay ** (j - 1)) * F.cross_entropy(lg.reshape(-1, lg.shape[-1]),
                                                                         labels.reshape(-1), ignore_index=IGNORE)
        if not torch.is_tensor(loss):
            continue
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        lv = loss.item()
        losses.append(lv)
        if progress is not None:
            progress(it, lv)
        if cfg.time_limit_s is not None and time.perf_counter() - t0 > cfg.time_limit_s:
            break
    draft.eval()
    if not losses:
        raise ValueError("no label the draft can learn: every target token of the data is outside its vocabulary "
                         "(d2t) or unknown")
    return {"iters": it + 1, "seconds": time.perf_counter() - t0, "loss_first": losses[0], "loss_last": losses[-1],
            "loss_curve": losses[:: max(1, len(losses) // 50)]}


__all__ = ["TrainConfig", "init_draft_from_target", "train_draft", "step_losses", "label_map", "draft_labels", "IGNORE",
           "fan_in_lr", "param_groups"]
