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
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

import torch

from .. import configs
from ..spec import CONVENTIONS, Embedding, TapError, TapSpec
from .common import DoctorError, read_prompts, save_safetensors, write_json
from .serving import Served, chain_accepted, total, tree_accepted, walk
from .bounds import check_positions, check_speculative, check_steps
from .server_args import not_eagle3, parse_server_args, resolve_speculative


def tap_indices(spec: TapSpec) -> List[int]:
    """Index of each tap in the residual-stream stack (0 Embedding, k+1 LayerOutput(k))."""
    return [0 if isinstance(t, Embedding) else t.k + 1 for t in spec.taps]


def parse_taps(text: str, num_layers: int, hidden_size: int) -> TapSpec:
    """``"<convention>:<i,j,...>"`` with convention draft_ids | layer_inputs | hf_hidden_states (``hf`` for short),
    or bare integers (draft ids)."""
    conv, sep, rest = text.partition(":")
    if not sep:
        conv, rest = "draft_ids", text
    conv = {"hf": "hf_hidden_states", "draft": "draft_ids", "inputs": "layer_inputs"}.get(conv.strip(), conv.strip())
    if conv not in CONVENTIONS:
        raise DoctorError(f"--taps {text!r}: unknown convention {conv!r}; expected one of {sorted(CONVENTIONS)} "
                          "(e.g. draft_ids:-1,2,5)")
    try:
        ids = [int(v) for v in rest.replace(" ", "").split(",") if v != ""]
    except ValueError:
        raise DoctorError(f"--taps {text!r}: expected comma-separated integers after '{conv}:'") from None
    opts = {"allow_final_boundary": True} if conv == "layer_inputs" else (
        {"final_is_prenorm": True} if conv == "hf_hidden_states" else {})
    try:
        return TapSpec.from_convention(conv, ids, num_layers, hidden_size, **opts)
    except TapError as e:
        raise DoctorError(f"--taps {text!r}: {e}") from None


@torch.no_grad()
def chain_correct(draft, stack: torch.Tensor, seq: torch.Tensor, greedy: torch.Tensor, tap_idx: Sequence[int],
                  steps: int, first_anchor: int, use_op: bool = True) -> torch.Tensor:
    """Correctness [B, A, steps] of the draft chain at anchors first_anchor..T-1-steps.

    stack: [B, T, L+1, H] residual-stream taps; seq: [B, T] tokens; greedy: [B, T] target argmax tokens."""
    B, T = seq.shape
    A = T - steps - first_anchor
    if A <= 0:
        return torch.zeros(B, 0, steps, dtype=torch.bool)
    taps = stack[:, : T - steps, list(tap_idx)].reshape(B, T - steps, -1)
    logits = draft.unroll(taps.to(next(draft.parameters()).dtype), seq[:, 1:], steps, use_op=use_op)
    out = []
    for j, lg in enumerate(logits, start=1):
        pred = draft.to_target_ids(lg.argmax(-1))
        out.append((pred == greedy[:, j: j + T - steps])[:, first_anchor:])
    return torch.stack(out, -1).cpu()


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


@dataclass
class PromptRun:
    """One prompt's offline run: its continuation and, per anchor, the chain's correctness and what a verify
    there accepts under the server flags."""

    prompt: List[int]
    seq: torch.Tensor          # [P + new_tokens + S] prompt + greedy continuation
    correct: torch.Tensor      # [A, S] bool
    accepted: Optional[torch.Tensor]  # [A] int64, None when the flags are refused


def evaluate(target, draft, prompts: List[List[int]], spec: TapSpec, S: int, new_tokens: int, res, batch_size: int,
             device: str, progress: bool, desc: str = "accept") -> List[PromptRun]:
    """Greedy continuations, per-anchor chain correctness and served acceptance for every prompt (in order)."""
    from .target_model import greedy_continue, residual_stream

    idx = tap_indices(spec)
    groups: Dict[int, List[int]] = {}  # equal-length prompts batch together
    for i, p in enumerate(prompts):
        groups.setdefault(len(p), []).append(i)
    batches = [(P, g[i:i + batch_size]) for P, g in sorted(groups.items()) for i in range(0, len(g), batch_size)]
    runs: List[Optional[PromptRun]] = [None] * len(prompts)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(prompts), desc=desc, unit="prompt", leave=False)
    for P, members in batches:
        ids = torch.tensor([prompts[i] for i in members], dtype=torch.int64, device=device)
        seq = greedy_continue(target.model, ids, new_tokens + S)
        stack, _, greedy = residual_stream(target.model, seq)
        c = chain_correct(draft, stack, seq, greedy, idx, S, first_anchor=P - 1, use_op=True)
        acc = None
        if unserved_reason(res) is None:
            if res.topk == 1:
                acc = chain_accepted(c, res.steps)
            else:
                acc = tree_accepted(draft, stack, seq, greedy, idx, res.steps, res.topk, res.draft_tokens,
                                    first_anchor=P - 1, use_op=True)
        for j, i in enumerate(members):
            runs[i] = PromptRun(prompts[i], seq[j].cpu(), c[j], None if acc is None else acc[j])
        if bar is not None:
            bar.update(len(members))
    if bar is not None:
        bar.close()
    return runs


def unserved_reason(res) -> Optional[str]:
    """Why no served accept length can be predicted for these resolved flags (None: it can)."""
    if res.error:
        return f"SGLang 0.5.23 refuses the flags ({res.error})"
    if res.steps is None or res.topk is None or res.draft_tokens is None:
        return ("num-steps / eagle-topk / num-draft-tokens are not all known before serving (e.g. "
                "--speculative-adaptive changes them while serving)")
    return None


def served_walks(runs: Sequence[PromptRun], new_tokens: int) -> List[Served]:
    return [walk(r.accepted.tolist(), new_tokens) for r in runs] if runs and runs[0].accepted is not None else []


def load_pair(target_path: str, draft_path: str, taps: Optional[str], device: str, seed: int, progress: bool):
    """(target, draft, taps fed, declared taps, target config, notes) for ``accept`` and ``online``."""
    from .draft_checkpoint import load_draft
    from .target_model import load_target

    target = load_target(target_path, device=device, seed=seed, quiet=not progress)
    try:
        tcfg = configs.read_target_config(target.config_dict)
    except ValueError as e:
        raise DoctorError(f"target {target_path}: {e}") from None
    draft = load_draft(draft_path, target.model.get_input_embeddings().weight.detach().cpu(),
                       target.model.get_output_embeddings().weight.detach().cpu(), device=device)
    dcfg = configs.read_draft_config(os.path.join(draft_path, "config.json"))
    declared = None
    notes: List[str] = list(getattr(draft, "notes", []))
    try:
        declared = configs.draft_taps(dcfg, tcfg)
    except (TapError, ValueError) as e:
        if taps is None:
            raise DoctorError(f"the draft's declared taps do not fit the target: {e}; give --taps") from None
        notes.append(f"declared taps unusable ({e})")
    spec = parse_taps(taps, target.num_layers, target.hidden_size) if taps else declared
    if spec.K != draft.arch.num_aux:
        raise DoctorError(f"the draft's fc takes K={draft.arch.num_aux} taps of H={draft.arch.target_hidden_size}, "
                          f"--taps gives K={spec.K}: {list(spec.taps)}")
    if spec.hidden_size != draft.arch.target_hidden_size:
        raise DoctorError(f"the draft was built for a target of H={draft.arch.target_hidden_size}, this target has "
                          f"H={spec.hidden_size}")
    return target, draft, spec, declared, tcfg, notes


def run_accept(target_path: str, draft_path: str, prompts_path: str, server_args: Optional[str] = None,
               taps: Optional[str] = None, new_tokens: int = 64, steps: Optional[int] = None,
               batch_size: int = 8, device: str = "cpu", out_json: Optional[str] = None,
               out_tensors: Optional[str] = None, progress: bool = True, seed: int = 0) -> AcceptReport:
    if new_tokens < 2:
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
    target, draft, spec, declared, tcfg, notes = load_pair(target_path, draft_path, taps, device, seed, progress)
    arch = tcfg.architectures[0] if tcfg.architectures else None
    res = resolve_speculative(flags or parse_server_args(""), arch)
    if unserved_reason(res) is None:
        check_speculative(res.steps, res.topk, res.draft_tokens, draft.arch.draft_vocab_size, "--server-args")
    n_chain = res.steps if (res.steps is not None and not res.error) else 3
    if steps is not None and steps < n_chain:
        raise DoctorError(f"--steps {steps}: fewer than the {n_chain} draft steps of the chain "
                          + (f"the server flags give (--speculative-num-steps {n_chain})" if flags is not None and
                             res.steps is not None and not res.error else "measured by default")
                          + "; the served accept length needs every step of the chain: give --steps "
                          f">= {n_chain}, or server flags with fewer --speculative-num-steps")
    S = max(1, n_chain, steps or 0)
    prompts = read_prompts(prompts_path, target.tokenizer, vocab_size=target.vocab_size)
    check_positions(target.model, prompts, new_tokens, S, "--new-tokens")
    runs = evaluate(target, draft, prompts, spec, S, new_tokens, res, batch_size, device, progress)
    allc = torch.cat([r.correct for r in runs], 0)
    m = metrics(allc)
    topk = res.topk if res.topk is not None else 1
    rep = AcceptReport(target.source, draft_path, spec, declared, flags.raw if flags else "",
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


__all__ = ["tap_indices", "parse_taps", "chain_correct", "Metrics", "metrics", "AcceptReport", "PromptRun",
           "evaluate", "unserved_reason", "served_walks", "load_pair", "render", "render_served", "run_accept"]
