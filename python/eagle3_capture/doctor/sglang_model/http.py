"""``doctor online``: a running SGLang server's speculative figures beside the doctor's replay of the same loop.

The prompts go to the server's native ``/generate`` as token ids (temperature 0, ``ignore_eos``,
``max_new_tokens`` N), or come from a JSONL file of recorded responses (``{"input_ids", "output_ids",
"meta_info"}`` a line). Each response's ``meta_info`` gives ``completion_tokens``, ``spec_verify_ct`` and
``spec_correct_drafts_histogram``. Offline, the target side (a transformers model with ``--target``, or, without
it, the server itself: its teacher-forced pass and residual-stream dump, :mod:`.target_server`) gives the greedy
continuation of the same prompts and the draft's taps, and :mod:`.serving` replays SGLang's loop for the server's
flags (``accept`` does the same; the run itself is :mod:`.online_run`). Then:

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
from typing import List, Optional, Sequence, Tuple

from ..common import DoctorError
from .responses import (DUMP_HINT, Response, StepRow, check_counts, has_histograms, parse_response,  # noqa: F401
                        read_recorded, verdict_of)
from .serving import Served, total


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
    fingerprint: Optional[dict] = None          # the served slots against the server's stream (no --target)
    fingerprint_lines: List[str] = field(default_factory=list)

    def to_json(self) -> dict:
        s, k, d = self.flags
        return {"fingerprint": self.fingerprint, **self._fields(s, k, d)}

    def _fields(self, s, k, d) -> dict:
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
    from .flag_rules import not_eagle3, parse_server_args, resolve_speculative

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


def render(rep: OnlineReport) -> str:
    from ..commands.accept import SERVED_MEANS

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
    if rep.fingerprint_lines:
        lines += [""] + rep.fingerprint_lines
    lines += [f"note: {n}" for n in rep.notes]
    lines += ["", f"verdict: {rep.verdict}"]
    return "\n".join(lines)


def _fmt(v: float) -> str:
    return "-" if v is None or math.isnan(v) else f"{v:.3f}"


__all__ = ["Response", "parse_response", "read_recorded", "fetch", "server_flags", "OnlineReport", "StepRow",
           "verdict_of", "render"]
