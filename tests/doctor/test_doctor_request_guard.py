"""Nothing the doctor sends may harm the server it checks (issue 32, kind 5): every request is checked first against
the target config's vocabulary and the server's reported max_req_input_len / context_length; an id outside the
vocabulary is never sent (it kills SGLang's scheduler). The server here is tests/doctor/fake_sglang.py over real
HTTP; it records every request it would have died of in ``harm``."""
import json
import os

import pytest
import torch

from doctor_helpers import assert_clean_error, cli, demo_fast
from dump_helpers import TeacherForced, write_checkpoint, write_training
from fake_sglang import FakeSGLang
from eagle3_capture.doctor.sglang_model.request_guard import PROBE

FLAGS = ("--speculative-algorithm EAGLE3 --speculative-num-steps 3 --speculative-eagle-topk 1 "
         "--speculative-num-draft-tokens 4")
DECL = ["Embedding", "LayerOutput(0)", "LayerOutput(3)"]


@pytest.fixture(scope="module")
def tf(tmp_path_factory):
    res, out = demo_fast()
    root = tmp_path_factory.mktemp("guard")
    prompts = json.load(open(os.path.join(out, "prompts.json")))[:3]
    t = TeacherForced(prompts, os.path.join(out, "draft"), 6)
    pp = root / "prompts.json"
    pp.write_text(json.dumps(prompts))
    return {"t": t, "root": root, "out": out, "prompts": str(pp), "draft": os.path.join(out, "draft"),
            "configs": ("--draft-config", os.path.join(out, "draft", "config.json"),
                        "--target-config", os.path.join(out, "target", "config.json"))}


def _training(tf, name, edit=None):
    t = tf["t"]
    seqs = [s.clone() for s in t.sent]
    if edit is not None:
        edit(seqs)
    d = str(tf["root"] / name)
    write_training(d, seqs, t.stack, [0, 1, 4], dtype=torch.float32)
    return d


def _dir(tmp_path):
    """The server's dump directory (it exists before the server writes to it)."""
    d = tmp_path / "dump"
    d.mkdir(exist_ok=True)
    return str(d)


def _fingerprint(tf, srv, data, dump, *extra):
    return cli("doctor", "fingerprint", "--training-data", data, "--server", srv.url, "--captured", dump,
               "--timeout", 20, *extra)


def test_an_out_of_vocabulary_training_id_is_never_sent(tf, tmp_path):
    """Before: the sample's id 100000 (vocabulary 256) went out and SGLang's scheduler died of an IndexError."""
    def edit(seqs):
        seqs[1][3] = 100000
    data = _training(tf, "oov", edit)
    with FakeSGLang(tf["t"], dump_dir=_dir(tmp_path)) as srv:
        code, out, err = _fingerprint(tf, srv, data, _dir(tmp_path), *tf["configs"])
    assert_clean_error(code, out, err, "token id 100000 is outside the target's vocabulary (256)", "not sent")
    assert not srv.harm and srv.requests == [PROBE]  # no sample sent: only the vocabulary probe, harmless


def test_without_a_vocabulary_nothing_is_sent(tf, tmp_path):
    """No local source and a server that reveals none: nothing is sent. (A server that reveals its vocabulary bounds
    the ids by it: the next test.)"""
    data = _training(tf, "clean")
    with FakeSGLang(tf["t"], dump_dir=_dir(tmp_path), checks_logit_bias=False) as srv:
        code, out, err = _fingerprint(tf, srv, data, _dir(tmp_path))
    assert_clean_error(code, out, err, "vocabulary is not known", "--target-config")
    assert not srv.harm and srv.requests == [PROBE]


def test_without_a_local_vocabulary_the_servers_own_bounds_the_ids(tf, tmp_path):
    def edit(seqs):
        seqs[0][2] = 200
    data = _training(tf, "oov_server", edit)
    with FakeSGLang(tf["t"], dump_dir=_dir(tmp_path), vocab=128) as srv:
        code, out, err = _fingerprint(tf, srv, data, _dir(tmp_path))
    assert_clean_error(code, out, err, "token id 200 is outside the target's vocabulary (128)", "not sent")
    assert not srv.harm and srv.requests == [PROBE]


@pytest.mark.parametrize("served_vocab", [128, 512])
def test_a_checkpoint_vocabulary_the_server_does_not_share_sends_nothing(tf, tmp_path, served_vocab):
    """Issue 42: --target-config said 256, the served model has 128: ids 128-255 reached /generate (a real SGLang
    server crashes on them). The server's own vocabulary, revealed by a probe that cannot harm it, is checked first;
    where the sources disagree nothing is sent."""
    data = _training(tf, "clean_vs")
    with FakeSGLang(tf["t"], dump_dir=_dir(tmp_path), vocab=served_vocab) as srv:
        code, out, err = _fingerprint(tf, srv, data, _dir(tmp_path), *tf["configs"])
    assert_clean_error(code, out, err, f"the server's vocabulary is {served_vocab}", "says 256", "nothing sent")
    assert not srv.harm and srv.requests == [PROBE]
    with FakeSGLang(tf["t"], dump_dir=_dir(tmp_path), vocab=served_vocab) as srv:
        code, out, err = _online(tf, srv, _dir(tmp_path))
    assert_clean_error(code, out, err, f"the server's vocabulary is {served_vocab}", "says 256", "nothing sent")
    assert not srv.harm and srv.requests == [PROBE]


def test_local_sources_that_disagree_send_nothing_at_all(tf, tmp_path):
    """The draft's config names its target's vocabulary: a --target-checkpoint config saying otherwise is another
    model's, and nothing at all is sent (not even the probe)."""
    cfg = json.load(open(os.path.join(tf["out"], "target", "config.json")))
    cfg["vocab_size"] = 300
    emb = tf["t"].side.target.model.get_input_embeddings().weight.detach()
    ck = write_checkpoint(str(tmp_path / "ck"), {"model.embed_tokens.weight": emb}, cfg, shards=1)
    with FakeSGLang(tf["t"], dump_dir=_dir(tmp_path)) as srv:
        code, out, err = _online(tf, srv, _dir(tmp_path), "--target-checkpoint", ck)
    assert_clean_error(code, out, err, "the target's vocabulary is not agreed", "says 300", "says 256",
                       "nothing sent")
    assert not srv.harm and not [r for r in srv.requests if "input_ids" in r]


def test_an_out_of_vocabulary_id_in_the_teacher_forced_answer_is_refused(tf, tmp_path):
    """Issue 42: ids outside the vocabulary in the server's teacher-forced input_top_logprobs were taken, and the
    verdict blamed "sampling, dtype, or a different target"; now the answer is refused for what it is."""
    with FakeSGLang(tf["t"], dump_dir=_dir(tmp_path), top_offset=1000) as srv:
        code, out, err = _online(tf, srv, _dir(tmp_path))
    assert_clean_error(code, out, err, "input_top_logprobs", "outside the target's vocabulary (256)",
                       "the server runs another model")
    assert "sampling, dtype" not in out + err and not srv.harm


def test_a_sample_longer_than_the_servers_input_limit_is_not_sent(tf, tmp_path):
    data = _training(tf, "clean2")
    with FakeSGLang(tf["t"], dump_dir=_dir(tmp_path), max_req_input_len=20) as srv:
        code, out, err = _fingerprint(tf, srv, data, _dir(tmp_path), *tf["configs"])
    assert_clean_error(code, out, err, "max_req_input_len 20", "not sent")
    assert not srv.harm and srv.requests == [PROBE]  # only the harmless vocabulary probe


def test_clean_samples_are_sent_and_pass(tf, tmp_path):
    data = _training(tf, "clean3")
    with FakeSGLang(tf["t"], dump_dir=_dir(tmp_path), declared=DECL) as srv:
        code, out, err = _fingerprint(tf, srv, data, _dir(tmp_path), *tf["configs"])
    assert code == 0 and "the server captures what training used" in out, out + err
    assert not srv.harm


def _online(tf, srv, dump, *extra):
    return cli("doctor", "online", "--server", srv.url, "--prompts", tf["prompts"], "--draft", tf["draft"],
               "--dump", dump, "--new-tokens", 6, "--server-args", FLAGS, "--no-progress", "--device", "cpu",
               "--threads", 1, "--timeout", 20, *extra)


def test_online_checks_the_servers_context_before_sending(tf, tmp_path):
    """A prompt + new tokens past the server's max_req_input_len (the teacher-forced pass sends prompt + outputs +
    S + 1) is refused before anything is sent."""
    n = max(len(p) for p in json.load(open(tf["prompts"])))
    with FakeSGLang(tf["t"], dump_dir=_dir(tmp_path), max_req_input_len=n + 3) as srv:
        code, out, err = _online(tf, srv, _dir(tmp_path))
    assert_clean_error(code, out, err, f"max_req_input_len {n + 3}", "not sent")
    assert not srv.harm


def test_online_never_sends_back_an_answer_outside_the_vocabulary(tf, tmp_path):
    """Before: the server's out-of-vocabulary answer was called 'not lossless' (a recorded file), or sent back in
    the teacher-forced request (a live server: its scheduler died)."""
    with FakeSGLang(tf["t"], dump_dir=_dir(tmp_path), answer_offset=1000) as srv:
        code, out, err = _online(tf, srv, _dir(tmp_path))
    assert_clean_error(code, out, err, "output token id", "outside the target's vocabulary (256)")
    assert "not lossless" not in out + err and not srv.harm


@pytest.mark.sglang
@pytest.mark.parametrize("vocab", [2, 256, 163840])
def test_the_vocabulary_probe_against_sglangs_own_checks(vocab):
    """The probe as SGLang's real code meets it: its /generate contract gate admits the body, and
    SamplingParams.verify -- which the tokenizer manager runs before anything reaches the scheduler -- refuses its
    logit_bias on id -1 with the line that names the vocabulary, which the guard reads back exactly."""
    from sglang.srt.entrypoints.api_contract import generate_contract_error
    from sglang.srt.sampling.sampling_params import SamplingParams

    from eagle3_capture.doctor.sglang_model.request_guard import REVEALED

    assert generate_contract_error(PROBE) is None
    with pytest.raises(ValueError) as ei:
        SamplingParams(**PROBE["sampling_params"]).verify(vocab)
    m = REVEALED.search(str(ei.value))
    assert m is not None and int(m.group(1)) + 1 == vocab, str(ei.value)
    SamplingParams(temperature=0, max_new_tokens=1, logit_bias={str(vocab - 1): 0.0}).verify(vocab)  # in range: fine
