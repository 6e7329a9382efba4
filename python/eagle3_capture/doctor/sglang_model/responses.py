"""Responses of a SGLang server for ``doctor online``: one ``/generate`` result (or a recorded line of them) parsed
into a :class:`Response`, its counts checked against what SGLang's counters can report, and the verdict that
compares the server's figures with the offline replay's.

What SGLang counts (read in 0.5.23's source) and therefore what always holds:

* ``managers/scheduler_components/batch_result_processor.py``: for each verify of a request that is not finished
  (nor retracted), ``spec_verify_ct += 1``, ``spec_num_correct_drafts += n`` and
  ``spec_correct_drafts_histogram[n] += 1``, n = the draft tokens that verify accepted (``Req.
  update_spec_correct_drafts_histogram`` grows the list to n + 1 entries as needed). n is at most num-steps for a
  chain, and at most min(num-steps, num-draft-tokens - 1) for a tree (the accepted path of a tree of
  num-draft-tokens - 1 nodes, num-steps deep).
* ``Req.output_ids``: the prefill appends one token (and the prefill after each retraction one more: the output so
  far is kept and re-prefilled), each verify its n accepted drafts and the bonus token; ``completion_tokens`` is
  ``len(output_ids)`` cut at the finish (``finished_len``: max_new_tokens, or a stop token inside the last run).
  Only the last run can be cut: a request that is finished is not verified again.
* ``managers/tokenizer_manager.py: _calculate_spec_decoding_metrics`` writes, only when spec_verify_ct > 0:
  ``spec_verify_ct``, ``spec_num_correct_drafts``, ``spec_num_proposed_drafts = spec_verify_ct *
  (num_draft_tokens - 1)``, ``spec_accept_length = completion_tokens / spec_verify_ct``, ``spec_accept_rate =
  correct / proposed``, and the histogram when it is not empty. Newer SGLang keeps ``spec_num_correct_drafts`` /
  ``spec_num_proposed_drafts`` and drops ``spec_verify_ct`` / the histogram after one release of aliases: a
  response with the newer names only is read with verifies = proposed / (num-draft-tokens - 1), and then has no
  per-step figures.

So with C = completion_tokens, V = verifies, A = accepted draft tokens, R = num_retractions, m = the most one
verify accepts, n_last = what the last verify accepted (at most the largest n with histogram[n] > 0):

    sum(histogram) = V          sum(n * histogram[n]) = A = spec_num_correct_drafts       histogram[n] = 0 for n > m
    1 + R + V + A - n_last  <=  C  <=  1 + R + V + A        (so V >= 1 when C > 1 + R, and V <= C)
    spec_num_proposed_drafts = V * (num_draft_tokens - 1)    A <= V * m
    spec_accept_length = C / V                               spec_accept_rate = A / spec_num_proposed_drafts

A response that breaks one of these is not a server's answer to these flags (a hand-edited file, another
server's figures, other flags): a DoctorError naming the record and the field, never a verdict about the capture.
(The doctor's requests carry no grammar: a grammar can cut a run without finishing the request, which the lower
bound above does not allow for.)
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from ..common import DoctorError, jsonl_records, read_text, require_file, shown
from .serving import Served

DUMP_HINT = "run the server with EAGLE3_CAPTURE_DUMP=<dir> and `eagle3-capture doctor fingerprint`"

# meta_info names: those SGLang 0.5.23 writes (read in its source), and the newer ones it writes beside them
# (aliases for one release)
VERIFY_CT, HISTOGRAM = "spec_verify_ct", "spec_correct_drafts_histogram"
CORRECT, PROPOSED = "spec_num_correct_drafts", "spec_num_proposed_drafts"
ACCEPT_LENGTH, ACCEPT_RATE = "spec_accept_length", "spec_accept_rate"
SPEC_FIELDS = (VERIFY_CT, HISTOGRAM, CORRECT, PROPOSED, ACCEPT_LENGTH, ACCEPT_RATE)
RATIO_TOLERANCE = 1e-6  # spec_accept_length / _rate are floats; a JSON round trip keeps them exact, a rounding tool not


@dataclass
class Response:
    """One prompt's response as the server reported it. ``served.verify_ct`` is None until :func:`check_counts`
    derives it, for a response that gives the newer names only (``spec_num_proposed_drafts``)."""

    input_ids: List[int]
    output_ids: List[int]
    served: Served
    num_proposed_drafts: Optional[int] = None
    where: str = ""                         # "--server FILE, line N" / "--server URL, prompt i": names the record
    histogram: Optional[List[int]] = None   # None: the response has no spec_correct_drafts_histogram
    num_correct_drafts: Optional[int] = None
    accept_length: Optional[float] = None
    accept_rate: Optional[float] = None
    retractions: int = 0
    verify_source: str = ""                 # set when the verify count is derived (from spec_num_proposed_drafts)

    @property
    def completion_tokens(self) -> int:
        return self.served.completion_tokens


def _int_list(v, what: str) -> List[int]:
    if not isinstance(v, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        raise DoctorError(f"{what}: expected a list of integers, got {shown(v)}")
    return list(v)


def _count(meta: dict, key: str, what: str) -> Optional[int]:
    """meta_info[key] as a non-negative integer (None when absent)."""
    if key not in meta:
        return None
    v = meta[key]
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise DoctorError(f"{what}: meta_info {key} must be a non-negative integer, got {shown(v)}")
    return v


def _ratio(meta: dict, key: str, what: str) -> Optional[float]:
    if key not in meta:
        return None
    v = meta[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise DoctorError(f"{what}: meta_info {key} must be a finite non-negative number, got {shown(v)}")
    return float(v)


def parse_response(obj, what: str, input_ids: Optional[List[int]] = None) -> Response:
    """A Response from a ``/generate`` result (or a recorded line); DoctorError naming the record and the field on
    anything else, and on counts that no server can report (the relations in the module docstring that do not
    depend on the server's flags; :func:`check_counts` checks the rest)."""
    if not isinstance(obj, dict):
        raise DoctorError(f"{what}: expected a JSON object, got {type(obj).__name__}")
    if "error" in obj and "meta_info" not in obj:
        raise DoctorError(f"{what}: the server answered with an error: {shown(obj['error'], 200)}")
    ids = input_ids if input_ids is not None else _int_list(obj.get("input_ids"), f"{what}: 'input_ids'")
    if not ids:
        raise DoctorError(f"{what}: 'input_ids' is empty (a request has at least one prompt token)")
    out = _int_list(obj.get("output_ids"), f"{what}: 'output_ids' (SGLang's native /generate returns them; a "
                                            "recorded file must keep them)")
    meta = obj.get("meta_info")
    if not isinstance(meta, dict):
        raise DoctorError(f"{what}: no 'meta_info' object")
    if not any(k in meta for k in SPEC_FIELDS):
        raise DoctorError(f"{what}: meta_info has none of {', '.join(SPEC_FIELDS)}: the server does not run "
                          "speculative decoding (launch it with --speculative-algorithm EAGLE3 and the draft)")
    c = _count(meta, "completion_tokens", what)
    if c is None:
        raise DoctorError(f"{what}: meta_info has no completion_tokens")
    v, correct, proposed = (_count(meta, k, what) for k in (VERIFY_CT, CORRECT, PROPOSED))
    hist = None
    if HISTOGRAM in meta:
        hist = _int_list(meta[HISTOGRAM], f"{what}: meta_info {HISTOGRAM}")
        if any(x < 0 for x in hist):
            raise DoctorError(f"{what}: meta_info {HISTOGRAM} {shown(hist)} has a negative count")
    length, rate = _ratio(meta, ACCEPT_LENGTH, what), _ratio(meta, ACCEPT_RATE, what)
    retractions = _count(meta, "num_retractions", what) or 0
    prompt_tokens = _count(meta, "prompt_tokens", what)
    if prompt_tokens is not None and prompt_tokens != len(ids):
        raise DoctorError(f"{what}: meta_info prompt_tokens {prompt_tokens}, but the prompt has {len(ids)} tokens "
                          "(input_ids): the response is not to this prompt")
    if len(out) != c:
        raise DoctorError(f"{what}: 'output_ids' has {len(out)} tokens but meta_info completion_tokens is {c}; "
                          "SGLang reports completion_tokens = the output's length")
    if v is None and proposed is None:
        raise DoctorError(f"{what}: meta_info has neither {VERIFY_CT} nor {PROPOSED}: the number of verifies is "
                          "unknown")
    r = Response(ids, out, Served(c, v, list(hist or [])), proposed, what, hist, correct, length, rate, retractions)
    if v is not None:
        _check_relations(r, None)
    return r


def _check_relations(r: Response, flags: Optional[Tuple[int, int, int]]) -> None:
    """The relations of the module docstring for one response whose verify count is known; the ones that need the
    server's flags only when ``flags`` (num_steps, eagle_topk, num_draft_tokens) is given."""
    w, c, v, hist, R = r.where, r.served.completion_tokens, r.served.verify_ct, r.histogram, r.retractions
    m = _max_accept(flags) if flags is not None else None
    verifies = r.verify_source or f"{VERIFY_CT} {v}"
    counts = verifies + (f", {HISTOGRAM} {shown(hist)}" if hist is not None else "")
    extra = f" + {R} retraction prefill(s)" if R else ""
    if hist is not None and sum(hist) != v:
        raise DoctorError(f"{w}: meta_info {HISTOGRAM} {shown(hist)} counts {sum(hist)} verifies, but {verifies}")
    a = sum(n * x for n, x in enumerate(hist)) if hist is not None else r.num_correct_drafts
    if hist is not None and r.num_correct_drafts is not None and r.num_correct_drafts != a:
        raise DoctorError(f"{w}: meta_info {CORRECT} {r.num_correct_drafts}, but {HISTOGRAM} {shown(hist)} "
                          f"accepted {a} draft tokens in all")
    if flags is not None:
        S, k, D = flags
        if hist is not None:
            beyond = [(n, x) for n, x in enumerate(hist) if x and n > m]
            if beyond:
                n, x = beyond[-1]
                raise DoctorError(f"{w}: meta_info {HISTOGRAM} {shown(hist)} has {x} verifies that accepted {n} "
                                  f"draft tokens, but num-steps {S}, eagle-topk {k}, num-draft-tokens {D} accept at "
                                  f"most {m} per verify: these are not this server's flags, or not a server's figures")
        if a is not None and a > v * m:
            raise DoctorError(f"{w}: meta_info {CORRECT} {a} for {verifies} is more than num-steps {S}, eagle-topk "
                              f"{k}, num-draft-tokens {D} allow ({m} per verify)")
        if r.num_proposed_drafts is not None and r.num_proposed_drafts != v * (D - 1):
            raise DoctorError(f"{w}: meta_info {PROPOSED} {r.num_proposed_drafts} for {verifies} means "
                              + (f"num-draft-tokens {r.num_proposed_drafts / v + 1:g}" if v else "no verifies")
                              + f", not {D} (SGLang reports verifies x (num-draft-tokens - 1))")
    if c == 0:
        raise DoctorError(f"{w}: meta_info completion_tokens 0: a speculative server's response holds at least the "
                          "prefill's token (the responses must be to max_new_tokens >= 2, with ignore_eos)")
    if v == 0:
        if c > 1 + R:
            raise DoctorError(f"{w}: {verifies} with completion_tokens {c}: after the prefill's token{extra} every "
                              "token comes from a verify (and SGLang writes the speculative fields only after one)")
        if a:
            raise DoctorError(f"{w}: meta_info {CORRECT} {a} with {verifies}: drafts are accepted by verifies")
        return
    if c < 1 + R + v:
        raise DoctorError(f"{w}: {verifies} with completion_tokens {c}: more verifies than a server makes for {c} "
                          f"tokens (after the prefill's token{extra}, each verify puts out at least one token that "
                          "stays: only the last run is cut, and not to nothing)")
    if a is None:  # neither a histogram nor spec_num_correct_drafts: each verify puts out 1 .. 1 + m tokens
        if m is not None and c > 1 + R + v * (1 + m):
            raise DoctorError(f"{w}: meta_info completion_tokens {c} is more than {v} verifies of at most {m} draft "
                              f"tokens + 1 put out after the prefill's token{extra}")
    else:
        top = 1 + R + v + a
        n_last = max((n for n, x in enumerate(hist) if x), default=0) if hist is not None else a
        if m is not None:
            n_last = min(n_last, m)
        with_a = counts + (f", {CORRECT} {a}" if hist is None else "")
        if c > top:
            raise DoctorError(f"{w}: meta_info completion_tokens {c} is more than a server puts out with {with_a}: "
                              f"the prefill's token{extra} + {v} verifies' bonus tokens + {a} accepted draft tokens "
                              f"= {top}")
        if c < top - n_last:
            raise DoctorError(f"{w}: meta_info completion_tokens {c} is fewer than {with_a} put out: only the last "
                              f"verify's run can be cut, so at least {top - n_last} tokens (the prefill's{extra} + "
                              f"{v} bonus tokens + {a} accepted draft tokens - the last verify's at most {n_last})")
    if r.accept_length is not None and not _close(r.accept_length, c / v):
        raise DoctorError(f"{w}: meta_info {ACCEPT_LENGTH} {r.accept_length!r} is not completion_tokens / verifies "
                          f"= {c} / {v} = {c / v:.6g}")
    if flags is not None and r.accept_rate is not None and a is not None:
        D = flags[2]
        if not _close(r.accept_rate, a / (v * (D - 1))):
            raise DoctorError(f"{w}: meta_info {ACCEPT_RATE} {r.accept_rate!r} is not accepted / proposed draft "
                              f"tokens = {a} / {v * (D - 1)} = {a / (v * (D - 1)):.6g}")


def _close(x: float, want: float) -> bool:
    return abs(x - want) <= RATIO_TOLERANCE * max(1.0, abs(want))


def _max_accept(flags: Tuple[int, int, int]) -> int:
    """The most draft tokens one verify can accept: a chain of num_steps, or a tree's path (num_steps deep, at most
    num_draft_tokens - 1 nodes)."""
    S, k, D = flags
    return S if k == 1 else min(S, D - 1)


def read_recorded(path: str) -> List[Response]:
    """Recorded /generate responses, one JSON object a line; two for the same prompt are an error naming both
    lines (which one the server meant cannot be told)."""
    p = require_file(path, "--server recorded responses")
    out: List[Response] = []
    first: Dict[Tuple[int, ...], int] = {}
    for n, obj in jsonl_records(read_text(p, f"--server {p}"), f"--server {p}"):
        r = parse_response(obj, f"--server {p}, line {n}")
        key = tuple(r.input_ids)
        if key in first:
            raise DoctorError(f"--server {p}: lines {first[key]} and {n} are both responses to the prompt "
                              f"{shown(r.input_ids, 60)}; keep the one the server gave for this run")
        first[key] = n
        out.append(r)
    if not out:
        raise DoctorError(f"--server {p}: no responses in it")
    return out


def check_counts(responses: Sequence[Response], flags: Tuple[int, int, int]) -> None:
    """DoctorError when a response's counts cannot come from a server running these (num_steps, eagle_topk,
    num_draft_tokens): every relation of the module docstring. A response with the newer names only gets its
    verify count here (spec_num_proposed_drafts / (num_draft_tokens - 1))."""
    S, k, D = flags
    if S < 1 or k < 1 or D < 2:
        raise DoctorError(f"server flags num-steps {S}, eagle-topk {k}, num-draft-tokens {D}: no draft runs (need "
                          "num-steps >= 1, eagle-topk >= 1, num-draft-tokens >= 2)")
    for r in responses:
        if r.served.verify_ct is None:
            p = r.num_proposed_drafts
            if p % (D - 1):
                raise DoctorError(f"{r.where}: meta_info {PROPOSED} {p} is not a multiple of num-draft-tokens - 1 = "
                                  f"{D - 1}: not a server's figure for these flags")
            r.served.verify_ct = p // (D - 1)
            r.verify_source = f"{r.served.verify_ct} verifies ({PROPOSED} {p} / (num-draft-tokens {D} - 1))"
        if r.retractions:
            _check_relations(r, flags)
            raise DoctorError(f"{r.where}: meta_info num_retractions {r.retractions}: the server retracted the "
                              "request (out of KV cache) and prefilled it again, a walk the replay does not model; "
                              "record it again with fewer requests at once")
        _check_relations(r, flags)


def has_histograms(responses: Sequence[Response]) -> bool:
    """Whether every response carries a histogram (else there are no per-step figures online)."""
    return all(r.histogram is not None for r in responses)


@dataclass
class StepRow:
    step: int
    online: float
    offline: float
    offline_all: float   # conditional accuracy over every anchor (accept's table)


def verdict_of(lossless: Sequence[bool], first_difference, steps: Sequence[StepRow], online: Served,
               predicted: Served, tolerance: float) -> Tuple[bool, str]:
    if not all(lossless):
        p, pos = first_difference
        return False, (f"outputs differ from the target's greedy continuation ({lossless.count(False)} of "
                       f"{len(lossless)} prompts; first at prompt {p}, output token {pos}): not lossless "
                       "(sampling, dtype, or a different target); the acceptance figures below are not comparable")
    for r in steps:
        if not math.isnan(r.online) and not math.isnan(r.offline) and r.offline - r.online > tolerance:
            return False, (f"online below offline by {r.offline - r.online:.3f} at step {r.step} ({r.online:.3f} vs "
                           f"{r.offline:.3f}): the draft sees other inputs online than offline -- capture or "
                           f"draft-side mismatch; {DUMP_HINT}")
    for r in steps:
        if not math.isnan(r.online) and not math.isnan(r.offline) and r.online - r.offline > tolerance:
            return False, (f"online above offline by {r.online - r.offline:.3f} at step {r.step} ({r.online:.3f} vs "
                           f"{r.offline:.3f}): the server's draft or flags are not the ones given here")
    lo, lp = online.served_accept_length, predicted.served_accept_length
    if not (math.isfinite(lo) and math.isfinite(lp)):  # no verifies: check_counts refuses such responses first
        raise DoctorError(f"no accept length to compare: {online.verify_ct} verifies online, {predicted.verify_ct} "
                          "predicted")
    if abs(lo - lp) > tolerance * max(1.0, lp):
        if all(math.isnan(r.online) for r in steps):
            return False, (f"served accept length online {lo:.3f} {'below' if lo < lp else 'above'} predicted "
                           f"{lp:.3f} (the responses give no per-step figures): "
                           + ("the draft sees other inputs online than offline -- capture or draft-side mismatch; "
                              f"{DUMP_HINT}" if lo < lp else "the server's draft or flags are not the ones given here"))
        return False, (f"served accept length online {lo:.3f} vs predicted {lp:.3f}: the walks differ although the "
                       "per-step shares agree within the tolerance; compare the per-prompt rows")
    return True, (f"matches: online {lo:.3f} = {online.completion_tokens} / {online.verify_ct}, predicted {lp:.3f} = "
                  f"{predicted.completion_tokens} / {predicted.verify_ct}")


__all__ = ["DUMP_HINT", "SPEC_FIELDS", "Response", "parse_response", "read_recorded", "check_counts", "has_histograms",
           "StepRow", "verdict_of"]
