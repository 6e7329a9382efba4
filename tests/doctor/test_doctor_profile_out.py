"""--profile-out of doctor accept: one small run on the demo pair writes a profile whose histogram is the report's
predicted one (read back by acceptance.profile.read), with the server flags, prompts, draft and target, and the text
says where it went; a path that cannot be written ends the command with exit 2 and one line before any model
loads."""
from __future__ import annotations

import json
import os

import pytest

from doctor_helpers import assert_clean_error, cli, demo_fast, write_json
from eagle3_capture.acceptance import profile as acceptance_profile
from eagle3_capture.doctor.common import DoctorError

FLAGS = ("--speculative-algorithm EAGLE3 --speculative-num-steps 3 --speculative-eagle-topk 1 "
         "--speculative-num-draft-tokens 4")


def test_unwritable_profile_out_exits_2_before_the_work(tmp_path):
    for bad in ("/proc/nope/p.json", str(tmp_path)):
        code, out, err = cli("doctor", "accept", "--target", "demo", "--draft", tmp_path / "no-draft", "--prompts",
                             tmp_path / "no-prompts.json", "--profile-out", bad)
        assert_clean_error(code, out, err, "--profile-out")
    # the API path (Options built in code) checks it too, before the draft or the prompts are looked at
    from eagle3_capture.doctor.commands import accept, online

    with pytest.raises(DoctorError, match="--profile-out"):
        accept.run(accept.Options(draft=str(tmp_path / "no-draft"), prompts="none", target="demo", device="cpu",
                                  profile_out=str(tmp_path)))
    with pytest.raises(DoctorError, match="--profile-out"):
        online.run(online.Options(server="http://127.0.0.1:9", prompts="none", draft="none", target="demo",
                                  device="cpu", profile_out="/proc/nope/p.json"))


def test_accept_writes_the_predicted_profile(tmp_path):
    res, out = demo_fast()
    prompts = write_json(str(tmp_path / "prompts.json"), json.load(open(os.path.join(out, "prompts.json")))[:4])
    code, text, err = cli("doctor", "accept", "--target", "demo", "--draft", os.path.join(out, "draft"),
                          "--prompts", prompts, "--server-args", FLAGS, "--new-tokens", 10, "--json",
                          tmp_path / "a.json", "--profile-out", tmp_path / "sub" / "profile.json", "--no-progress",
                          "--device", "cpu", "--threads", 1)
    assert code == 0, text + err
    j = json.load(open(tmp_path / "a.json"))
    path = str(tmp_path / "sub" / "profile.json")
    prof = acceptance_profile.read(path)
    predicted = j["served"]["correct_drafts_histogram"]
    assert list(prof.histogram) == predicted + [0] * (4 - len(predicted))
    assert prof.verifies == j["served"]["verify_ct"] and prof.prompts == 4
    assert (prof.speculative.num_steps, prof.speculative.eagle_topk, prof.speculative.num_draft_tokens) == (3, 1, 4)
    assert prof.source == "doctor accept" and prof.draft == os.path.join(out, "draft") and prof.target
    assert j["profile"]["path"] == path and j["profile"]["correct_drafts_histogram"] == list(prof.histogram)
    assert f"profile written to {path}" in text
    per = ", ".join(f"{i + 1}: {a:.3f}" for i, a in enumerate(prof.acceptance()) if a is not None)
    assert all(f"{i + 1}: {a:.3f} (n=" in text for i, a in enumerate(prof.acceptance()) if a is not None), per
