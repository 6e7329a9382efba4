"""``doctor online``: a running SGLang server's speculative figures beside the doctor's replay of the same loop.

The prompts go to the server's native ``/generate`` as token ids (temperature 0, ``ignore_eos``,
``max_new_tokens`` N), or come from a JSONL file of recorded responses (``{"input_ids", "output_ids",
"meta_info"}`` a line). Each response's ``meta_info`` gives ``completion_tokens``, ``spec_verify_ct`` and
``spec_correct_drafts_histogram``. Offline, the target side (:mod:`..target_side.open`: a transformers model with
``--target``, or, without it, the server itself: its teacher-forced pass and residual-stream dump with a URL, a
recorded dump of such a pass with a file) gives the greedy continuation of the same prompts and the draft's taps,
and :mod:`..sglang_model.serving` replays SGLang's loop for the server's flags (``accept`` does the same). Then:

1. the outputs must equal the target's greedy continuation, or the comparison means nothing (not lossless:
   sampling, another dtype, another target) -- except where the served token is the runner-up of a near-tie of the
   target's logits (two passes of different shapes round differently in bf16: replay/near_ties.py), which is
   listed, never called lossy. Without ``--target`` the replay follows the path the server served (each draft
   step's label is the served token); a prompt whose served counts differ from the prediction only where listed
   near-ties of the draft's proposals could have gone the other way is said to, and still matches;
2. per draft step k, the server's share of verifies that accepted step k given steps 1..k-1, against the same share
   in the replay; online below offline at a step means the draft sees other inputs online than offline (the
   capture, or the draft side);
3. the served accept length, online against predicted.

Without ``--target`` the served slots are also fingerprinted against the server's stream
(:mod:`..fingerprint.stream`). Exit 0 when everything matches within ``--tolerance``, 1 on a mismatch, 2 on bad
input or an unreachable server.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from .. import arg_types as at
from .. import options
from ..bad_rows import BLAME, BadRows, summary
from ..bounds import MAX_TIMEOUT_S
from ..common import EXIT_FINDINGS, EXIT_OK, DoctorError
from ..options import flag
from ..profile_out import WrittenProfile, check_profile_out, write_profile
from ..replay.metrics import SERVED_MEANS
from ..sglang_model.release import MODELLED
from ..sglang_model.responses import Response, StepRow, check_counts, read_recorded
from ..sglang_model.serving import Served, total


DESCRIPTION = ("Sends the prompts as token ids to a running SGLang server's /generate (greedy, ignore_eos, "
               "max_new_tokens N), or reads recorded responses, checks the outputs equal the target's greedy "
               "continuation, replays SGLang's speculative loop offline for the server's flags, and compares per "
               "prompt and in total: the served accept length and the per-step acceptance. The target side is "
               "--target (a transformers model run here) or, without it, the server itself (--dump: its "
               "teacher-forced pass and residual stream; only the draft is loaded here, and the served slots are "
               "fingerprinted too). Exit 0 when they match, 1 on a mismatch (with what it means), 2 on bad input or "
               "an unreachable server.")


@dataclass(frozen=True, kw_only=True)
class Options:
    server: str = flag("--server", required=True, metavar="URL|FILE.jsonl", type=at.server,  # checked URL or file
                       help="http://host:port of a running server, or a JSONL file of recorded responses "
                            "({\"input_ids\", \"output_ids\", \"meta_info\"} a line)")
    prompts: str = flag("--prompts", required=True, metavar="FILE", help="as for dump-reference")
    target: Optional[str] = flag("--target", metavar="PATH|demo",
                                 help="the served target as a transformers directory, run here; leave it out to take "
                                      "the target side from the server itself (--dump)")
    dump: Optional[str] = flag("--dump", metavar="DIR",
                               help="without --target: the directory the server was started with in "
                                    "EAGLE3_CAPTURE_DUMP. The doctor sends each prompt + the server's continuation "
                                    "once more as one teacher-forced prefill (rid eagle3-doctor-..., with input "
                                    "logprobs for the target's greedy token at every position) and reads the "
                                    "plugin's dump of that forward: the residual stream at the layers the draft "
                                    "declares, which the prediction uses (never the slots the server fed its draft: "
                                    "those are fingerprinted). The doctor reads the files itself, so the server must "
                                    "write them where this machine sees them (a shared filesystem). With a recorded "
                                    "--server file: a dump of such a run")
    draft: str = flag("--draft", required=True, metavar="PATH", help="the EAGLE-3 draft directory the server runs")
    target_checkpoint: Optional[str] = options.target_checkpoint()
    server_args: Optional[str] = options.server_args(options.SERVER_ARGS_HELP + "; optional with a URL (the server's "
                                                     "/server_info says), needed with a file")
    new_tokens: Optional[int] = flag("--new-tokens", type=at.int_at_least(2),
                                     help="max_new_tokens per request (needed with a URL; a file's completion tokens "
                                          "otherwise)")
    taps: Optional[str] = flag("--taps", metavar="CONV:IDS",
                               help="replay with these taps instead of the draft's declared ones")
    tolerance: float = flag("--tolerance", type=at.finite_float(0.0, 1.0, high_open=True), default=0.02,
                            help="largest per-step acceptance difference (and relative accept-length difference) "
                                 "still called a match (default 0.02)")
    timeout: float = flag("--timeout", type=at.finite_float(0.0, MAX_TIMEOUT_S, low_open=True), default=600.0,
                          help=f"seconds to wait for each response (default 600, at most {MAX_TIMEOUT_S:g})")
    concurrency: int = flag("--concurrency", type=at.POSITIVE, default=8, help="requests in flight at once (default 8)")
    batch_size: int = flag("--batch-size", type=at.POSITIVE, default=8, help="prompts per offline batch")
    device: str = options.device()
    threads: Optional[int] = options.threads()
    dtype: str = options.draft_dtype()
    json: Optional[str] = options.json_out("write the report as JSON")
    no_progress: bool = options.no_progress()
    seed: int = options.seed("seed of the demo target (with --target demo)")
    profile_out: Optional[str] = options.profile_out()  # the expected-acceptance profile of the prediction


@dataclass
class OnlineReport:
    server: str
    target: str
    draft: str
    taps: List[str]
    flags: Tuple[int, int, int]
    new_tokens: int
    online: List[Served]
    predicted: List[Served]
    lossless: List[bool]
    first_difference: Optional[Tuple[int, int]]  # (prompt, output position) of the first differing token
    steps: List[StepRow]
    tolerance: float
    verdict: str
    ok: bool
    tau: float
    notes: List[str] = field(default_factory=list)
    fingerprint: Optional[dict] = None          # the served slots against the server's stream (no --target)
    fingerprint_lines: List[str] = field(default_factory=list)
    left_out: List[BadRows] = field(default_factory=list)   # prompts whose taps hold bad rows
    prompt_ids: Optional[List[int]] = None       # which prompts the rows are (None: all, in order)
    profile: Optional[WrittenProfile] = None      # --profile-out: where the expected-acceptance profile went
    near_ties: list = field(default_factory=list)  # replay.near_ties.NearTie: decisions rounding may have taken
    explained: List[int] = field(default_factory=list)  # prompts whose counts differ only at listed near-ties

    def to_json(self) -> dict:
        s, k, d = self.flags
        return {"fingerprint": self.fingerprint, **self._fields(s, k, d)}

    @property
    def _ids(self) -> List[int]:
        return self.prompt_ids if self.prompt_ids is not None else list(range(len(self.online)))

    def _fields(self, s, k, d) -> dict:
        return {
            "server": self.server, "target": self.target, "draft": self.draft, "taps": self.taps,
            "server_flags": {"num_steps": s, "eagle_topk": k, "num_draft_tokens": d}, "max_new_tokens": self.new_tokens,
            "verdict": self.verdict, "ok": self.ok, "tolerance": self.tolerance,
            "online": {**total(self.online).to_json(),
                       "per_prompt": [{"prompt": i, **o.to_json()} for i, o in zip(self._ids, self.online)]},
            "predicted": {**total(self.predicted).to_json(),
                          "per_prompt": [{"prompt": i, **o.to_json()} for i, o in zip(self._ids, self.predicted)]},
            "left_out": [b.to_json() for b in self.left_out],
            "lossless": self.lossless, "first_difference": self.first_difference,
            "step_acceptance": [{"step": r.step, "online": _r(r.online), "offline": _r(r.offline),
                                 "offline_all_positions": _r(r.offline_all)} for r in self.steps],
            "tau": round(self.tau, 6), "notes": self.notes,
            "near_ties": [t.to_json() for t in self.near_ties], "explained_by_near_ties": self.explained,
            "profile": None if self.profile is None else self.profile.to_json(),
        }


def _r(v: float):
    return None if v is None or math.isnan(v) else round(v, 6)


def served_flags(server_args: Optional[str], arch: Optional[str], from_server, responses: Sequence[Response]
                 ) -> Tuple[int, int, int]:
    """The server's (num-steps, eagle-topk, num-draft-tokens): from ``--server-args`` (resolved as SGLang
    would for the target's class ``arch``) and from the server's ``/server_info`` (``from_server``), which must
    agree; the responses' counts are then checked against them."""
    from ..sglang_model.flag_rules import not_eagle3, resolve_speculative
    from ..sglang_model.server_args import parse_server_args

    given = None
    if server_args:
        parsed = parse_server_args(server_args)
        refused = not_eagle3(parsed)
        if refused:
            raise DoctorError(f"--server-args: {refused}")
        res = resolve_speculative(parsed, arch)
        if res.error:
            raise DoctorError(f"--server-args {server_args!r}: SGLang {MODELLED} refuses them ({res.error})")
        if res.steps is None or res.topk is None or res.draft_tokens is None:
            raise DoctorError(f"--server-args {server_args!r}: num-steps, eagle-topk and num-draft-tokens must be "
                              "known (adaptive speculative decoding is not replayed)")
        given = (res.steps, res.topk, res.draft_tokens)
    if from_server is not None and given is not None and tuple(from_server) != given:
        raise DoctorError(f"--server-args give num-steps/eagle-topk/num-draft-tokens {given}, but the server reports "
                          f"{tuple(from_server)} (/server_info)")
    flags = given or from_server
    if flags is None:
        raise DoctorError("the server's speculative flags are unknown: give --server-args (a recorded file, or a "
                          "server without /server_info)")
    check_counts(responses, flags)
    return flags


def render(rep: OnlineReport) -> str:
    S, k, D = rep.flags
    on_tot, pr_tot = total(rep.online), total(rep.predicted)
    lines = [f"server {rep.server}", f"target {rep.target}", f"draft  {rep.draft} (taps {rep.taps})",
             f"{len(rep.online)} prompts" + (f" ({len(rep.left_out)} more left out: bad rows)" if rep.left_out else "")
             + f", max_new_tokens {rep.new_tokens}, num-steps {S}, eagle-topk {k}, "
             f"num-draft-tokens {D}",
             f"outputs equal the target's greedy continuation: {sum(rep.lossless)} of {len(rep.lossless)} prompts",
             "", "prompt  tokens  verifies online / predicted  accept length online / predicted"]
    for i, o, p in zip(rep._ids, rep.online, rep.predicted):
        mark = "" if (o.verify_ct == p.verify_ct and o.histogram == p.histogram) else "   <- differs"
        lines.append(f"{i:>6}  {o.completion_tokens:>6}  {o.verify_ct:>8} / {p.verify_ct:<9}  "
                     f"{o.served_accept_length:>13.3f} / {p.served_accept_length:.3f}{mark}")
    lines.append(f"{'total':>6}  {on_tot.completion_tokens:>6}  {on_tot.verify_ct:>8} / {pr_tot.verify_ct:<9}  "
                 f"{on_tot.served_accept_length:>13.3f} / {pr_tot.served_accept_length:.3f}")
    lines += ["", f"accepted drafts per verify (0, 1, ...): online {on_tot.histogram}, predicted {pr_tot.histogram}",
              "", "step  online  offline (replayed walk)  offline (all positions)"]
    for r in rep.steps:
        lines.append(f"{r.step:>4}  {_fmt(r.online):>6}  {_fmt(r.offline):>23}  {_fmt(r.offline_all):>23}")
    lines += ["", f"  {SERVED_MEANS}", f"  tau over every position (not a served figure): {rep.tau:.3f}"]
    if rep.near_ties:
        from ..replay.near_ties import summary_line

        lines += ["", summary_line(rep.near_ties) + ":"] + [f"  {t.line()}" for t in rep.near_ties[:20]]
        if len(rep.near_ties) > 20:
            lines.append(f"  ... {len(rep.near_ties) - 20} more in --json")
    if rep.fingerprint_lines:
        lines += [""] + rep.fingerprint_lines
    if rep.profile is not None:
        lines += [""] + rep.profile.lines()
    lines += [f"note: {n}" for n in rep.notes]
    if rep.left_out:
        lines += ["", f"{len(rep.left_out)} prompt(s) left out of every figure above, their taps holding bad rows:"]
        lines += [f"  {b.line()}" for b in rep.left_out]
    lines += ["", f"verdict: {rep.verdict}"]
    return "\n".join(lines)


def _fmt(v: float) -> str:
    return "-" if v is None or math.isnan(v) else f"{v:.3f}"


def _recorded(server: str, prompts: List[List[int]], prompts_path: str, new_tokens: Optional[int]
              ) -> Tuple[List[Response], int]:
    recorded = read_recorded(server)
    by_ids: Dict[Tuple[int, ...], Response] = {tuple(r.input_ids): r for r in recorded}
    missing = [i for i, p in enumerate(prompts) if tuple(p) not in by_ids]
    if missing:
        raise DoctorError(f"--server {server}: no recorded response for prompt {missing[0]} of {prompts_path}"
                          f" ({len(missing)} of {len(prompts)} missing)")
    responses = [by_ids[tuple(p)] for p in prompts]
    lengths = sorted({r.served.completion_tokens for r in responses})
    if new_tokens is None:
        if len(lengths) != 1:
            raise DoctorError(f"--server {server}: the responses have {lengths} completion tokens; give "
                              "--new-tokens (the max_new_tokens they were served with)")
        new_tokens = lengths[0]
        if new_tokens < 2:
            raise DoctorError(f"--server {server}: the responses have {new_tokens} completion token each; the "
                              "replay needs responses to max_new_tokens >= 2")
    return responses, new_tokens  # a given --new-tokens was checked by its flag's type


def run(opts: Options) -> OnlineReport:
    from ..common import pick_device, torch_threads

    device = pick_device(opts.device)
    with torch_threads(opts.threads):
        return _run(opts, device)


def _run(opts: Options, device: str) -> OnlineReport:
    import torch

    from ..bounds import check_positions, check_speculative
    from ..common import read_prompts
    from ..draft.side import draft_dtype, draft_vocab_sizes, load_draft_side
    from ..replay.evaluate import evaluate, served_walks, usable_runs
    from ..replay.metrics import metrics
    from ..sglang_model.flag_rules import SpecResolution, not_eagle3
    from ..sglang_model.http import generate, server_flags
    from ..sglang_model.request_guard import check_outputs, check_request, server_limits
    from ..sglang_model.responses import has_histograms, verdict_of
    from ..sglang_model.server_args import parse_server_args
    from ..sglang_model.server_url import is_url as url_like
    from ..sglang_model.serving import step_acceptance
    from ..target_side.checkpoint import CheckpointSide
    from ..target_side.open import TeacherForcing, open_target

    server, target_path, draft_path, dump = opts.server, opts.target, opts.draft, opts.dump
    server_args, new_tokens, timeout, progress = opts.server_args, opts.new_tokens, opts.timeout, not opts.no_progress
    new_tokens_given = new_tokens is not None
    is_url = url_like(server)
    refused = not_eagle3(parse_server_args(server_args)) if server_args else None
    if refused:  # before any model loads or any request goes out
        raise DoctorError(f"--server-args: {refused}")
    check_profile_out(opts.profile_out)
    if target_path is not None and (dump is not None or opts.target_checkpoint is not None):
        raise DoctorError("--target runs the target here; --dump / --target-checkpoint are for a run without it "
                          "(the server as the target): give one or the other")
    if target_path is None and dump is None:
        raise DoctorError("without --target the server is the target: give --dump DIR, the directory the server "
                          "was started with in EAGLE3_CAPTURE_DUMP (readable from here)")
    torch_dtype = draft_dtype(opts.dtype, device, target_path is not None)
    notes: List[str] = []
    ck = CheckpointSide(opts.target_checkpoint)
    if target_path is not None:
        opened = open_target(target_path, ck, device=device, seed=opts.seed, progress=progress)
        side = opened.side
        ds = load_draft_side(draft_path, side.info, opts.taps, device, torch_dtype, opened.embed, opened.lm_head)
        tokenizer, vocab, arch = side.tokenizer, side.info.vocab_size, side.info.architecture
        positions = side.target.model  # its config's max_position_embeddings
        draft_vocab = ds.draft.arch.draft_vocab_size
    else:
        tokenizer = ck.tokenizer
        target_vocab, draft_vocab = draft_vocab_sizes(draft_path)
        vocab = ck.vocab_size or target_vocab
        arch = None
        if ck.config is not None:
            from ... import configs

            tcfg = configs.read_target_config(ck.config)
            arch = tcfg.architectures[0] if tcfg.architectures else None
        positions = ck.config  # its max_position_embeddings, when it has one
    prompts = read_prompts(opts.prompts, tokenizer, vocab_size=vocab)
    if is_url:
        if new_tokens is None:
            raise DoctorError("--new-tokens is needed with a server URL (max_new_tokens of each request)")
        from_server = server_flags(server, min(timeout, 30.0))
        steps = 0
        if server_args or from_server:  # the flags, checked before the server is asked for anything
            early = served_flags(server_args, arch, from_server, [])
            if draft_vocab is not None:
                check_speculative(*early, draft_vocab, "server flags")
            steps = early[0]
        check_positions(positions, prompts, new_tokens, steps, "--new-tokens")
        # the vocabulary, agreed by every source and the server itself before any id is sent (request_guard.py)
        own = (vocab, "--target's config") if target_path is not None else \
            (ck.vocab_size, f"--target-checkpoint {opts.target_checkpoint}'s config")
        drafts_target = ("the draft's config (its target's vocab_size)", draft_vocab_sizes(draft_path)[0])
        limits = server_limits(server, min(timeout, 30.0), *own, others=[drafts_target])
        vocab = limits.vocab
        for i, p in enumerate(prompts):  # nothing goes out before every request is known to be safe
            check_request(p, new_tokens, limits, f"prompt {i}")
        responses = generate(server, prompts, new_tokens, timeout, opts.concurrency, progress)
    else:
        from_server = None
        responses, new_tokens = _recorded(server, prompts, opts.prompts, new_tokens)
    check_outputs(responses, vocab, server)
    short = [i for i, r in enumerate(responses) if r.served.completion_tokens != new_tokens]
    if short:
        r = responses[short[0]]
        raise DoctorError(f"prompt {short[0]}: the server returned {r.served.completion_tokens} tokens, not "
                          f"max_new_tokens {new_tokens} (context limit or an early stop); the replay needs full-length "
                          "greedy responses with ignore_eos")
    flags = served_flags(server_args, arch, from_server, responses)
    S, k, D = flags
    if draft_vocab is not None:
        check_speculative(S, k, D, draft_vocab, "server flags")
    check_positions(positions, prompts, new_tokens, S,
                    "--new-tokens" if is_url or new_tokens_given else f"completion_tokens of --server {server}")
    if target_path is None:
        if is_url:  # the teacher-forced pass sends prompt + outputs (+ S + 1 tokens of the extension)
            for i, (p, r) in enumerate(zip(prompts, responses)):
                check_request(list(p) + list(r.output_ids), S + 1, limits,
                              f"prompt {i}'s teacher-forced request (the prompt + the server's {new_tokens} tokens)")
        forcing = TeacherForcing(server, prompts, [r.output_ids for r in responses], S, timeout,
                                 opts.concurrency) if is_url else None
        opened = open_target(None, ck, device=device, progress=progress, dump=dump, dump_flag="--dump",
                             vocab_size=vocab, server=forcing)
        side = opened.side
        if arch is None and server_args and not from_server and side.info.architecture:
            again = served_flags(server_args, side.info.architecture, None, responses)
            if tuple(again) != tuple(flags):
                raise DoctorError(f"--server-args resolve to {tuple(flags)} without the target's class and to "
                                  f"{tuple(again)} for {side.info.architecture}: give every --speculative-* number")
        ds = load_draft_side(draft_path, side.info, opts.taps, device, torch_dtype, opened.embed, opened.lm_head)
    res = SpecResolution(S, k, D, requested=flags)
    notes += ds.notes
    from ..fingerprint.stream import with_slot_holdings
    from ..target_side.dump_side import AnotherDeclaration

    try:
        runs = evaluate(side, ds.draft, prompts, ds.taps, S, new_tokens, res, opts.batch_size, progress, desc="offline")
    except AnotherDeclaration as e:  # the server runs another declaration: what do its slots hold?
        raise with_slot_holdings(e) from None
    notes += side.notes
    left_out = [r.bad for r in runs if r.bad is not None]
    kept = usable_runs(runs, f"--target {target_path}" if target_path else f"--dump {dump}")
    runs, responses = [runs[i] for i in kept], [responses[i] for i in kept]
    predicted = served_walks(runs, new_tokens)
    lossless, first, ties = [], None, []
    for i, (run, resp) in enumerate(zip(runs, responses)):
        own = run.expected if run.expected is not None else run.seq
        want = own[len(run.prompt): len(run.prompt) + new_tokens].tolist()
        target_ties, lossy = target_near_ties(side, kept[i], run, want, resp.output_ids)
        ties += target_ties
        lossless.append(not lossy)
        if lossy and first is None:
            first = (kept[i], lossy[0])
    explained = []
    if predicted and k == 1:
        ties, explained = draft_near_ties(runs, kept, responses, predicted, new_tokens, ties)
    on_tot, pr_tot = total([r.served for r in responses]), total(predicted)
    m = metrics(torch.cat([r.correct for r in runs], 0))
    on_steps, pr_steps = step_acceptance(on_tot.histogram, S), step_acceptance(pr_tot.histogram, S)
    if not has_histograms(responses):
        on_steps = [float("nan")] * S
        notes.append("the responses carry no spec_correct_drafts_histogram (newer SGLang names only): no per-step "
                     "figures online; the accept lengths are compared")
    rows = [StepRow(j + 1, on_steps[j], pr_steps[j], m.conditional[j] if k == 1 else float("nan"))
            for j in range(S)]
    ok, verdict = _verdict(lossless, first, rows, on_tot, pr_tot, opts.tolerance, responses, predicted, explained,
                           kept, ties)
    fp_json, fp_lines, fp = None, [], None
    if target_path is None:
        from ..fingerprint.stream import served_fingerprint

        fp = served_fingerprint(side, ds, ck.tensors, progress)
        fp_json, fp_lines = fp.to_json(), fp.lines()
        if fp.tap_problems:
            verdict = (verdict if not ok else "served accept length as predicted, but") + "; " + fp.tap_problems
            ok = False
    data = []  # bad rows: the data's fault, said before any verdict resting on the other rows
    if left_out:
        data.append(f"{len(left_out)} of {len(prompts)} prompt(s) left out, their taps holding bad rows "
                    f"({summary(left_out)})")
    if fp is not None and fp.bad_rows:
        data.append(f"rows of the dump: {summary(fp.bad_rows)}")
    if data:
        verdict = f"bad data: {'; '.join(data)} -- {BLAME}; on the rest: {verdict}"
        ok = False
    if k > 1:
        notes.append("eagle-topk > 1: the per-step shares are of the tree's accepted depth; 'all positions' is "
                     "given for chains only")
    rep = OnlineReport(server, side.source, draft_path, [repr(t) for t in ds.taps.taps], flags, new_tokens,
                       [r.served for r in responses], predicted, lossless, first, rows, opts.tolerance, verdict, ok,
                       m.tau(S), notes, fp_json, fp_lines, left_out, kept if left_out else None, near_ties=ties,
                       explained=explained)
    if opts.profile_out is not None:  # what the draft should get: the prediction, whatever the server got
        rep.profile = write_profile(opts.profile_out, "doctor online", flags, pr_tot.histogram, len(runs),
                                    draft_path, side.source)
    return rep


def target_near_ties(side, prompt: int, run, want: List[int], served: List[int]):
    """(near-ties of the target's verify token, the output positions that differ otherwise) for one prompt: a
    served token that is the teacher-forced pass's runner-up within the resolution is a near-tie (a server's
    stream target knows the runner-up and the gap; any other target side has none, so every difference stays)."""
    from ..replay.near_ties import NearTie, target_tie_gap

    diffs = [j for j, (a, b) in enumerate(zip(want, served)) if a != b]
    diffs += list(range(min(len(want), len(served)), max(len(want), len(served))))
    streamed = getattr(side, "streamed", None)
    sp = streamed[prompt] if streamed is not None and prompt < len(streamed) else None
    if sp is None or getattr(sp, "runner_up", None) is None or run.dtype is None:
        return [], diffs
    P, bound = len(run.prompt), target_tie_gap(run.dtype)
    ties, lossy = [], []
    for j in diffs:
        t = P - 1 + j
        if j < len(served) and t < sp.runner_up.numel() and int(sp.runner_up[t]) == served[j] \
                and float(sp.gap[t]) <= bound:
            ties.append(NearTie(prompt, j, "target", float(sp.gap[t]), None, (int(sp.forced[t]), served[j]),
                                served[j]))
        else:
            lossy.append(j)
    return ties, lossy


def draft_near_ties(runs, kept, responses, predicted, new_tokens: int, ties: list):
    """The draft's near-ties per prompt (those on the predicted walk; all of a prompt whose counts differ), and
    which differing prompts they explain."""
    from ..replay.near_ties import draft_ties, explains

    out, explained = list(ties), []
    for i, (run, resp, pred) in enumerate(zip(runs, responses, predicted)):
        if run.top_vals is None or run.accepted is None:
            continue
        found = draft_ties(kept[i], run.correct, run.accepted, run.top_vals, run.top_ids, run.labels, run.dtype,
                           new_tokens)
        on = resp.served
        differs = _counts(resp) != _counts(resp, pred)
        if differs:
            out += found
            if found and explains(on, run.accepted.tolist(), found, new_tokens):
                explained.append(kept[i])
        else:
            visited, a = set(), 0
            for n in pred.accepted:
                visited.add(a)
                a += n + 1
            out += [t for t in found if t.anchor in visited]
    return out, explained


def _counts(resp, served=None) -> tuple:
    """(verifies, histogram) of the response (or of ``served``, the prediction, read as the response can be: without
    the histogram when the response has none)."""
    s = resp.served if served is None else served
    return (s.verify_ct, list(s.histogram) if resp.histogram is not None else None)


def _verdict(lossless, first, rows, on_tot, pr_tot, tolerance: float, responses, predicted, explained, kept,
             ties) -> Tuple[bool, str]:
    """verdict_of, unless every difference between served and predicted counts is a listed near-tie's: then the
    prediction matches by the near-tie rule (served accept length within the tolerance)."""
    from ..sglang_model.responses import verdict_of

    differing = [kept[i] for i, (r, p) in enumerate(zip(responses, predicted)) if _counts(r) != _counts(r, p)]
    lo, lp = on_tot.served_accept_length, pr_tot.served_accept_length
    if (all(lossless) and differing and set(differing) <= set(explained)
            and math.isfinite(lo) and math.isfinite(lp) and abs(lo - lp) <= tolerance * max(1.0, lp)):
        return True, (f"matches by the near-tie rule: online {lo:.3f} = {on_tot.completion_tokens} / "
                      f"{on_tot.verify_ct}, predicted {lp:.3f} = {pr_tot.completion_tokens} / {pr_tot.verify_ct}; "
                      f"prompt(s) {differing} differ only where listed near-ties could have gone the other way")
    ok, verdict = verdict_of(lossless, first, rows, on_tot, pr_tot, tolerance)
    n_target = sum(t.side == "target" for t in ties)
    if ok and n_target:
        verdict += f" ({n_target} served token(s) at near-ties of the target's logits, listed)"
    return ok, verdict


def exit_code(rep: OnlineReport) -> int:
    return EXIT_OK if rep.ok else EXIT_FINDINGS


__all__ = ["DESCRIPTION", "Options", "run", "OnlineReport", "served_flags", "render", "exit_code", "target_near_ties",
           "draft_near_ties"]
