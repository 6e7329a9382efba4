"""A server's responses as `doctor online` reads them (doctor/sglang_model/responses.py): every walk SGLang's loop can take gives
counts that pass, and counts that no walk gives -- zero verifies, more verifies than tokens, a histogram beyond
num-steps or that disagrees with completion_tokens, completion_tokens 0, two records for one prompt -- are bad input
naming the record and the field. The newer meta_info names (spec_num_correct_drafts / spec_num_proposed_drafts)
are read without the 0.5.23 ones. Through the CLI on the demo pair: test_doctor_online.py."""
from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import fuzz_examples
from eagle3_capture.doctor.common import DoctorError
from eagle3_capture.doctor.sglang_model.responses import check_counts, parse_response, read_recorded
from eagle3_capture.doctor.sglang_model.serving import walk

CHAIN = (3, 1, 4)
GOOD = [3, 1, 0, 2, 3, 3, 0, 1, 2, 3]  # accepted draft tokens at anchors 0..9
TREE = (3, 2, 6)


def meta_of(accepted, new_tokens, flags=CHAIN, names="both"):
    """The meta_info SGLang 0.5.23 writes for a request whose verifies accept these draft counts (its own walk:
    serving.walk, checked against SGLang's serving loop in tests/engine), with the old names, the new, or both."""
    s = walk(accepted, new_tokens)
    D = flags[2]
    a = sum(n * x for n, x in enumerate(s.histogram))
    old = {"spec_verify_ct": s.verify_ct, "spec_correct_drafts_histogram": s.histogram}
    new = {"spec_num_correct_drafts": a, "spec_num_proposed_drafts": s.verify_ct * (D - 1)}
    meta = {"completion_tokens": s.completion_tokens, "prompt_tokens": 4, "num_retractions": 0,
            "spec_accept_length": s.completion_tokens / s.verify_ct,
            "spec_accept_rate": a / (s.verify_ct * (D - 1))}
    meta.update(old if names == "old" else new if names == "new" else {**old, **new})
    return meta


def record(meta, prompt=(5, 6, 7, 8), out=None):
    c = meta.get("completion_tokens")
    if meta.get("prompt_tokens") == 4:
        meta = {**meta, "prompt_tokens": len(prompt)}
    return {"input_ids": list(prompt), "output_ids": out if out is not None else list(range(c if isinstance(c, int)
                                                                                            and 0 <= c < 10 ** 4 else 0)),
            "meta_info": meta}


def parsed(meta, flags=CHAIN, **kw):
    r = parse_response(record(meta, **kw), "line 1")
    check_counts([r], flags)
    return r


def refused(meta, *needles, flags=CHAIN, **kw):
    with pytest.raises(DoctorError) as e:
        parsed(meta, flags, **kw)
    msg = str(e.value)
    assert msg.startswith("line 1:"), msg  # names the record
    for n in needles:
        assert n in msg, f"{n!r} not in {msg!r}"
    return msg


ACCEPTED = st.lists(st.integers(0, 3), min_size=40, max_size=40)


@settings(max_examples=fuzz_examples(200), deadline=None)
@given(accepted=ACCEPTED, new_tokens=st.integers(2, 30), names=st.sampled_from(["old", "new", "both"]))
def test_every_walk_of_the_chain_passes(accepted, new_tokens, names):
    r = parsed(meta_of(accepted, new_tokens, names=names))
    s = walk(accepted, new_tokens)
    assert r.served.verify_ct == s.verify_ct and r.served.completion_tokens == s.completion_tokens
    assert r.served.histogram == (s.histogram if names != "new" else [])


@settings(max_examples=fuzz_examples(100), deadline=None)
@given(accepted=st.lists(st.integers(0, 3), min_size=40, max_size=40), new_tokens=st.integers(2, 30))
def test_every_walk_of_a_tree_passes(accepted, new_tokens):
    parsed(meta_of(accepted, new_tokens, TREE), TREE)


@settings(max_examples=fuzz_examples(200), deadline=None)
@given(accepted=ACCEPTED, new_tokens=st.integers(2, 30), dc=st.integers(-6, 6))
def test_completion_tokens_off_the_walk_are_refused_exactly_when_no_order_of_the_verifies_gives_them(
        accepted, new_tokens, dc):
    """Given a histogram, the completion tokens a server can report are 1 + V + A - n_last .. 1 + V + A: any of the
    verifies can be the last one, whose run alone may be cut. The check accepts exactly that interval."""
    meta = meta_of(accepted, new_tokens, names="old")
    del meta["spec_accept_length"], meta["spec_accept_rate"]
    h = meta["spec_correct_drafts_histogram"]
    v, a = sum(h), sum(n * x for n, x in enumerate(h))
    top, low = 1 + v + a, 1 + v + a - max(n for n, x in enumerate(h) if x)
    meta["completion_tokens"] += dc
    c = meta["completion_tokens"]
    if low <= c <= top:
        parsed(meta)
    else:
        refused(meta, "completion_tokens")


def test_the_issue_cases():
    good = meta_of(GOOD, 10)
    # zero verifies for every request
    refused({**good, "spec_verify_ct": 0, "spec_correct_drafts_histogram": [], "spec_num_correct_drafts": 0,
             "spec_num_proposed_drafts": 0}, "spec_verify_ct 0 with completion_tokens 10")
    zero = {"completion_tokens": 10, "spec_verify_ct": 0}
    refused(zero, "spec_verify_ct 0")
    # a histogram with entries beyond num-steps (here all verifies accepted 5 of a 3-step chain)
    refused({"completion_tokens": 10, "spec_verify_ct": 2, "spec_correct_drafts_histogram": [0, 0, 0, 0, 1, 1]},
            "spec_correct_drafts_histogram", "accepted 5 draft tokens", "at most 3")
    # more verifies than tokens
    refused({"completion_tokens": 10, "spec_verify_ct": 12, "spec_correct_drafts_histogram": [12]},
            "more verifies", "spec_verify_ct 12")
    refused({"completion_tokens": 10, "spec_verify_ct": 12}, "more verifies")
    # a histogram that disagrees with completion_tokens (too few tokens for it, too many)
    refused({"completion_tokens": 10, "spec_verify_ct": 4, "spec_correct_drafts_histogram": [0, 0, 0, 4]},
            "fewer than")
    refused({"completion_tokens": 10, "spec_verify_ct": 2, "spec_correct_drafts_histogram": [0, 0, 2]},
            "more than a server puts out")
    # completion_tokens 0
    refused({"completion_tokens": 0, "spec_verify_ct": 0}, "completion_tokens 0")
    # the newer names only: read, the verify count from spec_num_proposed_drafts / (num-draft-tokens - 1)
    r = parsed({"completion_tokens": 10, "spec_num_correct_drafts": 6, "spec_num_proposed_drafts": 9})
    assert r.served.verify_ct == 3 and r.histogram is None
    refused({"completion_tokens": 10, "spec_num_correct_drafts": 6, "spec_num_proposed_drafts": 10},
            "not a multiple of num-draft-tokens - 1 = 3")
    refused({"completion_tokens": 10, "spec_num_correct_drafts": 10, "spec_num_proposed_drafts": 9},
            "spec_num_correct_drafts 10 for 3 verifies")


def test_every_other_field():
    good = meta_of(GOOD, 10)
    refused({**good, "spec_num_correct_drafts": good["spec_num_correct_drafts"] + 1}, "spec_num_correct_drafts")
    refused({**good, "spec_num_proposed_drafts": good["spec_num_proposed_drafts"] + 3}, "num-draft-tokens 5")
    refused({**good, "spec_accept_length": 3.0}, "spec_accept_length 3.0")
    refused({**good, "spec_accept_rate": 0.5}, "spec_accept_rate 0.5")
    refused({**good, "prompt_tokens": 5}, "prompt_tokens 5")
    refused(good, "'output_ids' has 3 tokens", out=[1, 2, 3])
    refused({**good, "num_retractions": 1}, "num_retractions 1", "retracted")
    for key in ("completion_tokens", "spec_verify_ct", "spec_num_correct_drafts", "spec_num_proposed_drafts",
                "num_retractions", "prompt_tokens"):
        for bad in (-1, 2.0, True, "3", None, [1]):
            refused({**good, key: bad}, key)
    for key in ("spec_accept_length", "spec_accept_rate"):
        for bad in (-1.0, float("nan"), float("inf"), True, "3", None):
            refused({**good, key: bad}, key)
    for bad in ([1, -1], [1.0], "x", None, {"0": 1}):
        refused({**good, "spec_correct_drafts_histogram": bad}, "spec_correct_drafts_histogram")
    refused({"completion_tokens": 10}, "does not run speculative decoding")
    refused({"completion_tokens": 10, "spec_num_correct_drafts": 3}, "number of verifies is unknown")
    # a trailing zero changes no count: accepted
    parsed({**good, "spec_correct_drafts_histogram": good["spec_correct_drafts_histogram"] + [0]})
    # flags under which no draft runs
    with pytest.raises(DoctorError, match="no draft runs"):
        check_counts([parse_response(record(good), "line 1")], (0, 1, 1))


def test_two_records_for_one_prompt_name_both_lines(tmp_path):
    good = record(meta_of(GOOD, 10))
    other = record(meta_of([0, 0, 0, 0, 0, 0, 0, 0, 0, 0], 10))
    p = tmp_path / "r.jsonl"
    p.write_text("\n".join(json.dumps(x) for x in (good, record(meta_of([1] * 10, 10), prompt=[1, 2]), other))
                 + "\n")
    with pytest.raises(DoctorError, match=r"lines 1 and 3 are both responses to the prompt \[5, 6, 7, 8\]"):
        read_recorded(str(p))
