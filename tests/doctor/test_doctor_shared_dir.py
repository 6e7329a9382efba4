"""A dump directory that several servers (or declarations) write (issue 32, kind 1, the doctor's part): the doctor
says so and names every declaration, instead of a verdict on the mixture. Before, `fingerprint --captured DIR` on a
directory mixing two declarations said "every served slot holds the declared tap", exit 0, and the fingerprint
against a reference passed it without a word."""
import json
import os
import shutil

import pytest

from doctor_helpers import cli, demo_fast
from dump_helpers import TeacherForced

DECL = ["Embedding", "LayerOutput(0)", "LayerOutput(3)"]
OTHER = ["Embedding", "LayerOutput(0)", "LayerOutput(1)"]


@pytest.fixture(scope="module")
def demo():
    return demo_fast()[1]


def test_a_stream_dump_mixing_two_declarations_names_both(demo, tmp_path):
    prompts = json.load(open(os.path.join(demo, "prompts.json")))[:2]
    t = TeacherForced(prompts, os.path.join(demo, "draft"), 6)
    d = str(tmp_path / "shared")
    t.write_dump(d, [0, 1, 4], list(range(9)), run="replica-a", declared=DECL)
    t.write_dump(d, [0, 1, 2], list(range(9)), run="replica-b", declared=OTHER, start_seq=50)
    code, out, err = cli("doctor", "fingerprint", "--captured", d, "--json", tmp_path / "f.json")
    assert code == 1, out + err
    verdict = out.strip().splitlines()[-1]
    assert "holds the records of 2 declarations" in verdict and str(DECL) in verdict and str(OTHER) in verdict, out
    assert "every served slot holds the declared tap" in verdict  # each group judged on its own: both wired right
    assert len(json.load(open(tmp_path / "f.json"))["mixed_declarations"]) == 2
    # one declaration alone still passes
    solo = str(tmp_path / "solo")
    t.write_dump(solo, [0, 1, 4], list(range(9)), run="replica-a", declared=DECL)
    code, out, err = cli("doctor", "fingerprint", "--captured", solo)
    assert code == 0, out + err


def test_several_servers_of_one_declaration_are_said(demo, tmp_path):
    prompts = json.load(open(os.path.join(demo, "prompts.json")))[:2]
    t = TeacherForced(prompts, os.path.join(demo, "draft"), 6)
    d = str(tmp_path / "shared")
    t.write_dump(d, [0, 1, 4], list(range(9)), run="replica-a", declared=DECL, pid=11)
    t.write_dump(d, [0, 1, 4], list(range(9)), run="replica-b", declared=DECL, pid=12)
    code, out, err = cli("doctor", "fingerprint", "--captured", d)
    assert code == 0, out + err  # both wired right: a note, not a finding
    assert "the records come from 2 writing processes with one capture declaration" in out, out


def test_a_reference_fingerprint_of_a_mixed_directory_is_a_finding(demo, tmp_path):
    d = tmp_path / "mixed"
    d.mkdir()
    for n in ("captured_correct", "captured_miswired"):
        shutil.copy(os.path.join(demo, f"{n}.safetensors"), d / f"{n}.safetensors")
    code, out, err = cli("doctor", "fingerprint", "--reference", os.path.join(demo, "reference.safetensors"),
                         "--captured", d)
    assert code == 1, out + err
    assert "fingerprint-mixed-declarations" in out and "[0, 1, 4]" in out and "[1, 4, 7]" in out, out
    code, out, err = cli("doctor", "fingerprint", "--reference", os.path.join(demo, "reference.safetensors"),
                         "--captured", os.path.join(demo, "captured_correct.safetensors"))
    assert code == 0, out + err


# ----------------------------------------------------------------------------------------------------------------
# issue 42: a miswired replica whose records reuse a correct replica's doctor rids
# ----------------------------------------------------------------------------------------------------------------

CHAIN = ("--speculative-algorithm EAGLE3 --speculative-num-steps 3 --speculative-eagle-topk 1 "
         "--speculative-num-draft-tokens 4")
V3 = "eagle3-capture-dump/3"


@pytest.fixture(scope="module")
def forced(demo, tmp_path_factory):
    prompts = json.load(open(os.path.join(demo, "prompts.json")))[:2]
    t = TeacherForced(prompts, os.path.join(demo, "draft"), 6)
    root = tmp_path_factory.mktemp("forced")
    pp = str(root / "prompts.json")
    json.dump(prompts, open(pp, "w"))
    return t, pp, t.write_responses(str(root / "responses.jsonl")), os.path.join(demo, "draft")


def _replicas(t, d, miswired_ltc, miswired_stack_shift=0, v3=True):
    """The correct replica (slots at layer inputs [0, 1, 4]) and a miswired one, both writing the doctor's rids of
    one run ("replica-a") into `d`; version 3 (two server ids) or version 2 (one pid: PID namespaces)."""
    def who(server):  # the record's writing process (version 3): pid 6 in both PID namespaces
        return dict(format=V3, server=server, host="node") if v3 else {}
    t.write_dump(d, [0, 1, 4], list(range(9)), run="replica-a", declared=DECL, pid=6, **who("a" * 16))
    holds = [i + miswired_stack_shift for i in miswired_ltc]  # what the slots really hold
    t.write_dump(d, miswired_ltc, list(range(9)), run="replica-a", declared=DECL, pid=6, start_seq=50,
                 holds=holds, **who("b" * 16))


def test_fingerprint_sees_a_miswired_replica_reusing_rids(forced, tmp_path):
    """Before: its records were dropped in stitching ("the same row written twice") and the fingerprint said every
    served slot holds the declared tap, exit 0."""
    t, _, _, _ = forced
    d = str(tmp_path / "v3")
    _replicas(t, d, [0, 2, 5])   # captures one layer later than declared, and says so
    code, out, err = cli("doctor", "fingerprint", "--captured", d)
    assert code == 1, out + err
    assert "holds the records of 2 declarations" in out and "[0, 2, 5]" in out and "[0, 1, 4]" in out, out
    # one that captures one layer later and labels its slots as declared: judged with the other, and found
    d = str(tmp_path / "v3_hidden")
    _replicas(t, d, [0, 1, 4], miswired_stack_shift=1)
    code, out, err = cli("doctor", "fingerprint", "--captured", d)
    assert code == 1 and "every served slot holds the declared tap" not in out, out + err


def test_online_dump_sees_a_miswired_replica_reusing_rids(forced, tmp_path):
    t, pp, resp, draft = forced
    d = str(tmp_path / "v3")
    _replicas(t, d, [0, 2, 5])
    code, out, err = cli("doctor", "online", "--server", resp, "--prompts", pp, "--draft", draft, "--dump", d,
                         "--server-args", CHAIN, "--no-progress", "--device", "cpu", "--threads", 1)
    assert code == 1, out + err
    assert "dumped by servers that capture differently" in out and "[0, 2, 5]" in out, out
    # the same declaration and labels, the slots one layer later: the replay reads one, the fingerprint both
    d = str(tmp_path / "v3_hidden")
    _replicas(t, d, [0, 1, 4], miswired_stack_shift=1)
    code, out, err = cli("doctor", "online", "--server", resp, "--prompts", pp, "--draft", draft, "--dump", d,
                         "--server-args", CHAIN, "--no-progress", "--device", "cpu", "--threads", 1)
    assert code == 1 and "every served slot holds the declared tap" not in out, out + err
    assert "the others' slots are fingerprinted too" in out, out


def test_version_2_replicas_sharing_a_pid_and_rids_are_refused(forced, tmp_path):
    """Version-2 records carry only a pid, which replicas in PID namespaces share: their rows of one rid cannot be
    told apart, and a position captured two ways is refused with one line saying what to do."""
    t, pp, resp, draft = forced
    d = str(tmp_path / "v2")
    _replicas(t, d, [0, 2, 5], v3=False)
    code, out, err = cli("doctor", "fingerprint", "--captured", d)
    assert code == 2 and len(err.strip().splitlines()) == 1, out + err
    assert "two records of one writer disagree at position" in err and "own EAGLE3_CAPTURE_DUMP directory" in err
    code, out, err = cli("doctor", "accept", "--hidden-states", d, "--prompts", pp, "--draft", draft,
                         "--server-args", CHAIN, "--no-progress", "--device", "cpu", "--threads", 1)
    assert code == 2 and "two records of one writer disagree at position" in err, out + err
