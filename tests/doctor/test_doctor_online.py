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
    from eagle3_capture.doctor.draft_side import load_draft_side
    from eagle3_capture.doctor.replay import evaluate, served_walks
    from eagle3_capture.doctor.server_args import SpecResolution
    from eagle3_capture.doctor.target_transformers import TransformersTarget

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
    code, text, err = _online(recorded, _write(tmp_path / "r.jsonl", recorded[2]), "--json", tmp_path / "o.json")
    assert code == 0, text + err
    j = json.load(open(tmp_path / "o.json"))
    assert j["ok"] and j["verdict"].startswith("matches") and j["max_new_tokens"] == N  # read off the file
    assert j["online"] == {k: v for k, v in j["predicted"].items()}
    assert "verdict: matches" in text and "step  online  offline" in text


def test_fewer_accepted_drafts_online_is_a_mismatch_at_that_step(recorded, tmp_path):
    lines = json.loads(json.dumps(recorded[2]))
    # one prompt's verifies: move every fully accepted verify to "rejected at step 1" (as a miswired capture would)
    for line in lines:
        h = line["meta_info"]["spec_correct_drafts_histogram"]
        if len(h) == 4 and h[3]:
            h[0] += h[3]
            h[3] = 0
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
    del nospec[0]["meta_info"]["spec_verify_ct"]
    assert_clean_error(*_online(recorded, _write(tmp_path / "nospec.jsonl", nospec)), "does not run speculative")
    badh = json.loads(json.dumps(lines))
    badh[1]["meta_info"]["spec_correct_drafts_histogram"].append(5)
    assert_clean_error(*_online(recorded, _write(tmp_path / "h.jsonl", badh)), "sums to")
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
