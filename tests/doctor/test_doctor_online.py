"""doctor online without a server: recorded responses (a JSONL file) against the offline replay, the verdicts, and
bad inputs. Against SGLang's real server: tests/engine."""
import json
import os
import socket

import pytest

from doctor_helpers import assert_clean_error, cli, demo_fast, write_json

FLAGS = ("--speculative-algorithm EAGLE3 --speculative-num-steps 3 --speculative-eagle-topk 1 "
         "--speculative-num-draft-tokens 4")
N = 10


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """What a server serving the demo pair correctly returns, built from the offline replay: (dir, prompts path,
    responses)."""
    from eagle3_capture.doctor.draft.side import load_draft_side
    from eagle3_capture.doctor.replay.evaluate import evaluate, served_walks
    from eagle3_capture.doctor.sglang_model.flag_rules import SpecResolution
    from eagle3_capture.doctor.target_side.model_side import TransformersTarget

    res, out = demo_fast()
    root = tmp_path_factory.mktemp("online")
    prompts = json.load(open(os.path.join(out, "prompts.json")))[:6]
    ppath = write_json(root / "prompts.json", prompts)
    side = TransformersTarget.load("demo")
    m = side.target.model
    ds = load_draft_side(os.path.join(out, "draft"), side.info, None, "cpu", None, m.get_input_embeddings().weight,
                         m.get_output_embeddings().weight)
    runs = evaluate(side, ds.draft, prompts, ds.taps, 3, N, SpecResolution(3, 1, 4), 8, False)
    lines = []
    for run, s in zip(runs, served_walks(runs, N)):
        lines.append({"input_ids": run.prompt, "output_ids": run.seq[len(run.prompt): len(run.prompt) + N].tolist(),
                      "meta_info": {"completion_tokens": s.completion_tokens, "spec_verify_ct": s.verify_ct,
                                    "spec_correct_drafts_histogram": s.histogram,
                                    "spec_num_proposed_drafts": 3 * s.verify_ct}})
    return root, ppath, lines, out


def _write(path, lines):
    with open(path, "w") as f:
        for obj in lines:
            f.write((obj if isinstance(obj, str) else json.dumps(obj)) + "\n")
    return path


def _online(rec, server, *extra):
    root, ppath, _, out = rec
    return cli("doctor", "online", "--server", server, "--prompts", ppath, "--target", "demo", "--draft",
               os.path.join(out, "draft"), "--server-args", FLAGS, "--no-progress", "--device", "cpu", "--threads", 1,
               *extra)


def test_matching_responses(recorded, tmp_path):
    code, text, err = _online(recorded, _write(tmp_path / "r.jsonl", recorded[2]), "--json", tmp_path / "o.json",
                              "--profile-out", tmp_path / "p.json")
    assert code == 0, text + err
    j = json.load(open(tmp_path / "o.json"))
    assert j["ok"] and j["verdict"].startswith("matches") and j["max_new_tokens"] == N  # read off the file
    assert j["online"] == {k: v for k, v in j["predicted"].items()}
    assert "verdict: matches" in text and "step  online  offline" in text
    # --profile-out: the predicted histogram, the server's flags
    from eagle3_capture.acceptance.profile import read

    prof = read(str(tmp_path / "p.json"))
    h = j["predicted"]["correct_drafts_histogram"]
    assert list(prof.histogram) == h + [0] * (4 - len(h)) and prof.source == "doctor online" and prof.prompts == 6
    assert (prof.speculative.num_steps, prof.speculative.eagle_topk, prof.speculative.num_draft_tokens) == (3, 1, 4)
    assert j["profile"]["path"] == prof.path and f"profile written to {prof.path}" in text


def test_fewer_accepted_drafts_online_is_a_mismatch_at_that_step(recorded, tmp_path):
    from eagle3_capture.doctor.sglang_model.serving import walk

    lines = json.loads(json.dumps(recorded[2]))
    # one prompt served by a draft that never gets a token right (as a miswired capture would): SGLang's own walk
    # for it, so the counts are ones a server reports (the impossible ones are bad input: below)
    for line in lines:
        h = line["meta_info"]["spec_correct_drafts_histogram"]
        if len(h) == 4 and h[3]:
            s = walk([0] * N, N)
            line["meta_info"].update(completion_tokens=s.completion_tokens, spec_verify_ct=s.verify_ct,
                                     spec_correct_drafts_histogram=s.histogram, spec_num_proposed_drafts=3 * s.verify_ct)
            break
    code, text, err = _online(recorded, _write(tmp_path / "r.jsonl", lines))
    assert code == 1, text + err
    assert "online below offline by" in text and "at step 1" in text and "EAGLE3_CAPTURE_DUMP" in text


def test_outputs_that_differ_are_not_lossless(recorded, tmp_path):
    lines = json.loads(json.dumps(recorded[2]))
    lines[2]["output_ids"][4] = (lines[2]["output_ids"][4] + 1) % 256
    code, text, err = _online(recorded, _write(tmp_path / "r.jsonl", lines))
    assert code == 1 and "not lossless" in text and "first at prompt 2, output token 4" in text, text


def test_bad_inputs(recorded, tmp_path):
    root, ppath, lines, out = recorded
    good = _write(tmp_path / "good.jsonl", lines)
    assert_clean_error(*_online(recorded, str(tmp_path / "none.jsonl")), "neither an http(s):// URL")
    assert_clean_error(*_online(recorded, _write(tmp_path / "bad.jsonl", ["{nope"])), "line 1", "malformed JSON")
    assert_clean_error(*_online(recorded, _write(tmp_path / "few.jsonl", lines[:3])), "no recorded response for prompt 3")
    nospec = json.loads(json.dumps(lines))
    for key in ("spec_verify_ct", "spec_correct_drafts_histogram", "spec_num_proposed_drafts"):
        del nospec[0]["meta_info"][key]
    assert_clean_error(*_online(recorded, _write(tmp_path / "nospec.jsonl", nospec)), "does not run speculative")
    badh = json.loads(json.dumps(lines))
    badh[1]["meta_info"]["spec_correct_drafts_histogram"].append(5)
    assert_clean_error(*_online(recorded, _write(tmp_path / "h.jsonl", badh)), "line 2", "counts")
    assert_clean_error(*_online(recorded, good, "--new-tokens", 12), "not max_new_tokens 12")
    code, text, err = cli("doctor", "online", "--server", good, "--prompts", ppath, "--target", "demo", "--draft",
                          os.path.join(out, "draft"), "--no-progress", "--device", "cpu")
    assert_clean_error(code, text, err, "give --server-args")
    code, text, err = cli("doctor", "online", "--server", good, "--prompts", ppath, "--target", "demo", "--draft",
                          os.path.join(out, "draft"), "--server-args", "--speculative-num-steps 3 "
                          "--speculative-eagle-topk 2 --speculative-num-draft-tokens 6", "--no-progress", "--device",
                          "cpu")
    assert_clean_error(code, text, err, "spec_num_proposed_drafts")
    assert_clean_error(*_online(recorded, good, "--tolerance", 1.5), "--tolerance")
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert_clean_error(*_online(recorded, f"http://127.0.0.1:{port}", "--new-tokens", N, "--timeout", 5),
                       "cannot reach the server")


def _one_line_bad_input(code, text, err, *needles):
    assert_clean_error(code, text, err, *needles)
    assert len([ln for ln in err.splitlines() if ln.strip()]) == 1, err
    assert "capture or draft-side" not in err + text and "verdict" not in text, text + err


def test_impossible_counts_are_bad_input_naming_the_record(recorded, tmp_path):
    """Counts no server reports (doctor/sglang_model/responses.py says why each relation holds) end in exit 2 naming the line and
    the field: never 'matches', never the capture-mismatch verdict."""
    lines = recorded[2]

    def with_meta(i, **meta):
        out = json.loads(json.dumps(lines))
        out[i]["meta_info"].update(meta)
        for k in [k for k, v in meta.items() if v is None]:
            del out[i]["meta_info"][k]
        return out

    c = lines[2]["meta_info"]["completion_tokens"]
    cases = {
        "zero_verifies": ([dict(ln, meta_info={**ln["meta_info"], "spec_verify_ct": 0,
                                                "spec_correct_drafts_histogram": [], "spec_num_proposed_drafts": 0})
                           for ln in json.loads(json.dumps(lines))], ["line 1", "spec_verify_ct 0"]),
        "beyond_num_steps": (with_meta(2, spec_verify_ct=2, spec_correct_drafts_histogram=[0, 0, 0, 0, 1, 1],
                                       spec_num_proposed_drafts=6),
                             ["line 3", "accepted 5 draft tokens", "at most 3"]),
        "more_verifies_than_tokens": (with_meta(2, spec_verify_ct=c + 2, spec_correct_drafts_histogram=[c + 2],
                                                spec_num_proposed_drafts=3 * (c + 2)),
                                      ["line 3", "more verifies"]),
        "histogram_against_completion_tokens": (with_meta(2, spec_verify_ct=1, spec_correct_drafts_histogram=[0, 1],
                                                          spec_num_proposed_drafts=3),
                                                ["line 3", f"completion_tokens {c} is more than"]),
        "completion_tokens_0": ([dict(ln, output_ids=[], meta_info={**ln["meta_info"], "completion_tokens": 0,
                                                                    "spec_verify_ct": 0,
                                                                    "spec_correct_drafts_histogram": [],
                                                                    "spec_num_proposed_drafts": 0})
                                 for ln in json.loads(json.dumps(lines))], ["line 1", "completion_tokens 0"]),
        "proposed_for_other_flags": (with_meta(4, spec_num_proposed_drafts=lines[4]["meta_info"]["spec_verify_ct"]),
                                     ["line 5", "spec_num_proposed_drafts", "num-draft-tokens 2"]),
    }
    for name, (bad, needles) in cases.items():
        code, text, err = _online(recorded, _write(tmp_path / f"{name}.jsonl", bad))
        _one_line_bad_input(code, text, err, *needles)
        assert "--new-tokens" not in err, (name, err)  # a flag the user never gave


def test_two_records_for_one_prompt_are_an_error_naming_both_lines(recorded, tmp_path):
    lines = recorded[2]
    dup = lines + [json.loads(json.dumps(lines[1]))]
    _one_line_bad_input(*_online(recorded, _write(tmp_path / "dup.jsonl", dup)), f"lines 2 and {len(dup)}")


def test_the_newer_meta_info_names_alone_are_read(recorded, tmp_path):
    """spec_num_correct_drafts / spec_num_proposed_drafts without spec_verify_ct and the histogram: the verifies
    are proposed / (num-draft-tokens - 1), the accept lengths are compared, per step there is nothing online."""
    lines = json.loads(json.dumps(recorded[2]))
    for ln in lines:
        m = ln["meta_info"]
        h = m.pop("spec_correct_drafts_histogram")
        m.pop("spec_verify_ct")
        m["spec_num_correct_drafts"] = sum(n * x for n, x in enumerate(h))
    code, text, err = _online(recorded, _write(tmp_path / "new.jsonl", lines), "--json", tmp_path / "o.json")
    assert code == 0, text + err
    j = json.load(open(tmp_path / "o.json"))
    assert j["ok"] and j["online"]["verify_ct"] == j["predicted"]["verify_ct"], j
    assert "no per-step figures online" in text and "verdict: matches" in text, text
    # and a draft that accepts less online than predicted is still named, from the accept lengths alone
    for ln in lines:
        m = ln["meta_info"]
        v = m["spec_num_proposed_drafts"] // 3
        m["spec_num_correct_drafts"] = 0
        m["spec_num_proposed_drafts"] = 3 * (N - 1)
        ln["meta_info"]["completion_tokens"] = N
        assert v <= N - 1
    code, text, err = _online(recorded, _write(tmp_path / "new_low.jsonl", lines))
    assert code == 1 and "below predicted" in text and "capture or draft-side mismatch" in text, text + err
