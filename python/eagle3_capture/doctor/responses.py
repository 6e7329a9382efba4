"""Responses of a SGLang server for ``doctor online``: one ``/generate`` result (or a recorded line of them) parsed
into a :class:`Response`, checked against what SGLang's counters can report, and the verdict that compares the
server's figures with the offline replay's.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

from .common import DoctorError, jsonl_records, read_text, require_file
from .serving import Served

DUMP_HINT = "run the server with EAGLE3_CAPTURE_DUMP=<dir> and `eagle3-capture doctor fingerprint`"


@dataclass
class Response:
    """One prompt's response as the server reported it."""

    input_ids: List[int]
    output_ids: List[int]
    served: Served
    num_proposed_drafts: Optional[int] = None


def _int_list(v, what: str) -> List[int]:
    if not isinstance(v, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        raise DoctorError(f"{what}: expected a list of integers, got {str(v)[:80]!r}")
    return list(v)


def parse_response(obj, what: str, input_ids: Optional[List[int]] = None) -> Response:
    """A Response from a ``/generate`` result (or a recorded line); DoctorError naming the field on anything else."""
    if not isinstance(obj, dict):
        raise DoctorError(f"{what}: expected a JSON object, got {type(obj).__name__}")
    if "error" in obj and "meta_info" not in obj:
        raise DoctorError(f"{what}: the server answered with an error: {str(obj['error'])[:200]}")
    ids = input_ids if input_ids is not None else _int_list(obj.get("input_ids"), f"{what}: 'input_ids'")
    out = _int_list(obj.get("output_ids"), f"{what}: 'output_ids' (SGLang's native /generate returns them; a "
                                            "recorded file must keep them)")
    meta = obj.get("meta_info")
    if not isinstance(meta, dict):
        raise DoctorError(f"{what}: no 'meta_info' object")
    if "spec_verify_ct" not in meta:
        raise DoctorError(f"{what}: meta_info has no spec_verify_ct: the server does not run speculative decoding "
                          "(launch it with --speculative-algorithm EAGLE3 and the draft)")
    fields = {}
    for key in ("completion_tokens", "spec_verify_ct"):
        v = meta.get(key)
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise DoctorError(f"{what}: meta_info '{key}' must be a non-negative integer, got {v!r}")
        fields[key] = v
    hist = _int_list(meta.get("spec_correct_drafts_histogram", []), f"{what}: meta_info 'spec_correct_drafts_histogram'")
    if any(v < 0 for v in hist):
        raise DoctorError(f"{what}: meta_info spec_correct_drafts_histogram {hist} has a negative count")
    if sum(hist) != fields["spec_verify_ct"]:
        raise DoctorError(f"{what}: meta_info spec_correct_drafts_histogram {hist} sums to {sum(hist)}, but "
                          f"spec_verify_ct is {fields['spec_verify_ct']}")
    proposed = meta.get("spec_num_proposed_drafts")
    if proposed is not None and (not isinstance(proposed, int) or isinstance(proposed, bool) or proposed < 0):
        raise DoctorError(f"{what}: meta_info 'spec_num_proposed_drafts' must be a non-negative integer, got "
                          f"{proposed!r}")
    return Response(ids, out, Served(fields["completion_tokens"], fields["spec_verify_ct"], hist), proposed)


def read_recorded(path: str) -> List[Response]:
    """Recorded /generate responses, one JSON object a line."""
    p = require_file(path, "--server recorded responses")
    out = [parse_response(obj, f"--server {p}, line {n}")
           for n, obj in jsonl_records(read_text(p, f"--server {p}"), f"--server {p}")]
    if not out:
        raise DoctorError(f"--server {p}: no responses in it")
    return out


def check_counts(responses: Sequence[Response], flags: Tuple[int, int, int]) -> None:
    """DoctorError when a response's counts cannot come from a server running these (num_steps, eagle_topk,
    num_draft_tokens)."""
    for r in responses:
        if r.num_proposed_drafts is not None and r.served.verify_ct and \
                r.num_proposed_drafts != r.served.verify_ct * (flags[2] - 1):
            raise DoctorError(f"the server reports spec_num_proposed_drafts {r.num_proposed_drafts} for "
                              f"{r.served.verify_ct} verifies, i.e. num-draft-tokens "
                              f"{r.num_proposed_drafts / r.served.verify_ct + 1:g}, not {flags[2]}")


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
    if abs(lo - lp) > tolerance * max(1.0, lp):
        return False, (f"served accept length online {lo:.3f} vs predicted {lp:.3f}: the walks differ although the "
                       "per-step shares agree within the tolerance; compare the per-prompt rows")
    return True, (f"matches: online {lo:.3f} = {online.completion_tokens} / {online.verify_ct}, predicted {lp:.3f} = "
                  f"{predicted.completion_tokens} / {predicted.verify_ct}")


__all__ = ["DUMP_HINT", "Response", "parse_response", "read_recorded", "check_counts", "StepRow", "verdict_of"]
