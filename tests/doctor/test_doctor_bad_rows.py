"""Rows of hidden states that hold NaN, Inf or only zeros (issue 32, kind 2) are never a verdict: every command that
reads hidden states leaves them out, says how many there were and where, and blames the data -- never the taps, the
draft or the flags. Rows left out while others remain are an error finding (exit 1); an input with no usable row at
all is bad input (exit 2)."""
import json
import os

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from doctor_helpers import assert_clean_error, cli, demo_fast, write_json
from dump_helpers import TeacherForced, write_training

FLAGS = ("--speculative-algorithm EAGLE3 --speculative-num-steps 3 --speculative-eagle-topk 1 "
         "--speculative-num-draft-tokens 4")
N = 6
L = 8
DECLARED = [0, 1, 4]
DECL = ["Embedding", "LayerOutput(0)", "LayerOutput(3)"]
VERDICTS = ("every served slot holds the declared tap", "capture or draft-side mismatch", "draft or flags",
            "does NOT capture what training used", "verdict: matches")


@pytest.fixture(scope="module")
def tf(tmp_path_factory):
    res, out = demo_fast()
    root = tmp_path_factory.mktemp("badrows")
    prompts = json.load(open(os.path.join(out, "prompts.json")))[:3]
    t = TeacherForced(prompts, os.path.join(out, "draft"), N)
    return {"t": t, "root": root, "draft": os.path.join(out, "draft"),
            "prompts": write_json(root / "prompts.json", prompts),
            "responses": t.write_responses(str(root / "responses.jsonl"))}


def _dump(tf, name, edit=None, served=DECLARED):
    d = str(tf["root"] / name)
    paths = tf["t"].write_dump(d, served, list(range(L + 1)), declared=DECL)
    if edit is not None:
        rec = torch.load(paths[0])
        edit(rec)
        torch.save(rec, paths[0])
    return d


def _online(tf, dump, *extra):
    return cli("doctor", "online", "--server", tf["responses"], "--prompts", tf["prompts"], "--draft", tf["draft"],
               "--dump", dump, "--server-args", FLAGS, "--no-progress", "--device", "cpu", "--threads", 1, *extra)


def _accept(tf, dump, *extra):
    return cli("doctor", "accept", "--hidden-states", dump, "--prompts", tf["prompts"], "--draft", tf["draft"],
               "--server-args", FLAGS, "--no-progress", "--device", "cpu", "--threads", 1, *extra)


def _nan_rows(key, value=float("nan"), rows=slice(2, 5)):
    def edit(rec):
        if key == "aux":
            rec["aux"][rows] = value
        else:
            rec["stream"][:, rows] = value
    return edit


@pytest.mark.parametrize("what, value", [("NaN", float("nan")), ("Inf", float("inf")), ("zero", 0.0)])
def test_bad_served_rows_are_counted_and_blamed_not_a_verdict(tf, tmp_path, what, value):
    """Before: 3 NaN rows of 126 made every cosine NaN, every slot 'ambiguous', and the verdict 'every served slot
    holds the declared tap', exit 0."""
    d = _dump(tf, f"aux_{what}", _nan_rows("aux", value))
    code, text, err = cli("doctor", "fingerprint", "--captured", d, "--json", tmp_path / "f.json")
    assert code == 1, text + err
    verdict = text.strip().splitlines()[-1]
    assert verdict.startswith("verdict: bad data: rows in the dump: served slot 0") and "3 of 126 rows" in verdict
    assert "request eagle3-doctor-testrun-0, position 2" in verdict and "say nothing about the taps" in verdict
    assert not any(v in text for v in VERDICTS), text
    j = json.load(open(tmp_path / "f.json"))
    # judged on the other rows: every slot is still named, bit for bit
    assert [(s["verdict"], s["best"]) for s in j["slots"]] == [("exact", 0), ("exact", 1), ("exact", 4)]
    kind = "zero" if what == "zero" else "nonfinite"
    assert [(b["what"], b[kind]) for b in j["bad_rows"]] == [(f"served slot {k}", 3) for k in range(3)]
    # online: the prediction reads the stream, not the served slots; the verdict names the data first
    code, text, err = _online(tf, d)
    assert code == 1 and "verdict: bad data: rows of the dump: served slot 0" in text, text + err
    assert "on the rest: matches" in text


def test_bad_stream_rows_leave_the_prompt_out_of_the_prediction(tf, tmp_path):
    """Before: the NaN rows in the server's stream went into the draft's taps; the prediction fell and the verdict
    blamed 'the server's draft or flags'."""
    d = _dump(tf, "stream_nan", _nan_rows("stream"))
    code, text, err = _online(tf, d, "--json", tmp_path / "o.json")
    assert code == 1, text + err
    j = json.load(open(tmp_path / "o.json"))
    assert [p["prompt"] for p in j["online"]["per_prompt"]] == [1, 2]
    assert j["left_out"][0]["what"].startswith("prompt 0 (dumped request eagle3-doctor-testrun-0)")
    assert j["online"]["per_prompt"] == j["predicted"]["per_prompt"]  # the others still match
    assert j["verdict"].startswith("bad data: 1 of 3 prompt(s) left out") and "first: position 2, tap Embedding" in \
        j["verdict"]
    assert "draft or flags" not in text and "capture or draft-side" not in text
    # accept on the same dump: the prompt is left out, said, exit 1
    code, text, err = _accept(tf, d, "--json", tmp_path / "a.json")
    assert code == 1, text + err
    a = json.load(open(tmp_path / "a.json"))
    assert a["prompts"] == 2 and [p["prompt"] for p in a["served"]["per_prompt"]] == [1, 2]
    assert "1 prompt(s) left out of every figure above" in text and "3 hold NaN or Inf" in text
    clean = _dump(tf, "clean")
    code, text, err = _accept(tf, clean, "--json", tmp_path / "c.json")
    assert code == 0 and json.load(open(tmp_path / "c.json"))["served"]["per_prompt"][1:] == \
        a["served"]["per_prompt"], text + err


def test_nothing_usable_is_bad_input(tf):
    """A stream with no usable row, or training data with none: exit 2, one line (before: exit 0 or 1 with a
    verdict about the capture)."""
    def all_nan(rec):
        rec["stream"].fill_(float("nan"))

    d = str(tf["root"] / "all_nan")
    for p in tf["t"].write_dump(d, DECLARED, list(range(L + 1)), declared=DECL):
        rec = torch.load(p)
        all_nan(rec)
        torch.save(rec, p)
    assert_clean_error(*cli("doctor", "fingerprint", "--captured", d), "no usable row", "NaN")
    assert_clean_error(*_online(tf, d), "every prompt's taps hold bad rows")
    zero = str(tf["root"] / "all_zero")
    for p in tf["t"].write_dump(zero, DECLARED, list(range(L + 1)), declared=DECL):
        rec = torch.load(p)
        rec["stream"].zero_()
        torch.save(rec, p)
    assert_clean_error(*_accept(tf, zero), "every prompt's taps hold bad rows", "all zero")


def test_training_data_with_bad_rows(tf, tmp_path):
    t = tf["t"]
    dump = _dump(tf, "for_training")
    stacks = [s.clone() for s in t.stack]
    stacks[1][4:7, 1] = float("nan")
    tr = str(tmp_path / "nan")
    write_training(tr, t.sent, stacks, DECLARED, dtype=torch.float32)
    code, text, err = cli("doctor", "fingerprint", "--training-data", tr, "--captured", dump, "--json",
                          tmp_path / "t.json")
    assert code == 1, text + err
    j = json.load(open(tmp_path / "t.json"))
    assert j["same_as_served"] and j["bad_rows"][0]["what"] == "training slot 1"
    assert j["bad_rows"][0]["nonfinite"] == 3 and "sample data_1.ckpt, position 4" in j["bad_rows"][0]["first"]
    verdict = text.strip().splitlines()
    assert any(v.startswith("verdict: bad data: training slot 1: 3 of") for v in verdict), text
    assert "does NOT capture" not in text
    for s in stacks:
        s.fill_(float("nan"))
    tr2 = str(tmp_path / "all_nan")
    write_training(tr2, t.sent, stacks, DECLARED, dtype=torch.float32)
    assert_clean_error(*cli("doctor", "fingerprint", "--training-data", tr2, "--captured", dump),
                       "--training-data", "every row", "NaN")


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_bad_rows_never_move_a_match(data):
    """The matcher over rows some of which are bad (NaN / Inf / zero, anywhere in the slots or the stream) names the
    same layers, with the same cosines, as over the good rows alone; and counts exactly the bad ones."""
    from eagle3_capture.doctor.fingerprint.stream_match import StreamMatcher

    g = torch.Generator().manual_seed(data.draw(st.integers(0, 2 ** 16)))
    T, H, S = 24, 8, 5
    stream = torch.cumsum(torch.randn(S, T, H, generator=g), 0)
    layers = [0, 2, 3, 5, 7]
    pick = data.draw(st.lists(st.sampled_from(range(S)), min_size=1, max_size=3))
    slots = stream[pick].permute(1, 0, 2).reshape(T, -1).clone()
    bad = sorted(set(data.draw(st.lists(st.integers(0, T - 1), min_size=1, max_size=T // 2))))
    kinds = data.draw(st.lists(st.sampled_from(["nan", "inf", "zero"]), min_size=len(bad), max_size=len(bad)))
    where = data.draw(st.sampled_from(["slots", "stream"]))
    broken_slots, broken_stream = slots.clone(), stream.clone()
    for r, kind in zip(bad, kinds):
        v = {"nan": float("nan"), "inf": float("inf"), "zero": 0.0}[kind]
        if where == "slots":
            broken_slots[r] = v
        else:  # the row of every entry (a zero embedding row is data: NaN there instead)
            broken_stream[1:, r] = v
            broken_stream[0, r] = float("nan") if kind == "zero" else v
    keep = torch.tensor([r not in bad for r in range(T)])
    clean = StreamMatcher(len(pick), H)
    clean.add(slots[keep], stream[:, keep], layers)
    m = StreamMatcher(len(pick), H)
    m.add(broken_slots, broken_stream, layers)
    got, want = m.matches(), clean.matches()
    assert [(x.best, x.verdict, x.rows) for x in got] == [(x.best, x.verdict, x.rows) for x in want]
    assert [x.best_cos for x in got] == pytest.approx([x.best_cos for x in want], abs=1e-12)
    counted = {b.what: b.count for b in m.bad_rows(got)}
    if where == "slots":
        assert counted == {f"slot {k}": len(bad) for k in range(len(pick))}
    else:
        assert counted == {f"the stream at {'Embedding' if li == 0 else f'LayerOutput({li - 1})'}": len(bad)
                           for li in layers}


def test_a_zero_embedding_row_is_data():
    """A token whose embedding row is zero (a padding row): zero in the slot and in the stream's layer input 0 alike;
    not bad data."""
    from eagle3_capture.doctor.fingerprint.stream_match import StreamMatcher

    g = torch.Generator().manual_seed(1)
    stream = torch.cumsum(torch.randn(3, 10, 4, generator=g), 0)
    stream[0, 3] = 0.0  # the embedding of token 3 is zero
    slots = stream[[0, 2]].permute(1, 0, 2).reshape(10, -1)
    m = StreamMatcher(2, 4)
    m.add(slots, stream, [0, 1, 2])
    got = m.matches()
    assert [(x.best, x.verdict) for x in got] == [(0, "exact"), (2, "exact")]
    assert m.bad_rows(got) == []
