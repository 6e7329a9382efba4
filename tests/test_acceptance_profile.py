"""acceptance/profile.py, the expected-acceptance profile format: a made profile round-trips through write and
read; every malformed file (not a file, too big, not JSON, NaN, wrong format / version / source / flags / counts, a
histogram longer than the flags allow, derived fields contradicting the histogram) is a ProfileError whose message
is one line naming the file; and hypothesis throws arbitrary JSON, mutated profiles and raw bytes at it: a Profile
or a one-line ProfileError, nothing else."""
from __future__ import annotations

import json
import math
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import fuzz_examples
from eagle3_capture.acceptance import profile as P
from eagle3_capture.acceptance.positions import accept_length, attempts_accepted

SPEC = P.Speculative(3, 1, 4)
FUZZ = settings(max_examples=fuzz_examples(300), deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


def good(**over) -> dict:
    d = P.make("doctor accept", SPEC, [5, 10, 20, 15], 8, draft="d", target="t").to_json()
    d.update(over)
    return d


def refused(data, needle: str = "") -> str:
    with pytest.raises(P.ProfileError) as ei:
        P.from_json(data, "x.json")
    msg = str(ei.value)
    assert "\n" not in msg and msg.startswith("profile x.json: "), msg
    assert needle in msg, msg
    return msg


def test_make_write_read_round_trip(tmp_path):
    prof = P.make("doctor online", P.Speculative(4, 2, 6), [3, 0, 7], 5, draft="dr", target="tg")
    assert prof.histogram == (3, 0, 7, 0, 0) and prof.verifies == 10 and prof.positions == 4
    att, acc = prof.attempts_accepted()
    assert (att, acc) == attempts_accepted([3, 0, 7, 0, 0], 4) == ([10, 7, 7, 0], [7, 7, 0, 0])
    assert prof.acceptance() == [0.7, 1.0, 0.0, None]
    assert prof.accept_length == pytest.approx(accept_length([3, 0, 7])) == pytest.approx(1 + 14 / 10)
    path = P.write(prof, str(tmp_path / "p.json"))
    assert os.path.isabs(path) and not [f for f in os.listdir(tmp_path) if ".tmp" in f]
    back = P.read(path)
    assert (back.source, back.speculative, back.histogram, back.prompts, back.draft, back.target, back.created) == \
        (prof.source, prof.speculative, prof.histogram, prof.prompts, prof.draft, prof.target, prof.created)
    assert back.path == path and back.to_json() == prof.to_json()
    # the file is what the module's text says
    j = json.load(open(path))
    assert j["format"] == P.FORMAT and j["version"] == 1 and j["positions"][0] == \
        {"position": 1, "attempts": 10, "accepted": 7, "acceptance": 0.7}


def test_write_refuses_bad_places(tmp_path):
    prof = P.make("doctor accept", SPEC, [1, 1], 1)
    with pytest.raises(P.ProfileError, match="is a directory"):
        P.write(prof, str(tmp_path))
    with pytest.raises(P.ProfileError, match="does not exist"):
        P.write(prof, str(tmp_path / "no" / "p.json"))


def test_make_refuses():
    with pytest.raises(ValueError, match="source"):
        P.make("doctor watch", SPEC, [1], 1)
    with pytest.raises(P.ProfileError, match="no verify"):
        P.make("doctor accept", SPEC, [0, 0], 1)
    with pytest.raises(P.ProfileError, match="bins"):
        P.make("doctor accept", SPEC, [1, 1, 1, 1, 1], 1)


def test_read_refuses_files(tmp_path):
    def refused_file(path, needle):
        with pytest.raises(P.ProfileError) as ei:
            P.read(str(path))
        assert "\n" not in str(ei.value) and needle in str(ei.value), str(ei.value)

    refused_file(tmp_path / "missing.json", "cannot be read")
    refused_file(tmp_path, "not a regular file")
    big = tmp_path / "big.json"
    big.write_bytes(b" " * (P.MAX_BYTES + 1))
    refused_file(big, "bytes")
    for name, body, needle in (("a.json", b"{nope", "not JSON"), ("b.json", b"\xff\xfe", "not JSON"),
                               ("c.json", json.dumps(good()).replace('"prompts": 8', '"prompts": NaN').encode(),
                                "NaN"),
                               ("d.json", b"[]", "JSON object")):
        f = tmp_path / name
        f.write_bytes(body)
        refused_file(f, needle)


@pytest.mark.parametrize("over, needle", [
    ({"format": "other"}, "format"), ({"version": 2}, "version"), ({"source": "me"}, "source"),
    ({"speculative": None}, "'speculative'"), ({"speculative": {"num_steps": 0, "eagle_topk": 1,
                                                                "num_draft_tokens": 4}}, "num_steps"),
    ({"speculative": {"num_steps": 3, "eagle_topk": True, "num_draft_tokens": 4}}, "eagle_topk"),
    ({"speculative": {"num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 1}}, "num_draft_tokens"),
    ({"correct_drafts_histogram": []}, "non-empty"), ({"correct_drafts_histogram": "12"}, "non-empty"),
    ({"correct_drafts_histogram": [1, 2, 3, 4, 5]}, "bins"), ({"correct_drafts_histogram": [1, -1]}, "[1]"),
    ({"correct_drafts_histogram": [1.5]}, "[0]"), ({"correct_drafts_histogram": [0, 0]}, "no verify"),
    ({"prompts": 0}, "prompts"), ({"prompts": "8"}, "prompts"), ({"draft": 3}, "draft"),
    ({"verifies": 49}, "verifies"), ({"accept_length": 9.0}, "accept_length"), ({"accept_length": "2"}, "accept"),
    ({"positions": []}, "positions"), ({"positions": "x"}, "positions"),
])
def test_from_json_refuses(over, needle):
    refused(good(**over), needle)


def test_positions_contradicting_the_histogram():
    d = good()
    d["positions"][1]["accepted"] += 1
    refused(d, "positions[1]")
    d = good()
    del d["positions"], d["accept_length"], d["verifies"]  # the derived fields are optional
    assert P.from_json(d, "x.json").verifies == 50


@pytest.mark.parametrize("row, value, needle", [
    (0, 1.5, "a share in [0, 1]"), (1, -0.25, "a share in [0, 1]"), (0, 0.5, "the histogram gives 45/50"),
    (2, "0.4", "a share in [0, 1]"), (2, True, "a share in [0, 1]"), (1, None, "a share in [0, 1]"),
])
def test_an_acceptance_contradicting_the_histogram_is_refused(row, value, needle):
    """positions[].acceptance is derived from the histogram like the rest of the row: 1.5, a negative share, or one
    that is not accepted / attempts is a file that contradicts itself."""
    d = good()
    d["positions"][row]["acceptance"] = value
    refused(d, f"positions[{row}].acceptance")
    refused(d, needle)


def test_counts_in_a_row_are_integers():
    d = good()
    d["positions"][0]["attempts"] = float(d["positions"][0]["attempts"])  # 50.0 == 50 in Python: still refused
    refused(d, "positions[0]")
    d = good()
    d["positions"][0]["position"] = True
    refused(d, "positions[0]")


def test_an_unreached_position_has_no_acceptance():
    d = P.make("doctor accept", SPEC, [5, 0, 0, 0], 1).to_json()
    assert d["positions"][1]["acceptance"] is None
    assert P.from_json(d, "x.json").acceptance() == [0.0, None, None]
    d["positions"][1]["acceptance"] = 0.0
    refused(d, "no verify reached position 2")


@pytest.mark.parametrize("body, needle", [
    ("[" * 200000, "nested 200000 deep"), ("{\"a\": " * 50000 + "1" + "}" * 50000, "nested 50000 deep"),
    ('{"format": "eagle3-capture/acceptance-profile", "prompts": ' + "7" * 5000 + "}", "a number of 5000"),
    ('{"prompts": 1' + "0" * 60 + ".5}", "a number of 63"), ('{"prompts": 1e999}', "not finite"),
    ('{"prompts": -1e400}', "not finite"),
])
def test_bounded_parse(tmp_path, body, needle):
    """Nesting and number size are bounded before the decoder recurses or int() converts: one ProfileError line
    naming the file, never a RecursionError or the int-digit-limit ValueError."""
    f = tmp_path / "p.json"
    f.write_text(body)
    with pytest.raises(P.ProfileError) as ei:
        P.read(str(f))
    msg = str(ei.value)
    assert msg.startswith(f"profile {f}: ") and needle in msg and "\n" not in msg, msg


def test_brackets_inside_strings_do_not_count_as_nesting():
    deep_text = "[" * 100 + '\\"]' + "{" * 100
    d = good(draft=deep_text, target="}" * 200)
    back = P.loads(json.dumps(d))
    assert back["draft"] == deep_text and P.from_json(back, "x.json").draft == deep_text


@pytest.mark.parametrize("path", ["", "   "])
def test_an_empty_path_is_said_as_such(path):
    with pytest.raises(P.ProfileError, match="an empty path"):
        P.read(path)


# ----------------------------------------------------------------------------------------------------------------
# fuzz
# ----------------------------------------------------------------------------------------------------------------

JSON = st.recursive(st.none() | st.booleans() | st.integers(-2 ** 70, 2 ** 70) |
                    st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=6),
                    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner,
                                                                                max_size=4), max_leaves=12)
KEYS = ["format", "version", "source", "draft", "target", "created", "speculative", "speculative.num_steps",
        "speculative.eagle_topk", "speculative.num_draft_tokens", "prompts", "correct_drafts_histogram",
        "correct_drafts_histogram.0", "correct_drafts_histogram.3", "verifies", "accept_length", "positions",
        "positions.0", "positions.2.attempts", "positions.1.acceptance"]


def outcome(data, where="x.json"):
    """A Profile, or a one-line ProfileError naming the file: nothing else may come out."""
    try:
        prof = P.from_json(data, where)
    except P.ProfileError as e:
        assert "\n" not in str(e) and str(e).startswith(f"profile {where}: "), str(e)
        return None
    assert prof.verifies > 0 and len(prof.histogram) == prof.positions + 1
    assert all(a is None or 0.0 <= a <= 1.0 for a in prof.acceptance())
    assert math.isfinite(prof.accept_length)
    return prof


@FUZZ
@given(data=JSON)
def test_fuzz_any_json(data):
    outcome(data)


@FUZZ
@given(st.data())
def test_fuzz_mutated_profiles(data):
    d = good()
    for key in data.draw(st.lists(st.sampled_from(KEYS), min_size=1, max_size=3, unique=True)):
        path = key.split(".")
        holder = d
        for part in path[:-1]:
            if isinstance(holder, list):
                holder = holder[int(part)] if part.isdigit() and int(part) < len(holder) else None
            else:
                holder = holder.get(part)
            if not isinstance(holder, (dict, list)):
                break
        else:
            leaf = path[-1]
            if isinstance(holder, list):
                i = int(leaf) if leaf.isdigit() else len(holder)
                if i < len(holder):
                    holder[i] = data.draw(JSON)
            elif data.draw(st.booleans()):
                holder[leaf] = data.draw(JSON)
            else:
                holder.pop(leaf, None)
    prof = outcome(d)
    if prof is not None:  # what it accepts is self-consistent: it writes and reads back the same
        assert P.from_json(prof.to_json(), "again").histogram == prof.histogram


@FUZZ
@given(body=st.one_of(st.binary(max_size=200), st.text(max_size=200).map(str.encode),
                      st.sampled_from([b"NaN", b"Infinity", b"-Infinity", b'{"a": NaN}', b"1e999", b"[1e999]",
                                       b'"' + b"x" * 50 + b'"', b"{" * 5000 + b"}" * 5000, b"[" * 100000,
                                       b"[" * 3000 + b"]" * 3000, b"9" * 5000, b'{"a": ' + b"1" * 4400 + b"}",
                                       b"0." + b"1" * 5000])))
def test_fuzz_file_bytes(tmp_path_factory, body):
    f = tmp_path_factory.mktemp("pf") / "p.json"
    f.write_bytes(body)
    with pytest.raises(P.ProfileError) as ei:
        P.read(str(f))
    assert "\n" not in str(ei.value)


@FUZZ
@given(hist=st.lists(st.integers(0, 10 ** 6), min_size=1, max_size=6), steps=st.integers(1, 8),
       topk=st.integers(1, 4), prompts=st.integers(1, 100))
def test_fuzz_round_trip(tmp_path_factory, hist, steps, topk, prompts):
    spec = P.Speculative(steps, topk, steps + 1)
    try:
        prof = P.make("doctor accept", spec, hist, prompts)
    except P.ProfileError:
        assert sum(hist) == 0 or len(hist) > steps + 1
        return
    path = P.write(prof, str(tmp_path_factory.mktemp("rt") / "p.json"))
    back = P.read(path)
    assert back.histogram == prof.histogram and back.speculative == spec and back.prompts == prompts
    assert back.acceptance() == prof.acceptance()
