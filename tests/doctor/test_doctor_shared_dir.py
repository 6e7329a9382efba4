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
