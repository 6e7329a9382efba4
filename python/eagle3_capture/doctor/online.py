"""``doctor online``: a running SGLang server's speculative figures beside the doctor's replay of the same loop.

The prompts go to the server's native ``/generate`` as token ids (temperature 0, ``ignore_eos``,
``max_new_tokens`` N), or come from a JSONL file of recorded responses (``{"input_ids", "output_ids",
"meta_info"}`` a line). Each response's ``meta_info`` gives ``completion_tokens``, ``spec_verify_ct`` and
``spec_correct_drafts_histogram``. Offline, the target writes its greedy continuation of the same prompts and
:mod:`.serving` replays SGLang's loop for the server's flags (``accept`` does the same). Then:

1. the outputs must equal the target's greedy continuation, or the comparison means nothing (not lossless:
   sampling, another dtype, another target);
2. per draft step k, the server's share of verifies that accepted step k given steps 1..k-1, against the same share
   in the replay; online below offline at a step means the draft sees other inputs online than offline (the
   capture, or the draft side);
3. the served accept length, online against predicted.

Exit 0 when everything matches within ``--tolerance``, 1 on a mismatch, 2 on bad input or an unreachable server.
"""
from __future__ import annotations

import http.client
import json
import math
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from .bounds import MAX_TIMEOUT_S, check_positions, check_speculative
from .common import DoctorError, read_prompts, write_json
from .responses import (DUMP_HINT, Response, StepRow, check_counts, has_histograms, parse_response,  # noqa: F401
                        read_recorded, verdict_of)
from .server_url import is_url as url_like, server_source
from .serving import Served, step_acceptance, total


def _post_json(url: str, body: dict, timeout: float) -> object:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"},
                                 method="POST")
    return _open_json(req, url, timeout)


def _open_json(req, url: str, timeout: float) -> object:
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            data = r.read()
    except urllib.error.HTTPError as e:
        detail = e.read()[:300].decode("utf-8", "replace")
        raise DoctorError(f"--server {url}: HTTP {e.code} {e.reason}: {detail}") from None
    except urllib.error.URLError as e:
        raise DoctorError(f"--server {url}: cannot reach the server ({e.reason})") from None
    except (TimeoutError, OSError) as e:
        raise DoctorError(f"--server {url}: no answer within {timeout:g} s ({e})") from None
    except (http.client.HTTPException, ValueError) as e:  # a connection cut mid-answer, a malformed redirect
        raise DoctorError(f"--server {url}: no usable answer ({type(e).__name__}: {e})") from None
    try:
        return json.loads(data)
    except json.JSONDecodeError:
        raise DoctorError(f"--server {url}: the answer is not JSON: {data[:120]!r}") from None


def server_flags(base: str, timeout: float) -> Optional[Tuple[int, int, int]]:
    """(num_steps, eagle_topk, num_draft_tokens) as the server resolved them (``/server_info``), or None when the
    server does not say."""
    req = urllib.request.Request(base.rstrip("/") + "/server_info", method="GET")
    try:
        info = _open_json(req, base, timeout)
    except DoctorError:
        return None
    if not isinstance(info, dict):
        return None
    vals = [info.get(k) for k in ("speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens")]
    if all(isinstance(v, int) and not isinstance(v, bool) for v in vals):
        return tuple(vals)
    return None


def fetch(base: str, prompts: Sequence[List[int]], new_tokens: int, timeout: float, concurrency: int,
          progress: bool) -> List[Response]:
    """Send each prompt to ``<base>/generate`` (greedy, ignore_eos, max_new_tokens); responses in prompt order."""
    url = base.rstrip("/") + "/generate"
    sampling = {"temperature": 0, "max_new_tokens": int(new_tokens), "ignore_eos": True}

    def one(i: int) -> Response:
        obj = _post_json(url, {"input_ids": list(prompts[i]), "sampling_params": sampling}, timeout)
        if isinstance(obj, list) and len(obj) == 1:
            obj = obj[0]
        return parse_response(obj, f"--server {url}, prompt {i}", input_ids=list(prompts[i]))

    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(prompts), desc="server", unit="prompt", leave=False)
    out: List[Optional[Response]] = [None] * len(prompts)
    with ThreadPoolExecutor(max_workers=max(1, min(concurrency, len(prompts)))) as pool:
        futures = {pool.submit(one, i): i for i in range(len(prompts))}
        try:
            for fut in futures:
                out[futures[fut]] = fut.result()
                if bar is not None:
                    bar.update(1)
        finally:
            for fut in futures:
                fut.cancel()
            if bar is not None:
                bar.close()
    return out


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

    def to_json(self) -> dict:
        s, k, d = self.flags
        return {
            "server": self.server, "target": self.target, "draft": self.draft, "taps": self.taps,
            "server_flags": {"num_steps": s, "eagle_topk": k, "num_draft_tokens": d}, "max_new_tokens": self.new_tokens,
            "verdict": self.verdict, "ok": self.ok, "tolerance": self.tolerance,
            "online": {**total(self.online).to_json(),
                       "per_prompt": [{"prompt": i, **o.to_json()} for i, o in enumerate(self.online)]},
            "predicted": {**total(self.predicted).to_json(),
                          "per_prompt": [{"prompt": i, **o.to_json()} for i, o in enumerate(self.predicted)]},
            "lossless": self.lossless, "first_difference": self.first_difference,
            "step_acceptance": [{"step": r.step, "online": _r(r.online), "offline": _r(r.offline),
                                 "offline_all_positions": _r(r.offline_all)} for r in self.steps],
            "tau": round(self.tau, 6), "notes": self.notes,
        }


def _r(v: float):
    return None if v is None or math.isnan(v) else round(v, 6)


def _flags_from(server_args: Optional[str], arch: Optional[str], from_server, responses: Sequence[Response]):
    from .server_args import not_eagle3, parse_server_args, resolve_speculative

    given = None
    if server_args:
        parsed = parse_server_args(server_args)
        refused = not_eagle3(parsed)
        if refused:
            raise DoctorError(f"--server-args: {refused}")
        res = resolve_speculative(parsed, arch)
        if res.error:
            raise DoctorError(f"--server-args {server_args!r}: SGLang 0.5.23 refuses them ({res.error})")
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


def run_online(server: str, prompts_path: str, target_path: str, draft_path: str, server_args: Optional[str] = None,
               new_tokens: Optional[int] = None, taps: Optional[str] = None, batch_size: int = 8,
               device: str = "cpu", timeout: float = 600.0, concurrency: int = 8, tolerance: float = 0.02,
               out_json: Optional[str] = None, progress: bool = True, seed: int = 0) -> OnlineReport:
    from .accept import evaluate, load_pair, metrics, served_walks
    from .server_args import SpecResolution, not_eagle3, parse_server_args

    if not 0 <= tolerance < 1:
        raise DoctorError(f"--tolerance {tolerance}: expected a share in [0, 1)")
    if timeout <= 0:
        raise DoctorError(f"--timeout {timeout}: expected a positive number of seconds")
    if concurrency < 1:
        raise DoctorError(f"--concurrency {concurrency}: expected at least 1")
    if batch_size < 1:
        raise DoctorError(f"--batch-size {batch_size}: expected at least 1")
    if new_tokens is not None and new_tokens < 2:
        raise DoctorError(f"--new-tokens {new_tokens}: need at least 2")
    new_tokens_given = new_tokens is not None
    if timeout > MAX_TIMEOUT_S:
        raise DoctorError(f"--timeout {timeout:g}: at most {MAX_TIMEOUT_S:g} s (a day) per response")
    is_url = url_like(server)
    server = server_source(server)
    refused = not_eagle3(parse_server_args(server_args)) if server_args else None
    if refused:  # before any model loads or any request goes out
        raise DoctorError(f"--server-args: {refused}")
    target, draft, spec, declared, tcfg, notes = load_pair(target_path, draft_path, taps, device, seed, progress)
    arch = tcfg.architectures[0] if tcfg.architectures else None
    prompts = read_prompts(prompts_path, target.tokenizer, vocab_size=target.vocab_size)
    if is_url:
        if new_tokens is None:
            raise DoctorError("--new-tokens is needed with a server URL (max_new_tokens of each request)")
        if new_tokens < 2:
            raise DoctorError(f"--new-tokens {new_tokens}: need at least 2")
        from_server = server_flags(server, min(timeout, 30.0))
        steps = 0
        if server_args or from_server:  # the flags, checked before the server is asked for anything
            early = _flags_from(server_args, arch, from_server, [])
            check_speculative(*early, draft.arch.draft_vocab_size, "server flags")
            steps = early[0]
        check_positions(target.model, prompts, new_tokens, steps, "--new-tokens")
        responses = fetch(server, prompts, new_tokens, timeout, concurrency, progress)
    else:
        from_server = None
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
        if new_tokens < 2:
            raise DoctorError(f"--new-tokens {new_tokens}: need at least 2")
    short = [i for i, r in enumerate(responses) if r.served.completion_tokens != new_tokens]
    if short:
        r = responses[short[0]]
        raise DoctorError(f"prompt {short[0]}: the server returned {r.served.completion_tokens} tokens, not "
                          f"max_new_tokens {new_tokens} (context limit or an early stop); the replay needs full-length "
                          "greedy responses with ignore_eos")
    flags = _flags_from(server_args, arch, from_server, responses)
    S, k, D = flags
    check_speculative(S, k, D, draft.arch.draft_vocab_size, "server flags")
    check_positions(target.model, prompts, new_tokens, S,
                    "--new-tokens" if is_url or new_tokens_given else f"completion_tokens of --server {server}")
    res = SpecResolution(S, k, D, requested=flags)
    runs = evaluate(target, draft, prompts, spec, S, new_tokens, res, batch_size, device, progress, desc="offline")
    predicted = served_walks(runs, new_tokens)
    lossless, first = [], None
    for i, (run, resp) in enumerate(zip(runs, responses)):
        want = run.seq[len(run.prompt): len(run.prompt) + new_tokens].tolist()
        same = want == resp.output_ids
        lossless.append(same)
        if not same and first is None:
            pos = next((j for j, (a, b) in enumerate(zip(want, resp.output_ids)) if a != b),
                       min(len(want), len(resp.output_ids)))
            first = (i, pos)
    on_tot, pr_tot = total([r.served for r in responses]), total(predicted)
    m = metrics(torch.cat([r.correct for r in runs], 0))
    on_steps, pr_steps = step_acceptance(on_tot.histogram, S), step_acceptance(pr_tot.histogram, S)
    if not has_histograms(responses):
        on_steps = [float("nan")] * S
        notes.append("the responses carry no spec_correct_drafts_histogram (newer SGLang names only): no per-step "
                     "figures online; the accept lengths are compared")
    rows = [StepRow(j + 1, on_steps[j], pr_steps[j], m.conditional[j] if k == 1 else float("nan"))
            for j in range(S)]
    ok, verdict = verdict_of(lossless, first, rows, on_tot, pr_tot, tolerance)
    if k > 1:
        notes.append("eagle-topk > 1: the per-step shares are of the tree's accepted depth; 'all positions' is "
                     "given for chains only")
    rep = OnlineReport(server, target.source, draft_path, [repr(t) for t in spec.taps], flags, new_tokens,
                       [r.served for r in responses], predicted, lossless, first, rows, tolerance, verdict, ok,
                       m.tau(S), notes)
    if out_json:
        write_json(out_json, rep.to_json())
    return rep


def render(rep: OnlineReport) -> str:
    from .accept import SERVED_MEANS

    S, k, D = rep.flags
    on_tot, pr_tot = total(rep.online), total(rep.predicted)
    lines = [f"server {rep.server}", f"target {rep.target}", f"draft  {rep.draft} (taps {rep.taps})",
             f"{len(rep.online)} prompts, max_new_tokens {rep.new_tokens}, num-steps {S}, eagle-topk {k}, "
             f"num-draft-tokens {D}",
             f"outputs equal the target's greedy continuation: {sum(rep.lossless)} of {len(rep.lossless)} prompts",
             "", "prompt  tokens  verifies online / predicted  accept length online / predicted"]
    for i, (o, p) in enumerate(zip(rep.online, rep.predicted)):
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
    lines += [f"note: {n}" for n in rep.notes]
    lines += ["", f"verdict: {rep.verdict}"]
    return "\n".join(lines)


def _fmt(v: float) -> str:
    return "-" if v is None or math.isnan(v) else f"{v:.3f}"


__all__ = ["Response", "parse_response", "read_recorded", "fetch", "server_flags", "OnlineReport", "StepRow",
           "verdict_of", "run_online", "render"]
