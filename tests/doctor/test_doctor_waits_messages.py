"""Waits and messages of the doctor on dumps (issue 32, kind 8): a wait that says what it waits for and gives up
early once the server answered and nothing more can come; messages that say what they mean (no "known up to 48;
needs 48", a gap in positions named as a gap); accept on several runs' records takes the newest and says so;
a server running another draft's declaration is a finding (exit 1) naming both declarations."""
import json
import os
import time

import pytest
import torch

from doctor_helpers import assert_clean_error, cli, demo_fast
from dump_helpers import TeacherForced
from fake_sglang import FakeSGLang

FLAGS = ("--speculative-algorithm EAGLE3 --speculative-num-steps 3 --speculative-eagle-topk 1 "
         "--speculative-num-draft-tokens 4")
N = 6
DECL = ["Embedding", "LayerOutput(0)", "LayerOutput(3)"]


@pytest.fixture(scope="module")
def tf(tmp_path_factory):
    res, out = demo_fast()
    root = tmp_path_factory.mktemp("waits")
    prompts = json.load(open(os.path.join(out, "prompts.json")))[:3]
    t = TeacherForced(prompts, os.path.join(out, "draft"), N)
    pp = root / "prompts.json"
    pp.write_text(json.dumps(prompts))
    return {"t": t, "root": root, "prompts": str(pp), "draft": os.path.join(out, "draft"),
            "responses": t.write_responses(str(root / "responses.jsonl"))}


def test_online_on_a_dump_directory_that_stays_empty_gives_up_early(tf, tmp_path, monkeypatch):
    """Before: `online --dump EMPTY_DIR` waited the whole --timeout (600 s) and printed nothing."""
    from eagle3_capture.doctor.target_side import server_side

    monkeypatch.setattr(server_side, "STALL_S", 2.0)
    empty = tmp_path / "empty"
    empty.mkdir()
    t0 = time.time()
    with FakeSGLang(tf["t"]) as srv:  # answers, but writes no record
        code, out, err = cli("doctor", "online", "--server", srv.url, "--prompts", tf["prompts"], "--draft",
                             tf["draft"], "--dump", empty, "--new-tokens", N, "--server-args", FLAGS, "--device",
                             "cpu", "--threads", 1, "--timeout", 600)
    assert time.time() - t0 < 120
    assert code == 2 and "nothing new was written there for 2 s after the server answered every request" in err, err
    assert f"waiting up to 600 s for the plugin's records of 3 teacher-forced request(s)" in err, err


def test_a_greedy_token_missing_is_said_without_contradiction():
    """Before: 'greedy token known up to position 48; the replay needs 48'."""
    from eagle3_capture.doctor.common import DoctorError
    from eagle3_capture.doctor.target_side.dump_side import StreamedPrompt, StreamTarget

    seq = torch.arange(50)
    greedy = torch.arange(1, 51)
    greedy[48:] = -1  # known after positions 0..47
    st = StreamTarget("x", None, [StreamedPrompt(seq, greedy, None)])
    with pytest.raises(DoctorError) as e:
        st.batch([list(range(40))], [0], 9, [0])
    msg = str(e.value)
    assert "greedy token after position 48 is not in the dumped request" in msg and "39 to 48" in msg, msg
    assert "known up to" not in msg


def test_a_gap_in_a_dumped_request_is_named_as_a_gap(tf, tmp_path):
    """Before: a request with a chunk missing was reported as 'not in it'."""
    from eagle3_capture.doctor.common import DoctorError
    from eagle3_capture.doctor.target_side.server_side import wait_for_requests

    d = str(tmp_path / "gap")
    paths = tf["t"].write_dump(d, [0, 1, 4], list(range(9)), per_record=1, chunk=10, declared=DECL)
    recs = sorted(paths)
    os.remove(recs[1])  # the second chunk of the first request
    seq = tf["t"].sent[0]
    with pytest.raises(DoctorError, match=r"positions 0\.\.\d+ with 10 missing \(first: 10\)"):
        wait_for_requests(d, ["eagle3-doctor-testrun-0"], [seq], 0.5)


def test_accept_takes_the_newest_of_several_runs_and_says_so(tf, tmp_path):
    """Before: of two doctor runs of the same tokens, the file sorting last was read, without a note."""
    d = str(tmp_path / "two")
    newer = tf["t"].write_dump(d, [0, 1, 4], list(range(9)), run="aaa", declared=DECL)
    older = tf["t"].write_dump(d, [0, 1, 4], list(range(9)), run="zzz", declared=DECL, start_seq=100)
    now = time.time()
    for p in older:
        os.utime(p, (now - 100, now - 100))
    for p in newer:
        os.utime(p, (now, now))
    code, out, err = cli("doctor", "accept", "--hidden-states", d, "--prompts", tf["prompts"], "--draft", tf["draft"],
                         "--server-args", FLAGS, "--no-progress", "--device", "cpu", "--threads", 1,
                         "--json", tmp_path / "a.json")
    assert code == 0, out + err
    notes = json.load(open(tmp_path / "a.json"))["notes"]
    assert any("2 dumped requests begin with it" in n and "newest written is used (rid eagle3-doctor-aaa-0" in n
               for n in notes), notes


def test_a_server_running_another_declaration_is_a_finding_naming_both(tf, tmp_path):
    """Before: exit 2 ('restart the server with EAGLE3_CAPTURE_DUMP_STREAM=all'), as if the input were bad."""
    d = str(tmp_path / "other")
    other = ["Embedding", "LayerOutput(0)", "LayerOutput(1)"]
    tf["t"].write_dump(d, [0, 1, 2], [0, 1, 2], declared=other)
    code, out, err = cli("doctor", "online", "--server", tf["responses"], "--prompts", tf["prompts"], "--draft",
                         tf["draft"], "--dump", d, "--server-args", FLAGS, "--no-progress", "--device", "cpu",
                         "--threads", 1)
    assert code == 1, out + err
    assert "the server runs another draft's declaration" in out and str(other) in out and str(DECL) in out, out
    assert "slot 2: LayerOutput(1)" in out and "EAGLE3_CAPTURE_DUMP_STREAM=all" in out, out


def test_an_answer_outside_the_vocabulary_is_not_called_not_lossless(tf, tmp_path):
    rs = [json.loads(ln) for ln in open(tf["responses"])]
    rs[1]["output_ids"][2] = 100000
    p = tmp_path / "oov.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rs))
    d = str(tmp_path / "dump")
    tf["t"].write_dump(d, [0, 1, 4], list(range(9)), declared=DECL)
    code, out, err = cli("doctor", "online", "--server", p, "--prompts", tf["prompts"], "--draft", tf["draft"],
                         "--dump", d, "--server-args", FLAGS, "--no-progress", "--device", "cpu", "--threads", 1)
    assert_clean_error(code, out, err, "prompt 1: output token id 100000 is outside the target's vocabulary (256)")
    assert "lossless" not in out + err


def _v1_dump(tf, d, with_shape=False):
    """Version-1 records (the plugin's older dump: no format, no rid, no stream) of the teacher-forced requests, the
    served slots at the declared layer inputs; as that plugin wrote them, without num_layers / hidden_size."""
    os.makedirs(d)
    t = tf["t"]
    for i, (ids, stack) in enumerate(zip(t.sent, t.stack)):
        T = ids.numel()
        rec = {"aux": stack[:, [0, 1, 4]].reshape(T, -1).contiguous(), "input_ids": ids, "positions": torch.arange(T),
               "forward_mode": "EXTEND", "layers_to_capture": [0, 1, 4]}
        if with_shape:
            rec.update(num_layers=8, hidden_size=64)
        torch.save(rec, os.path.join(d, f"eagle3_capture_pid1_{i:04d}.pt"))
    return d


def test_a_version_1_dump_is_read_with_the_checkpoints_config(tf, tmp_path):
    """Before: every version-1 dump was refused for a missing num_layers / hidden_size (its reading path was
    unreachable). Now --target-checkpoint's config gives them, and the replay equals the version-2 dump's."""
    from dump_helpers import write_checkpoint

    v1 = _v1_dump(tf, str(tmp_path / "v1"))
    args = ("--prompts", tf["prompts"], "--draft", tf["draft"], "--server-args", FLAGS, "--no-progress", "--device",
            "cpu", "--threads", 1)
    code, out, err = cli("doctor", "accept", "--hidden-states", v1, *args)
    assert_clean_error(code, out, err, "version-1 records never do", "--target-checkpoint")
    m = tf["t"].side.target.model
    ck = write_checkpoint(str(tmp_path / "ck"), {"model.embed_tokens.weight": m.get_input_embeddings().weight.detach()},
                          tf["t"].side.target.config_dict, 1)
    code, out, err = cli("doctor", "accept", "--hidden-states", v1, "--target-checkpoint", ck, *args,
                         "--json", tmp_path / "v1.json")
    assert code == 0, out + err
    v2 = str(tmp_path / "v2")
    tf["t"].write_dump(v2, [0, 1, 4], list(range(9)), declared=DECL)
    code, out, err = cli("doctor", "accept", "--hidden-states", v2, *args, "--json", tmp_path / "v2.json")
    assert code == 0, out + err
    a, b = json.load(open(tmp_path / "v1.json")), json.load(open(tmp_path / "v2.json"))
    assert a["metrics"] == b["metrics"] and a["served"] == b["served"]
    assert any("version-1 dump" in n for n in a["notes"])
