"""SpecForge training data whose slot count does not fit (issue 32, kind 7): K=4 training slots for a K=3 draft is
one clear error (exit 2), samples of two captures mixed are one clear error, and a server serving another count than
training used is said in a note besides the finding."""
import json
import os

import pytest
import torch

from doctor_helpers import assert_clean_error, cli, demo_fast
from dump_helpers import TeacherForced, write_training

DECL = ["Embedding", "LayerOutput(0)", "LayerOutput(3)", "LayerOutput(5)"]


@pytest.fixture(scope="module")
def tf(tmp_path_factory):
    res, out = demo_fast()
    root = tmp_path_factory.mktemp("slots")
    prompts = json.load(open(os.path.join(out, "prompts.json")))[:3]
    t = TeacherForced(prompts, os.path.join(out, "draft"), 6)
    dump4 = str(root / "dump4")
    t.write_dump(dump4, [0, 1, 4, 6], list(range(9)), declared=DECL)
    dump3 = str(root / "dump3")
    t.write_dump(dump3, [0, 1, 4], list(range(9)), declared=DECL[:3])
    tr4 = str(root / "tr4")
    write_training(tr4, t.sent, t.stack, [0, 1, 4, 6], dtype=torch.float32)
    return {"t": t, "root": root, "out": out, "dump4": dump4, "dump3": dump3, "tr4": tr4}


def test_four_training_slots_for_a_three_tap_draft_is_bad_input(tf):
    """Before: the K=4 samples against a K=4 server passed ('captures what training used', exit 0) although the
    draft given has 3 taps: it cannot have been trained on them."""
    out = tf["out"]
    code, text, err = cli("doctor", "fingerprint", "--training-data", tf["tr4"], "--captured", tf["dump4"],
                          "--draft-config", os.path.join(out, "draft", "config.json"),
                          "--target-config", os.path.join(out, "target", "config.json"))
    assert_clean_error(code, text, err, "holds 4 slots", "declares 3 taps", "another draft")


def test_samples_of_two_captures_are_bad_input(tf):
    d = str(tf["root"] / "mixed")
    t = tf["t"]
    write_training(d, t.sent[:1], t.stack[:1], [0, 1, 4, 6], dtype=torch.float32)
    three = str(tf["root"] / "three")
    write_training(three, t.sent, t.stack, [0, 1, 4], dtype=torch.float32)
    # the second and third samples of another capture (3 slots) next to the first (4 slots)
    for name in sorted(os.listdir(os.path.join(three, "rows_0-5000")))[1:]:
        os.replace(os.path.join(three, "rows_0-5000", name), os.path.join(d, "rows_0-5000", name))
    code, text, err = cli("doctor", "fingerprint", "--training-data", d, "--captured", tf["dump4"])
    assert_clean_error(code, text, err, "holds 3 slots", "the samples before it 4", "two different captures")


def test_a_server_serving_fewer_slots_than_training_is_named(tf):
    code, text, err = cli("doctor", "fingerprint", "--training-data", tf["tr4"], "--captured", tf["dump3"])
    assert code == 1 and "the training samples hold 4 slots, the server serves 3" in text, text + err
