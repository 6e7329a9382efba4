"""The fingerprint without a reference model: the server's full-stream dump names each served slot's layer, the
embedding output is checked bit for bit against rows read alone from the checkpoint's shard, SpecForge training data
is compared with the server slot by slot and layer by layer (the [2, 30, 58] question), matches too close to call
are called ambiguous, and `doctor check` warns where the pipelines read a config's ids as different taps."""
import json
import os

import pytest
import torch

from doctor_helpers import CONFIGS, KIMI, assert_clean_error, cli, demo_fast, write_json
from dump_helpers import TeacherForced, write_checkpoint, write_training

N = 6
L = 8


@pytest.fixture(scope="module")
def tf(tmp_path_factory):
    res, out = demo_fast()
    prompts = json.load(open(os.path.join(out, "prompts.json")))[:3]
    root = tmp_path_factory.mktemp("fpstream")
    return {"t": TeacherForced(prompts, os.path.join(out, "draft"), N), "root": root, "out": out}


def _full(tf, name, served):
    d = str(tf["root"] / name)
    if not os.path.isdir(d):
        tf["t"].write_dump(d, served, list(range(L + 1)), declared=["Embedding", "LayerOutput(0)", "LayerOutput(3)"])
    return d


def test_full_stream_names_each_served_slot(tf, tmp_path):
    code, text, err = cli("doctor", "fingerprint", "--captured", _full(tf, "ok", [0, 1, 4]), "--json",
                          tmp_path / "ok.json")
    assert code == 0, text + err
    j = json.load(open(tmp_path / "ok.json"))
    assert [(s["best"], s["verdict"], s["ok"]) for s in j["slots"]] == [(0, "exact", True), (1, "exact", True),
                                                                         (4, "exact", True)]
    assert "every served slot holds the declared tap" in text
    # miswired: the declared taps come from the dump's own record (its draft's declaration)
    code, text, err = cli("doctor", "fingerprint", "--captured", _full(tf, "mis", [1, 4, 7]), "--json",
                          tmp_path / "mis.json")
    assert code == 1, text + err
    j = json.load(open(tmp_path / "mis.json"))
    assert [(s["best"], s["expected"]) for s in j["slots"]] == [(1, 0), (4, 1), (7, 4)]
    assert "served slot 0 holds LayerOutput(0) (bit for bit), the draft declares Embedding" in text
    # --taps overrides the dump's declaration
    code, text, err = cli("doctor", "fingerprint", "--captured", _full(tf, "mis", [1, 4, 7]), "--taps",
                          "layer_inputs:1,4,7")
    assert code == 0, text + err


def test_embedding_checked_bit_for_bit_against_the_shard(tf, tmp_path):
    m = tf["t"].side.target.model
    emb = m.get_input_embeddings().weight.detach()
    cfg = tf["t"].side.target.config_dict
    ck = write_checkpoint(str(tmp_path / "ck"), {"model.embed_tokens.weight": emb,
                                                 "model.layers.0.mlp.weight": torch.randn(3, 3)}, cfg)
    code, text, err = cli("doctor", "fingerprint", "--captured", _full(tf, "ok", [0, 1, 4]), "--target-checkpoint",
                          ck, "--json", tmp_path / "e.json")
    assert code == 0, text + err
    assert [e["ok"] for e in json.load(open(tmp_path / "e.json"))["embedding"]] == [True, True]
    wrong = emb.clone()
    wrong[:, 0] += 1e-3
    ck2 = write_checkpoint(str(tmp_path / "ck2"), {"model.embed_tokens.weight": wrong}, cfg)
    code, text, err = cli("doctor", "fingerprint", "--captured", _full(tf, "ok", [0, 1, 4]), "--target-checkpoint",
                          ck2)
    assert code == 1 and "differs from embed_tokens[input_ids]" in text, text + err


@pytest.mark.parametrize("token, says", [
    (10 ** 6, "token id 1000000 is outside the vocabulary of --target-checkpoint (256 rows of embed_tokens)"),
    (-5, "token id -5 is negative: a record whose input_ids are corrupted"),
])
@pytest.mark.parametrize("with_vocab", [True, False])
def test_a_dumped_id_outside_the_checkpoint_says_what_is_wrong(tf, tmp_path, token, says, with_vocab):
    """Issue 42: ids of 10^6 gave "index 0 is out of bounds for dimension 0 with size 0" (the config giving no
    vocabulary) and negative ids "outside the checkpoint's vocabulary (None)"; now one line saying what is wrong
    (another model, or corrupted input_ids) and what to do."""
    m = tf["t"].side.target.model
    cfg = dict(tf["t"].side.target.config_dict)
    if not with_vocab:
        cfg.pop("vocab_size", None)
    ck = write_checkpoint(str(tmp_path / "ck"), {"model.embed_tokens.weight": m.get_input_embeddings().weight.detach()},
                          cfg)
    d = str(tmp_path / "d")
    tf["t"].write_dump(d, [0, 1, 4], list(range(L + 1)), declared=["Embedding", "LayerOutput(0)", "LayerOutput(3)"])
    for name in sorted(os.listdir(d))[:1]:
        rec = torch.load(os.path.join(d, name))
        rec["input_ids"][3] = token
        torch.save(rec, os.path.join(d, name))
    code, text, err = cli("doctor", "fingerprint", "--captured", d, "--target-checkpoint", ck)
    assert_clean_error(code, text, err, says)
    assert "out of bounds" not in err and "(None)" not in err


@pytest.fixture(scope="module")
def training(tf):
    """Training data of the demo target in bf16 under both readings of ids [0, 1, 4]: the HF backend's (layer
    inputs [1, 2, 5]) and SGLang's ([0, 1, 4])."""
    t = tf["t"]
    m = t.side.target.model.to(torch.bfloat16)
    from eagle3_capture.doctor.target_side.model import residual_stream

    with torch.no_grad():
        stacks = [residual_stream(m, ids[None])[0][0] for ids in t.sent]
    t.side.target.model.to(torch.float32)
    d = {name: str(tf["root"] / f"train_{name}") for name in ("hf", "sglang")}
    write_training(d["hf"], t.sent, stacks, [1, 2, 5])
    write_training(d["sglang"], t.sent, stacks, [0, 1, 4])
    cfg = write_json(tf["root"] / "draft_014.json", {
        "architectures": ["LlamaForCausalLMEagle3"], "hidden_size": 64, "num_hidden_layers": 1,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 1, 4]}})
    return d, cfg


def test_training_data_slot_by_slot_and_layer_by_layer(tf, training, tmp_path):
    d, cfg = training
    dump = _full(tf, "ok", [0, 1, 4])
    target_cfg = os.path.join(tf["out"], "target")
    code, text, err = cli("doctor", "fingerprint", "--training-data", d["sglang"], "--captured", dump,
                          "--draft-config", cfg, "--target-config", target_cfg, "--json", tmp_path / "s.json")
    assert code == 0, text + err
    j = json.load(open(tmp_path / "s.json"))
    assert j["same_as_served"] and j["training_layer_inputs"] == [0, 1, 4]
    assert [m["verdict"] for m in j["vs_served"]] == ["clear"] * 3  # bf16 training vs fp32 server: close, not equal
    assert "SpecForge SGLang backend (specforge 0.2.0 pins sglang 0.5.14" in j["reading"]
    assert "the server captures what training used" in text
    code, text, err = cli("doctor", "fingerprint", "--training-data", d["hf"], "--captured", dump,
                          "--draft-config", cfg, "--target-config", target_cfg, "--json", tmp_path / "h.json")
    assert code == 1, text + err
    j = json.load(open(tmp_path / "h.json"))
    assert not j["same_as_served"] and j["training_layer_inputs"] == [1, 2, 5]
    assert j["reading"].startswith("SpecForge HF backend") and "does NOT capture what training used" in text
    for m in j["vs_stream"]:
        assert m["margin"] > 2 * m["noise"] and m["noise"] > 0


def test_close_layers_are_ambiguous_not_named(tf, tmp_path):
    """Two stream entries closer to each other than the training capture is to either: no layer is named."""
    t = tf["t"]
    d = str(tmp_path / "dump")
    paths = t.write_dump(d, [0, 1, 4], list(range(L + 1)))
    g = torch.Generator().manual_seed(0)
    for p in paths:
        rec = torch.load(p)
        s = rec["stream"]
        s[5] = s[4] + 1e-4 * s[4].norm(dim=-1, keepdim=True) * torch.randn(s[4].shape, generator=g) / 8
        torch.save(rec, p)
    noisy = [st.clone() for st in t.stack]
    for st in noisy:
        st[:, 4] += 0.02 * st[:, 4].norm(dim=-1, keepdim=True) * torch.randn(st[:, 4].shape, generator=g) / 8
    tr = str(tmp_path / "train")
    write_training(tr, t.sent, noisy, [0, 1, 4], dtype=torch.float32)
    code, text, err = cli("doctor", "fingerprint", "--training-data", tr, "--captured", d, "--json",
                          tmp_path / "a.json")
    j = json.load(open(tmp_path / "a.json"))
    assert j["vs_stream"][2]["verdict"] == "ambiguous" and j["training_layer_inputs"] is None, text
    assert "ambiguous at this noise" in text


def test_bad_training_data_and_dumps(tf, training, tmp_path):
    d, _ = training
    dump = _full(tf, "ok", [0, 1, 4])
    # training data of another hidden size
    from eagle3_capture.doctor.target_side.training_data import save_sample

    wide = str(tmp_path / "wide" / "rows_0-5000" / "data_0.ckpt")
    T = tf["t"].sent[0].numel()
    save_sample(wide, tf["t"].sent[0], torch.randn(T, 3 * 48), torch.randn(T, 48))
    assert_clean_error(*cli("doctor", "fingerprint", "--training-data", os.path.dirname(os.path.dirname(wide)),
                            "--captured", dump), "another model")
    # a truncated sample
    src = sorted(os.listdir(os.path.join(d["hf"], "rows_0-5000")))[0]
    data = open(os.path.join(d["hf"], "rows_0-5000", src), "rb").read()
    trunc = tmp_path / "trunc" / "rows_0-5000"
    trunc.mkdir(parents=True)
    (trunc / src).write_bytes(data[: len(data) // 2])
    assert_clean_error(*cli("doctor", "fingerprint", "--training-data", tmp_path / "trunc", "--captured", dump),
                       "not a readable SpecForge sample")
    # training tokens the dump does not hold
    other = str(tmp_path / "other")
    write_training(other, [torch.tensor([7] * 20)], [torch.zeros(20, L + 1, 64)], [0, 1, 4])
    assert_clean_error(*cli("doctor", "fingerprint", "--training-data", other, "--captured", dump),
                       "do not align")
    # a version-1 dump carries no stream
    v1 = tmp_path / "v1"
    v1.mkdir()
    torch.save({"aux": torch.zeros(4, 128), "input_ids": torch.arange(4), "positions": torch.arange(4),
                "forward_mode": "EXTEND", "layers_to_capture": [0, 1], "num_layers": L, "hidden_size": 64},
               v1 / "eagle3_capture_pid1_0000.pt")
    assert_clean_error(*cli("doctor", "fingerprint", "--captured", v1), "version-1 records")
    assert_clean_error(*cli("doctor", "fingerprint", "--captured", dump, "--samples", 3), "--training-data")


def test_check_warns_when_the_pipelines_read_the_ids_differently(tmp_path):
    kimi = write_json(tmp_path / "kimi_draft.json", {
        "architectures": ["LlamaForCausalLMEagle3"], "hidden_size": 7168, "num_hidden_layers": 1,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 30, 58]}})
    code, text, err = cli("doctor", "check", "--target-config", KIMI, "--draft-config", kimi, "--with-plugin",
                          "--json", tmp_path / "c.json")
    f = {x["code"]: x for x in json.load(open(tmp_path / "c.json"))["findings"]}["ids-convention-unknown"]
    assert f["severity"] == "warning"
    assert "[LayerOutput(2), LayerOutput(30), LayerOutput(58)]" in f["message"]
    assert "[LayerOutput(1), LayerOutput(29), LayerOutput(57)]" in f["message"]
    assert "doctor fingerprint --training-data" in f["fix"]
    # ids[0] == 1: both read them alike; a declared convention: nothing to doubt; -1: SGLang cannot train on it
    for ids, extra in (([1, 29, 57], {}), ([2, 30, 58], {"eagle_aux_hidden_state_convention": "draft_ids"}),
                       ([-1, 2, 30], {})):
        p = write_json(tmp_path / "d.json", {"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": 7168,
                                              "num_hidden_layers": 1,
                                              "eagle_config": {"eagle_aux_hidden_state_layer_ids": ids, **extra}})
        code, text, err = cli("doctor", "check", "--target-config", KIMI, "--draft-config", p)
        assert "ids-convention-unknown" not in text, (ids, extra)
    assert os.path.isdir(CONFIGS)


def test_a_slot_bit_equal_to_several_layers_is_ambiguous_not_exact():
    """SGLang's dummy weights in bf16: each layer's update is below bf16's rounding step, so the stream holds the same
    rows at several layer inputs. A slot equal to them bit for bit names none of them (the matcher once called the
    lowest 'exact', a wrong layer on a stream that cannot tell them apart); one equal to a single entry is exact."""
    from eagle3_capture.doctor.fingerprint.stream_match import StreamMatcher

    g = torch.Generator().manual_seed(3)
    moving = torch.cumsum(torch.randn(5, 12, 16, generator=g), 0)     # layer inputs 0..4, all different
    still = moving.clone()
    still[2] = still[1]
    still[3] = still[1]                                                # inputs 1, 2, 3: the same rows
    for stream, want in ((moving, [(2, "exact", True), (4, "exact", True)]),
                         (still, [(1, "ambiguous", False), (4, "exact", True)])):
        m = StreamMatcher(2, 16)
        m.add(stream[[2, 4]].permute(1, 0, 2).reshape(12, -1), stream, list(range(5)))
        got = m.matches()
        assert [(x.best, x.verdict, x.exact) for x in got] == want
    assert got[0].second in (2, 3) and got[0].second_cos == pytest.approx(1.0)
