"""The doctor with only the draft: `online` and `accept` whose target side is the server's own dump (the plugin's
version-2 records of the doctor's teacher-forced requests), against the same commands with the transformers
target. The records are written here field for field as the dump format says (tests/doctor/dump_helpers.py); the
engine tests run the real plugin."""
import json
import os

import pytest
import torch

from doctor_helpers import assert_clean_error, cli, demo_fast, write_json
from dump_helpers import TeacherForced, write_checkpoint

FLAGS = ("--speculative-algorithm EAGLE3 --speculative-num-steps 3 --speculative-eagle-topk 1 "
         "--speculative-num-draft-tokens 4")
N = 10
DECLARED = [0, 1, 4]   # the demo draft's taps [Embedding, LayerOutput(0), LayerOutput(3)] as layer inputs


@pytest.fixture(scope="module")
def tf(tmp_path_factory):
    res, out = demo_fast()
    root = tmp_path_factory.mktemp("notarget")
    prompts = json.load(open(os.path.join(out, "prompts.json")))[:5]
    prompts[4] = prompts[4][:20]  # two prompt lengths: two batches
    t = TeacherForced(prompts, os.path.join(out, "draft"), N)
    ppath = write_json(root / "prompts.json", prompts)
    return {"t": t, "root": root, "prompts": ppath, "draft": os.path.join(out, "draft"), "out": out,
            "responses": t.write_responses(str(root / "responses.jsonl"))}


def _dump(tf, name, served=DECLARED, stream=DECLARED, **kw):
    d = str(tf["root"] / name)
    if not os.path.isdir(d):
        tf["t"].write_dump(d, served, stream, **kw)
    return d


def _online(tf, *extra, server=None):
    return cli("doctor", "online", "--server", server or tf["responses"], "--prompts", tf["prompts"], "--draft",
               tf["draft"], "--server-args", FLAGS, "--no-progress", "--device", "cpu", "--threads", 1, *extra)


@pytest.fixture(scope="module")
def with_target(tf):
    out = str(tf["root"] / "with_target.json")
    code, text, err = _online(tf, "--target", "demo", "--json", out)
    assert code == 0, text + err
    return json.load(open(out))


def test_online_without_target_equals_the_transformers_prediction(tf, with_target, tmp_path):
    dump = _dump(tf, "dump_declared", chunk=13)  # rows of each request over several forwards
    code, text, err = _online(tf, "--dump", dump, "--json", tmp_path / "o.json")
    assert code == 0, text + err
    j = json.load(open(tmp_path / "o.json"))
    assert j["ok"] and j["verdict"].startswith("matches") and all(j["lossless"])
    for key in ("online", "predicted", "step_acceptance", "tau"):
        assert j[key] == with_target[key], key
    assert j["target"].startswith("recorded dump")
    slots = j["fingerprint"]["slots"]
    assert [s["verdict"] for s in slots] == ["exact"] * 3 and [s["best"] for s in slots] == DECLARED
    assert "fingerprint of the served slots" in text and "verdict: matches" in text


def test_accept_on_the_recorded_dump_equals_accept_on_the_model(tf, tmp_path):
    dump = _dump(tf, "dump_declared_2")
    common = ("--draft", tf["draft"], "--prompts", tf["prompts"], "--server-args", FLAGS, "--new-tokens", N,
              "--no-progress", "--device", "cpu", "--threads", 1)
    code, text, err = cli("doctor", "accept", "--hidden-states", dump, "--json", tmp_path / "d.json", *common)
    assert code == 0, text + err
    code2, text2, err2 = cli("doctor", "accept", "--target", "demo", "--json", tmp_path / "t.json", *common)
    assert code2 == 0, text2 + err2
    d, t = json.load(open(tmp_path / "d.json")), json.load(open(tmp_path / "t.json"))
    assert d["served"] == t["served"] and d["metrics"] == t["metrics"] and d["tau"] == t["tau"]
    # without --new-tokens: as many as the dump holds (N: the doctor sent N served + steps + 1)
    code, text, err = cli("doctor", "accept", "--hidden-states", dump, "--json", tmp_path / "d2.json",
                          *[a for a in common if a not in ("--new-tokens", N)])
    assert code == 0, text + err
    assert json.load(open(tmp_path / "d2.json"))["served"] == t["served"]


def test_a_server_feeding_other_layers_is_caught_and_named(tf, with_target, tmp_path):
    """The served slots are layer inputs [1, 4, 7] (no embedding, every slot one tap later); the stream holds every
    layer input. The prediction still uses the declared taps from the stream, so the report does not predict the
    miswired server (exit 1), and the fingerprint names each slot."""
    L = tf["t"].L
    dump = _dump(tf, "dump_miswired", served=[1, 4, 7], stream=list(range(L + 1)))
    code, text, err = _online(tf, "--dump", dump, "--json", tmp_path / "o.json")
    assert code == 1, text + err
    j = json.load(open(tmp_path / "o.json"))
    assert j["predicted"] == with_target["predicted"]
    assert [(s["verdict"], s["best"], s["expected"]) for s in j["fingerprint"]["slots"]] == \
        [("exact", 1, 0), ("exact", 4, 1), ("exact", 7, 4)]
    assert "served slot 0 holds LayerOutput(0) (bit for bit), the draft declares Embedding" in j["verdict"]


def test_the_prediction_never_reads_the_served_slots(tf, tmp_path):
    """Served slots that are noise: the prediction (from the stream) is unchanged; the fingerprint says no layer."""
    d = str(tmp_path / "noise")
    g = torch.Generator().manual_seed(3)
    paths = tf["t"].write_dump(d, DECLARED, DECLARED)
    for p in paths:
        rec = torch.load(p)
        rec["aux"] = torch.randn(rec["aux"].shape, generator=g)
        torch.save(rec, p)
    code, text, err = _online(tf, "--dump", d, "--json", tmp_path / "o.json")
    assert code == 1, text + err
    j = json.load(open(tmp_path / "o.json"))
    assert all(j["lossless"]) and j["online"] == j["predicted"]
    assert [s["verdict"] for s in j["fingerprint"]["slots"]] == ["none"] * 3
    assert "is no layer of the server's stream" in j["verdict"]


def test_embedding_from_the_checkpoint_shard_alone(tf, with_target, tmp_path):
    """A draft without embed_tokens: the doctor reads it alone from the target checkpoint's shard (Kimi-K2.5's
    language_model. prefix), and the stream's embedding output is checked bit for bit against its rows."""
    from safetensors.torch import load_file, save_file

    draft = str(tmp_path / "draft_noembed")
    os.makedirs(draft)
    sd = load_file(os.path.join(tf["draft"], "model.safetensors"))
    emb = sd.pop("embed_tokens.weight")
    save_file(sd, os.path.join(draft, "model.safetensors"))
    with open(os.path.join(tf["draft"], "config.json")) as f, open(os.path.join(draft, "config.json"), "w") as g:
        g.write(f.read())
    target = tf["t"].side.target.model
    tensors = {"language_model.model.embed_tokens.weight": emb,
               "language_model.model.layers.61.embed_tokens.weight": torch.zeros_like(emb),  # an MTP layer's copy
               "language_model.lm_head.weight": target.lm_head.weight.detach(),
               "vision_tower.patch.weight": torch.randn(4, 4)}
    cfg = {"architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25",
           "text_config": {**tf["t"].side.target.config_dict, "architectures": ["DeepseekV3ForCausalLM"]}}
    ck = write_checkpoint(str(tmp_path / "ck"), tensors, cfg, shards=3)
    dump = _dump(tf, "dump_declared_3")
    args = ("--server", tf["responses"], "--prompts", tf["prompts"], "--server-args", FLAGS, "--no-progress",
            "--device", "cpu", "--threads", 1, "--dump", dump)
    code, text, err = cli("doctor", "online", "--draft", draft, *args)
    assert_clean_error(code, text, err, "no embed_tokens.weight", "--target-checkpoint")
    code, text, err = cli("doctor", "online", "--draft", draft, "--target-checkpoint", ck, "--json",
                          tmp_path / "o.json", *args)
    assert code == 0, text + err
    j = json.load(open(tmp_path / "o.json"))
    assert j["predicted"] == with_target["predicted"]
    assert [e["ok"] for e in j["fingerprint"]["embedding"]] == [True, True]
    assert "equals embed_tokens[input_ids] bit for bit" in text


def test_bad_dumps_are_one_line_each(tf, tmp_path):
    t = tf["t"]
    good = _dump(tf, "dump_declared_4")
    # a truncated record
    d = str(tmp_path / "trunc")
    os.makedirs(d)
    src = sorted(os.listdir(good))[0]
    data = open(os.path.join(good, src), "rb").read()
    open(os.path.join(d, src), "wb").write(data[: len(data) // 2])
    assert_clean_error(*_online(tf, "--dump", d), "not a readable dump record", src)
    # a record of another format version
    d = str(tmp_path / "v3")
    t.write_dump(d, DECLARED, DECLARED, format="eagle3-capture-dump/3")
    assert_clean_error(*_online(tf, "--dump", d), "eagle3-capture-dump/3")
    # tokens that do not align: the dump's requests are another prompt's
    d = str(tmp_path / "other")
    other = TeacherForced([[5] * 32], tf["draft"], N)
    other.write_dump(d, DECLARED, DECLARED)
    assert_clean_error(*_online(tf, "--dump", d), "no dumped request of the doctor begins with prompt 0",
                       "do not align")
    # a dump from another model: the checkpoint's config says another width
    cfg = dict(t.side.target.config_dict, hidden_size=2 * t.H)
    ck = write_checkpoint(str(tmp_path / "ck"), {"model.embed_tokens.weight": torch.zeros(256, 2 * t.H)}, cfg)
    assert_clean_error(*_online(tf, "--dump", good, "--target-checkpoint", ck), "from another model")
    # a stream without the declared layers
    d = str(tmp_path / "nolayer")
    t.write_dump(d, [1, 4, 7], [1, 4, 7])
    code, out, err = _online(tf, "--dump", d)  # a finding about the deployment (issue 32), not bad input
    assert code == 1 and "another draft's declaration" in out and "EAGLE3_CAPTURE_DUMP_STREAM" in out, out + err
    # a chunk missing from a request
    d = str(tmp_path / "gap")
    paths = t.write_dump(d, DECLARED, DECLARED, chunk=10, per_record=1)
    os.remove(paths[1])
    assert_clean_error(*_online(tf, "--dump", d), "missing")
    # neither --target nor --dump; both
    assert_clean_error(*_online(tf), "--dump DIR")
    assert_clean_error(*_online(tf, "--dump", good, "--target", "demo"), "one or the other")


def test_teacher_forced_pass_through_a_server(tf, tmp_path):
    """ServerTarget.teacher_force against a stand-in for the server's HTTP answers (`post`): the extension, then
    the teacher-forced prefill with its rid and input logprobs; the dump records of those rids appear a moment later
    (written in the background, as the plugin does), split in chunks; the target side then equals the recorded one."""
    import threading
    import time

    from dump_helpers import record_path, write_v2_record
    from eagle3_capture.doctor.target_side.server_side import ServerTarget

    t = tf["t"]
    prompts = t.prompts
    outputs = [r["output_ids"] for r in t.responses()]
    d = str(tmp_path / "dump")
    sent = []

    def post(url, body, timeout):
        ids = body["input_ids"]
        i = next(k for k, p in enumerate(prompts) if ids[:len(p)] == p)
        full = t.sent[i].tolist()
        n = body["sampling_params"]["max_new_tokens"]
        if "rid" not in body:  # the extension: the greedy continuation of prompt + served tokens
            return {"output_ids": full[len(ids):len(ids) + n], "meta_info": {}}
        assert body["rid"].startswith("eagle3-doctor-") and body["logprob_start_len"] == 0 and ids == full
        sent.append(body["rid"])
        greedy = t.greedy[i].tolist()
        T = len(ids)

        def dump_later(rid=body["rid"], i=i):
            time.sleep(0.3)
            for c, s in enumerate(range(0, T, 20)):
                e = min(T, s + 20)
                st = t.stack[i][s:e]
                write_v2_record(record_path(d, 100 * i + c), seq=100 * i + c, mode="EXTEND",
                                input_ids=t.sent[i][s:e], positions=torch.arange(s, e),
                                requests=[{"rid": rid, "row_start": 0, "row_end": e - s, "prefix_len": s}],
                                aux=st[:, DECLARED].reshape(e - s, -1), layers_to_capture=DECLARED,
                                stream=st[:, DECLARED].permute(1, 0, 2).contiguous(), stream_layer_inputs=DECLARED,
                                num_layers=t.L, hidden_size=t.H)

        threading.Thread(target=dump_later).start()
        return {"output_ids": [greedy[T - 1]], "meta_info": {
            "input_top_logprobs": [None] + [[[-1.0, g, None]] for g in greedy[:T - 1]]}}

    os.makedirs(d)
    side = ServerTarget.teacher_force("http://stand-in", d, prompts, outputs, 3, post, timeout=30, concurrency=2,
                                      progress=False)
    assert len(sent) == len(prompts) and len(set(sent)) == len(prompts)
    from eagle3_capture.doctor.replay.evaluate import evaluate, served_walks
    from eagle3_capture.doctor.sglang_model.flag_rules import SpecResolution

    runs = evaluate(side, t.draft_side.draft, prompts, t.draft_side.taps, 3, N, SpecResolution(3, 1, 4), 8, False)
    assert [(s.verify_ct, s.histogram) for s in served_walks(runs, N)] == [(s.verify_ct, s.histogram)
                                                                            for s in t.served]
    for run, r in zip(runs, t.responses()):  # the lossless check compares with the server's own argmax
        assert run.expected[len(run.prompt):len(run.prompt) + N].tolist() == r["output_ids"]


def test_teacher_forced_answers_that_are_not_usable(tmp_path):
    from eagle3_capture.doctor.common import DoctorError
    from eagle3_capture.doctor.target_side.server_side import greedy_from_logprobs

    ok = {"output_ids": [5], "meta_info": {"input_top_logprobs": [None, [[-1.0, 3, None]], [[-2.0, 4, None]]]}}
    assert greedy_from_logprobs(ok, "x", 3).tolist() == [3, 4, 5]
    for bad, needle in (({"output_ids": [5], "meta_info": {}}, "input_top_logprobs"),
                        ({"output_ids": [5], "meta_info": {"input_top_logprobs": [None, [[-1.0]], None]}},
                         r"input_top_logprobs\[1\]"),
                        ({"meta_info": ok["meta_info"]}, "no output_ids"), ("nope", "no meta_info")):
        with pytest.raises(DoctorError, match=needle):
            greedy_from_logprobs(bad, "x", 3)
    from eagle3_capture.doctor.target_side.server_side import wait_for_requests

    with pytest.raises(DoctorError, match="are not in it"):
        wait_for_requests(str(tmp_path), ["eagle3-doctor-x-0"], [torch.arange(4)], 0.5)
