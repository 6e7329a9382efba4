"""``doctor accept``: the standalone test of a draft against its target, offline.

For each prompt the target writes its own greedy continuation; at every anchor t of that continuation (the target
has just produced x_{t+1}) the draft runs its chain (see ``draft_model.Eagle3Draft.unroll``) from the target's taps
at t, as a server would, with the draft fc through ``ops.draft_fc``. Step j is correct when the draft's top-1 token
equals the target's greedy token at t+j.

* teacher-forced accuracy of step j: over all anchors (the chain is fed the target's tokens);
* conditional accuracy of step j: over the anchors whose steps 1..j-1 were all correct -- exactly the anchors a
  server would still be verifying at step j, where the target's tokens and the draft's coincide;
* tau for a chain of n draft tokens: 1 + sum_{k=1..n} prod_{i<=k} acc_i (conditional accuracies), the mean over
  every anchor of 1 + (number of leading correct steps, at most n);
* the served accept length (``serving.py``): SGLang's own loop replayed for the server flags (the chain, or the
  tree for eagle-topk > 1) over each prompt's continuation, reported as its ``meta_info`` reports it: completion
  tokens / verifies, and the histogram of accepted draft tokens per verify. This, not tau, is what a server's
  ``spec_accept_length`` is compared with: the server's walk visits hard stretches more often than tau weighs them.

The taps fed to the draft are the declared ones unless ``--taps`` says otherwise (to predict a miswired server).

The target side (:mod:`.target_side`) is a transformers model (``--target``), or a recorded dump of the doctor's
teacher-forced requests (``--hidden-states DUMP``: the server's own residual stream; the continuation is the dumped
request's tokens after the prompt -- the server's greedy output, which ``doctor online`` sent back -- and the
target's greedy token after position t is the token at t+1). The replay is :mod:`.replay`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Sequence

import torch

from ...spec import TapSpec
from ..common import DoctorError, read_prompts, save_safetensors, write_json
from ..bounds import check_positions, check_speculative, check_steps
from ..draft.side import parse_taps
from ..replay.evaluate import chain_correct_taps
from ..sglang_model.serving import Served, chain_accepted, total
from ..sglang_model.flag_rules import not_eagle3, parse_server_args, resolve_speculative
from ..target.side import layer_inputs


def tap_indices(spec: TapSpec) -> List[int]:
    """Index of each tap in the residual-stream stack (0 Embedding, k+1 LayerOutput(k))."""
    return layer_inputs(spec)


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


@dataclass
class AcceptReport:
    target: str
    draft: str
    taps: TapSpec
    declared: Optional[TapSpec]
    flags_text: str
    steps: int
    topk: int
    draft_tokens: int
    flag_error: Optional[str]
    metrics: Metrics
    prompts: int
    tokens: int
    new_tokens: int
    served: List[Served]           # per prompt, in the prompts file's order; empty when not predicted
    unserved: Optional[str] = None  # why there is no served figure
    notes: List[str] = field(default_factory=list)

    @property
    def tau(self) -> float:
        return self.metrics.tau(self.steps)

    @property
    def served_total(self) -> Optional[Served]:
        return total(self.served) if self.served else None

    def to_json(self) -> dict:
        tot = self.served_total
        served = None if tot is None else {
            **tot.to_json(), "max_new_tokens": self.new_tokens,
            "per_prompt": [{"prompt": i, **s.to_json()} for i, s in enumerate(self.served)]}
        return {"target": self.target, "draft": self.draft, "taps": [repr(t) for t in self.taps.taps],
                "declared": None if self.declared is None else [repr(t) for t in self.declared.taps],
                "server_args": self.flags_text,
                "server": {"num_steps": self.steps, "eagle_topk": self.topk, "num_draft_tokens": self.draft_tokens,
                           "error": self.flag_error},
                "served": served, "tau": round(self.tau, 6),
                "metrics": self.metrics.to_json(), "prompts": self.prompts, "tokens": self.tokens,
                "notes": self.notes}


SERVED_MEANS = ("served accept length: completion tokens / verifies along SGLang's own loop (its meta_info "
                "spec_accept_length), the figure to compare with a server's")
TAU_MEANS = ("tau: the mean of 1 + accepted draft tokens over every position of the continuations, each weighed "
             "alike (no server reports it)")


def render_served(served: Sequence[Served], label: str = "prompt") -> List[str]:
    """The per-prompt table and the total line, as SGLang reports them."""
    lines = [f"{label:>6}  tokens  verifies  accept length  accepted drafts per verify (0, 1, ...)"]
    for i, s in enumerate(served):
        lines.append(f"{i:>6}  {s.completion_tokens:>6}  {s.verify_ct:>8}  {s.served_accept_length:>13.3f}  "
                     f"{s.histogram}")
    tot = total(served)
    lines.append(f"{'total':>6}  {tot.completion_tokens:>6}  {tot.verify_ct:>8}  {tot.served_accept_length:>13.3f}  "
                 f"{tot.histogram}")
    return lines


def render(rep: AcceptReport) -> str:
    m = rep.metrics
    lines = [f"target {rep.target}", f"draft  {rep.draft}",
             f"taps fed to the draft: {list(rep.taps.taps)}"
             + ("" if rep.declared is None or rep.declared.taps == rep.taps.taps
                else f"  (declared: {list(rep.declared.taps)})"),
             f"{rep.prompts} prompts, {rep.new_tokens} new tokens each, {m.anchors} anchor positions on the target's "
             "greedy continuations",
             "", "step  teacher-forced  conditional (support)  tau if chain ends here"]
    for j in range(m.steps):
        lines.append(f"{j + 1:>4}  {m.teacher_forced[j]:>14.3f}  {m.conditional[j]:>11.3f} ({m.conditional_support[j]:>6})"
                     f"  {m.tau_by_chain[j]:>8.3f}")
    lines.append("")
    if not rep.served:
        lines.append(f"server flags {rep.flags_text!r}: no served accept length: {rep.unserved}")
        lines.append(f"tau for a chain of {rep.steps} = {rep.tau:.3f}")
    else:
        src = f"server flags {rep.flags_text!r}" if rep.flags_text else "SGLang 0.5.23 defaults for this target"
        lines.append(f"{src}: num-steps {rep.steps}, eagle-topk {rep.topk}, num-draft-tokens {rep.draft_tokens}"
                     + (" (a tree)" if rep.topk > 1 else " (a chain)"))
        lines += ["", "SGLang's loop replayed (what each response's meta_info reports):"]
        lines += ["  " + ln for ln in render_served(rep.served)]
        tot = rep.served_total
        lines += ["", f"served accept length = {tot.completion_tokens} / {tot.verify_ct} = "
                      f"{tot.served_accept_length:.3f}   <- compare with the server's spec_accept_length",
                  f"tau = 1 + sum_k prod_(i<=k) acc_i = {rep.tau:.3f}"
                  + (" (top-1 chain; the tree's tau is not computed)" if rep.topk > 1 else ""),
                  f"  {SERVED_MEANS}", f"  {TAU_MEANS}"]
    lines += [f"note: {n}" for n in rep.notes]
    return "\n".join(lines)


def open_target(target: Optional[str], hidden_states: Optional[str], target_checkpoint: Optional[str],
                device: str, seed: int, progress: bool):
    """(the target side, its embedding, its lm_head) for accept: a transformers model, or a recorded dump (with the
    embedding / lm_head read alone from --target-checkpoint when the draft lacks them)."""
    if (target is None) == (hidden_states is None):
        raise DoctorError("give the target side: --target (a transformers model) or --hidden-states (a dump of the "
                          "server's teacher-forced requests), one of them")
    if target is not None:
        from ..target.model_side import TransformersTarget

        if target_checkpoint is not None:
            raise DoctorError("--target-checkpoint is for --hidden-states (without a model to take the embedding "
                              "from); --target has its own")
        side = TransformersTarget.load(target, device=device, seed=seed, quiet=not progress)
        m = side.target.model
        return side, m.get_input_embeddings().weight.detach(), m.get_output_embeddings().weight.detach()
    from ..target.checkpoint import CheckpointSide
    from ..target.dump_side import DumpTarget

    ck = CheckpointSide(target_checkpoint)
    side = DumpTarget(hidden_states, ck.config, ck.vocab_size, ck.tokenizer)
    embed, head = ck.weights(side.info, device)
    return side, embed, head


def run_accept(target_path: Optional[str], draft_path: str, prompts_path: str, server_args: Optional[str] = None,
               taps: Optional[str] = None, new_tokens: Optional[int] = 64, steps: Optional[int] = None,
               batch_size: int = 8, device: str = "cpu", out_json: Optional[str] = None,
               out_tensors: Optional[str] = None, progress: bool = True, seed: int = 0,
               hidden_states: Optional[str] = None, target_checkpoint: Optional[str] = None,
               dtype: Optional[str] = None) -> AcceptReport:
    from ..draft.side import draft_dtype, load_draft_side
    from ..replay.evaluate import evaluate, served_walks, unserved_reason

    if new_tokens is not None and new_tokens < 2:
        raise DoctorError(f"--new-tokens {new_tokens}: need at least 2 continuation tokens")
    if batch_size < 1:
        raise DoctorError(f"--batch-size {batch_size}: need at least 1")
    if steps is not None and steps < 1:
        raise DoctorError(f"--steps {steps}: need at least 1")
    check_steps(steps, "--steps")
    flags = parse_server_args(server_args) if server_args else None
    refused = not_eagle3(flags) if flags is not None else None
    if refused:
        raise DoctorError(f"--server-args: {refused}")
    side, embed, head = open_target(target_path, hidden_states, target_checkpoint, device, seed, progress)
    ds = load_draft_side(draft_path, side.info, taps, device, draft_dtype(dtype, device, target_path is not None),
                         embed, head)
    spec, declared, notes = ds.taps, ds.declared, list(ds.notes)
    res = resolve_speculative(flags or parse_server_args(""), side.info.architecture)
    if unserved_reason(res) is None:
        check_speculative(res.steps, res.topk, res.draft_tokens, ds.draft.arch.draft_vocab_size, "--server-args")
    n_chain = res.steps if (res.steps is not None and not res.error) else 3
    if steps is not None and steps < n_chain:
        raise DoctorError(f"--steps {steps}: fewer than the {n_chain} draft steps of the chain "
                          + (f"the server flags give (--speculative-num-steps {n_chain})" if flags is not None and
                             res.steps is not None and not res.error else "measured by default")
                          + "; the served accept length needs every step of the chain: give --steps "
                          f">= {n_chain}, or server flags with fewer --speculative-num-steps")
    S = max(1, n_chain, steps or 0)
    vocab = side.info.vocab_size or ds.draft.arch.vocab_size
    prompts = read_prompts(prompts_path, side.tokenizer, vocab_size=vocab)
    if new_tokens is None:
        new_tokens = side.available_new_tokens(prompts, S) if hidden_states is not None else 64
        if new_tokens < 2:
            raise DoctorError(f"--hidden-states {hidden_states}: its requests hold too few tokens after the prompts "
                              f"for {S} draft steps (need the new tokens + {S + 1})")
    # a transformers target's positions bound the continuation; a dump holds what it holds
    target_model = getattr(getattr(side, "target", None), "model", None)
    if target_model is not None:
        check_positions(target_model, prompts, new_tokens, S, "--new-tokens")
    runs = evaluate(side, ds.draft, prompts, spec, S, new_tokens, res, batch_size, progress)
    notes += side.notes
    allc = torch.cat([r.correct for r in runs], 0)
    m = metrics(allc)
    topk = res.topk if res.topk is not None else 1
    rep = AcceptReport(side.source, draft_path, spec, declared, flags.raw if flags else "",
                       res.steps if res.steps is not None else n_chain, topk,
                       res.draft_tokens if res.draft_tokens is not None else n_chain + 1, res.error, m,
                       len(prompts), sum(int(r.seq.numel()) for r in runs), new_tokens,
                       served_walks(runs, new_tokens), unserved_reason(res), notes)
    if out_json:
        write_json(out_json, rep.to_json())
    if out_tensors:
        save_safetensors(out_tensors, {"correct": allc.to(torch.uint8),
                                       "accepted": chain_accepted(allc, rep.steps)},
                         {"format": "eagle3-capture-accept/1", "steps": S, "taps": [repr(t) for t in spec.taps]})
    return rep


__all__ = ["tap_indices", "parse_taps", "chain_correct", "Metrics", "metrics", "AcceptReport", "open_target",
           "render", "render_served", "run_accept"]
