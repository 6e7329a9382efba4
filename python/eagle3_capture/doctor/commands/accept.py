"""``doctor accept``: the standalone test of a draft against its target, offline.

For each prompt the target writes its own greedy continuation; at every anchor t of that continuation (the target
has just produced x_{t+1}) the draft runs its chain (see ``draft.model.Eagle3Draft.unroll``) from the target's taps
at t, as a server would, with the draft fc through ``ops.draft_fc``. Step j is correct when the draft's top-1 token
equals the target's greedy token at t+j. Reported: the teacher-forced and conditional accuracy per step and tau
(:mod:`..replay.metrics`), and the served accept length (:mod:`..sglang_model.serving`): SGLang's own loop replayed
for the server flags (the chain, or the tree for eagle-topk > 1) over each prompt's continuation, reported as its
``meta_info`` reports it: completion tokens / verifies, and the histogram of accepted draft tokens per verify. This,
not tau, is what a server's ``spec_accept_length`` is compared with.

The taps fed to the draft are the declared ones unless ``--taps`` says otherwise (to predict a miswired server).

The target side (:mod:`..target_side.open`) is a transformers model (``--target``), or a recorded dump of the doctor's
teacher-forced requests (``--hidden-states DUMP``: the server's own residual stream; the continuation is the dumped
request's tokens after the prompt -- the server's greedy output, which ``doctor online`` sent back -- and the
target's greedy token after position t is the token at t+1). The replay is :mod:`..replay.evaluate`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Sequence

from ...spec import TapSpec
from .. import arg_types as at
from .. import options
from ..bad_rows import BLAME, BadRows
from ..common import EXIT_FINDINGS, EXIT_OK, DoctorError
from ..options import flag
from ..profile_out import WrittenProfile, check_profile_out, write_profile
from ..replay.metrics import SERVED_MEANS, TAU_MEANS, Metrics
from ..sglang_model.release import MODELLED
from ..sglang_model.serving import Served, total


DESCRIPTION = ("Runs the target's greedy continuation of each prompt and the draft's chain at every position, as a "
               "server would (draft fc through the project's op): top-1 agreement per draft step, teacher-forced and "
               "conditional on the earlier steps; the served accept length (completion tokens / verifies along SGLang "
               f"{MODELLED}'s own loop, chain or tree, per prompt and in total: the figure to compare with a "
               "server's); and tau = 1 + sum_k prod_(i<=k) acc_i over every position (not a served figure).")


@dataclass(frozen=True, kw_only=True)
class Options:
    target: Optional[str] = flag("--target", metavar="PATH|demo",
                                 help="transformers model directory, or 'demo' (or instead: --hidden-states)")
    hidden_states: Optional[str] = flag("--hidden-states", metavar="DUMP",
                                        help="instead of --target: a dump of the server's own residual stream for the "
                                             "doctor's teacher-forced requests (the EAGLE3_CAPTURE_DUMP directory of a "
                                             "`doctor online --dump` run); the continuation is each request's tokens "
                                             "after its prompt (the server's greedy output) and the target's greedy "
                                             "token after position t is the token at t+1")
    draft: str = flag("--draft", required=True, metavar="PATH",
                      help="EAGLE-3 draft directory (config.json + *.safetensors): LlamaForCausalLMEagle3 (SpecForge) "
                           "or Eagle3DeepseekV2ForCausalLM (MLA)")
    target_checkpoint: Optional[str] = options.target_checkpoint()  # with --hidden-states: embed_tokens / lm_head
    prompts: str = flag("--prompts", required=True, metavar="FILE", help="as for dump-reference")
    server_args: Optional[str] = options.server_args()  # SGLang's launch flags (default: its own for this target)
    taps: Optional[str] = flag("--taps", metavar="CONV:IDS",
                               help="feed these taps instead of the declared ones (predict a miswired server), e.g. "
                                    "layer_inputs:3,31,59")
    new_tokens: Optional[int] = flag("--new-tokens", type=at.int_at_least(2),
                                     help="continuation tokens per prompt (default 64 with --target; with "
                                          "--hidden-states, as many as the dumped requests hold)")
    steps: Optional[int] = flag("--steps", type=at.POSITIVE,
                                help="draft steps to measure (default: the chain length, >= 3; not fewer than the "
                                     "chain length)")
    batch_size: int = flag("--batch-size", type=at.POSITIVE, default=8)
    device: str = options.device()
    threads: Optional[int] = options.threads()
    dtype: str = options.draft_dtype()
    json: Optional[str] = options.json_out("write the report as JSON")
    tensors: Optional[str] = flag("--tensors", metavar="OUT.safetensors", type=at.output_file,
                                  help="write per-position results (correct [N, steps])")
    no_progress: bool = options.no_progress()
    seed: int = options.seed("seed of the demo target (with --target demo)")
    profile_out: Optional[str] = options.profile_out()  # the expected-acceptance profile of the prediction


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
    bad: List[BadRows] = field(default_factory=list)  # prompts left out: their taps hold bad rows
    prompt_ids: Optional[List[int]] = None  # which prompts of the file ``served`` is for (None: all, in order)
    profile: Optional[WrittenProfile] = None  # --profile-out: where the expected-acceptance profile went

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
            "per_prompt": [{"prompt": i, **s.to_json()} for i, s in zip(self.prompt_ids or range(len(self.served)),
                                                                           self.served)]}
        return {"target": self.target, "draft": self.draft, "taps": [repr(t) for t in self.taps.taps],
                "declared": None if self.declared is None else [repr(t) for t in self.declared.taps],
                "server_args": self.flags_text,
                "server": {"num_steps": self.steps, "eagle_topk": self.topk, "num_draft_tokens": self.draft_tokens,
                           "error": self.flag_error},
                "served": served, "tau": round(self.tau, 6),
                "metrics": self.metrics.to_json(), "prompts": self.prompts, "tokens": self.tokens,
                "notes": self.notes, "left_out": [b.to_json() for b in self.bad],
                "profile": None if self.profile is None else self.profile.to_json()}


def render_served(served: Sequence[Served], label: str = "prompt", ids: Optional[Sequence[int]] = None) -> List[str]:
    """The per-prompt table and the total line, as SGLang reports them (``ids``: the prompts' numbers)."""
    lines = [f"{label:>6}  tokens  verifies  accept length  accepted drafts per verify (0, 1, ...)"]
    for i, s in zip(ids or range(len(served)), served):
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
        src = f"server flags {rep.flags_text!r}" if rep.flags_text else f"SGLang {MODELLED} defaults for this target"
        lines.append(f"{src}: num-steps {rep.steps}, eagle-topk {rep.topk}, num-draft-tokens {rep.draft_tokens}"
                     + (" (a tree)" if rep.topk > 1 else " (a chain)"))
        lines += ["", "SGLang's loop replayed (what each response's meta_info reports):"]
        lines += ["  " + ln for ln in render_served(rep.served, ids=rep.prompt_ids)]
        tot = rep.served_total
        lines += ["", f"served accept length = {tot.completion_tokens} / {tot.verify_ct} = "
                      f"{tot.served_accept_length:.3f}   <- compare with the server's spec_accept_length",
                  f"tau = 1 + sum_k prod_(i<=k) acc_i = {rep.tau:.3f}"
                  + (" (top-1 chain; the tree's tau is not computed)" if rep.topk > 1 else ""),
                  f"  {SERVED_MEANS}", f"  {TAU_MEANS}"]
    if rep.profile is not None:
        lines += [""] + rep.profile.lines()
    lines += [f"note: {n}" for n in rep.notes]
    if rep.bad:
        lines += ["", f"{len(rep.bad)} prompt(s) left out of every figure above, their taps holding bad rows:"]
        lines += [f"  {b.line()}" for b in rep.bad]
        lines.append(f"  ({BLAME})")
    return "\n".join(lines)


def run(opts: Options) -> AcceptReport:
    from ..common import pick_device, torch_threads

    device = pick_device(opts.device)
    with torch_threads(opts.threads):
        return _run(opts, device)


def _run(opts: Options, device: str) -> AcceptReport:
    import torch

    from ..bounds import check_positions, check_speculative, check_steps
    from ..common import read_prompts, save_safetensors
    from ..draft.side import draft_dtype, load_draft_side
    from ..replay.evaluate import evaluate, served_walks, unserved_reason, usable_runs
    from ..replay.metrics import metrics
    from ..sglang_model.flag_rules import not_eagle3, resolve_speculative
    from ..sglang_model.serving import chain_accepted
    from ..sglang_model.server_args import parse_server_args
    from ..target_side.checkpoint import CheckpointSide
    from ..target_side.open import open_target

    progress = not opts.no_progress
    check_profile_out(opts.profile_out)  # before any model loads
    check_steps(opts.steps, "--steps")
    flags = parse_server_args(opts.server_args) if opts.server_args else None
    refused = not_eagle3(flags) if flags is not None else None
    if refused:
        raise DoctorError(f"--server-args: {refused}")
    if (opts.target is None) == (opts.hidden_states is None):
        raise DoctorError("give the target side: --target (a transformers model) or --hidden-states (a dump of the "
                          "server's teacher-forced requests), one of them")
    if opts.target is not None and opts.target_checkpoint is not None:
        raise DoctorError("--target-checkpoint is for --hidden-states (without a model to take the embedding from); "
                          "--target has its own")
    opened = open_target(opts.target, CheckpointSide(opts.target_checkpoint), device=device, seed=opts.seed,
                         progress=progress, dump=opts.hidden_states)
    side = opened.side
    ds = load_draft_side(opts.draft, side.info, opts.taps, device,
                         draft_dtype(opts.dtype, device, opts.target is not None), opened.embed, opened.lm_head)
    spec, declared, notes = ds.taps, ds.declared, list(ds.notes)
    res = resolve_speculative(flags or parse_server_args(""), side.info.architecture)
    if opts.profile_out is not None and unserved_reason(res) is not None:
        raise DoctorError(f"--profile-out: a profile needs the served prediction, and there is none for these "
                          f"flags: {unserved_reason(res)}")
    if unserved_reason(res) is None:
        check_speculative(res.steps, res.topk, res.draft_tokens, ds.draft.arch.draft_vocab_size, "--server-args")
    n_chain = res.steps if (res.steps is not None and not res.error) else 3
    steps = opts.steps
    if steps is not None and steps < n_chain:
        raise DoctorError(f"--steps {steps}: fewer than the {n_chain} draft steps of the chain "
                          + (f"the server flags give (--speculative-num-steps {n_chain})" if flags is not None and
                             res.steps is not None and not res.error else "measured by default")
                          + "; the served accept length needs every step of the chain: give --steps "
                          f">= {n_chain}, or server flags with fewer --speculative-num-steps")
    S = max(1, n_chain, steps or 0)
    vocab = side.info.vocab_size or ds.draft.arch.vocab_size
    prompts = read_prompts(opts.prompts, side.tokenizer, vocab_size=vocab)
    new_tokens = opts.new_tokens
    if new_tokens is None:
        new_tokens = side.available_new_tokens(prompts, S) if opts.hidden_states is not None else 64
        if new_tokens < 2:
            raise DoctorError(f"--hidden-states {opts.hidden_states}: its requests hold too few tokens after the "
                              f"prompts for {S} draft steps (need the new tokens + {S + 1})")
    # a transformers target's positions bound the continuation; a dump holds what it holds
    target_model = getattr(getattr(side, "target", None), "model", None)
    if target_model is not None:
        check_positions(target_model, prompts, new_tokens, S, "--new-tokens")
    from ..fingerprint.stream import with_slot_holdings
    from ..target_side.dump_side import AnotherDeclaration

    try:
        runs = evaluate(side, ds.draft, prompts, spec, S, new_tokens, res, opts.batch_size, progress)
    except AnotherDeclaration as e:  # the server runs another declaration: what do its slots hold?
        raise with_slot_holdings(e) from None
    notes += side.notes
    bad = [r.bad for r in runs if r.bad is not None]
    kept = usable_runs(runs, f"--hidden-states {opts.hidden_states}" if opts.hidden_states else
                       f"--target {opts.target}")
    runs = [runs[i] for i in kept]
    allc = torch.cat([r.correct for r in runs], 0)
    m = metrics(allc)
    topk = res.topk if res.topk is not None else 1
    rep = AcceptReport(side.source, opts.draft, spec, declared, flags.raw if flags else "",
                       res.steps if res.steps is not None else n_chain, topk,
                       res.draft_tokens if res.draft_tokens is not None else n_chain + 1, res.error, m,
                       len(runs), sum(int(r.seq.numel()) for r in runs), new_tokens,
                       served_walks(runs, new_tokens), unserved_reason(res), notes, bad,
                       kept if bad else None)
    if opts.profile_out is not None:
        rep.profile = write_profile(opts.profile_out, "doctor accept", (rep.steps, rep.topk, rep.draft_tokens),
                                    rep.served_total.histogram, rep.prompts, opts.draft, rep.target)
    if opts.tensors:
        save_safetensors(opts.tensors, {"correct": allc.to(torch.uint8),
                                        "accepted": chain_accepted(allc, rep.steps)},
                         {"format": "eagle3-capture-accept/1", "steps": S, "taps": [repr(t) for t in spec.taps]})
    return rep


def exit_code(rep: AcceptReport) -> int:
    """0, or 1 when prompts were left out for bad rows (the figures rest on the others; the data is broken)."""
    return EXIT_FINDINGS if rep.bad else EXIT_OK


__all__ = ["DESCRIPTION", "Options", "run", "AcceptReport", "render", "render_served", "exit_code"]
