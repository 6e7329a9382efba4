"""The capture dump of SGLang 0.5.23's real serving loop (the launched server, the miswired one), the doctor's
teacher-forced request, and the doctor with only the draft: the server as the target side, its dump fingerprinted
slot by slot, training data matched to what the server captures, bad inputs against a real dump.

The servers are runs of engine_servers.py (see test_engine_serving.py).
"""
import glob
import json
import os

import pytest
import torch

from engine_doctor import NO_TARGET_TOKENS, TRAINING_READINGS, accept_with_target
from engine_fixtures import CHAIN, NEW_TOKENS, PROMPTS, doctor, dump_records, flags_text, pair  # noqa: F401
from engine_servers import DOCTOR_RID, fixtures

pytestmark = [pytest.mark.engine, pytest.mark.sglang, pytest.mark.slow]

launched, miswired = fixtures("launched", "miswired")

# ----------------------------------------------------------------------------------------------------------------
# the capture dump of served traffic, and the doctor's teacher-forced request (the launched server)
# ----------------------------------------------------------------------------------------------------------------


def _rows(rec, req):
    return slice(req["row_start"], req["row_end"])


def test_served_traffic_is_dumped_as_the_contract_says(pair, launched):
    assert launched["code"] == 0, launched["text"] + launched["err"]  # the dump changed nothing served
    everything = dump_records(launched["dump"])
    # served traffic: not the doctor's requests (this test's own and `doctor online`'s without a target)
    recs = [r for r in everything if not any((q["rid"] or "").startswith("eagle3-doctor-") for q in r["requests"])]
    assert not any(q["rid"].startswith("HEALTH_CHECK") for r in recs for q in r["requests"])  # /health's generates
    modes = {r["forward_mode"] for r in recs}
    assert {"EXTEND", "TARGET_VERIFY"} <= modes, modes
    with open(pair.prompts) as f:
        prompts = [tuple(p) for p in json.load(f)]
    seen_prompts, extend_rids = set(), set()
    for rec in recs:
        assert rec["graph"] is False and rec["layers_to_capture"] == [0, 1, 4] and rec["stream"] is None
        assert rec["draft_ids"] == [-1, 0, 3] and rec["model_class"] == "DeepseekV3ForCausalLM"
        for q in rec["requests"]:
            ids, pos = rec["input_ids"][_rows(rec, q)].tolist(), rec["positions"][_rows(rec, q)].tolist()
            if rec["forward_mode"] == "EXTEND":
                extend_rids.add(q["rid"])
                assert pos == list(range(q["prefix_len"], q["prefix_len"] + len(ids)))
                if q["prefix_len"] == 0 and tuple(ids) in prompts:
                    seen_prompts.add(tuple(ids))
            else:  # a verify: the request's 4 draft tokens (chain 3/1/4), at consecutive positions
                assert len(ids) == CHAIN[2] and pos == list(range(pos[0], pos[0] + CHAIN[2])), (ids, pos)
                assert q["prefix_len"] is None and q["rid"] in extend_rids
    assert len(seen_prompts) == PROMPTS  # every prompt's prefill, each request's rows where the record says
    # what the served draft was fed (the stand-ins' witness): every row it got is a dumped aux row, bit for bit,
    # and each prefill's aux is what the draft's extend after it got, whole
    fed = [torch.load(f, weights_only=True) for f in sorted(glob.glob(os.path.join(launched["fed"], "*.pt")))]
    fed = [x for x in fed if not all(r.startswith("HEALTH_CHECK") for r in x["rids"])]  # not followed
    assert fed and len({x["forward_mode"] for x in fed}) == 2  # after a prefill (EXTEND) and a verify
    dumped = {tuple(row.tolist()) for rec in everything for row in rec["aux"]}
    missing = sum(tuple(row.tolist()) not in dumped for x in fed for row in x["hidden_states"])
    assert missing == 0, f"{missing} rows the draft was fed are not in the dump"
    for rec in recs:
        if rec["forward_mode"] == "EXTEND":
            assert any(torch.equal(rec["aux"], x["hidden_states"]) for x in fed), rec["requests"]


def test_the_doctors_teacher_forced_request(pair, launched):
    """prompt + the served greedy continuation as one /generate (rid eagle3-doctor-..., max_new_tokens 1,
    return_logprob, logprob_start_len 0, top_logprobs_num 1): the whole sequence is recomputed (no prefix-cache
    reuse), its record holds every position's residual stream, and input_top_logprobs gives the target's greedy
    token at each position, equal to the served continuation."""
    prompt, served, forced, teacher = launched["prompt"], launched["served"], launched["forced"], launched["teacher"]
    n, cont = len(prompt), served["output_ids"]
    ids = teacher["input_ids"]
    assert len(cont) == NEW_TOKENS and ids == prompt + cont
    meta = forced["meta_info"]
    assert meta["prompt_tokens"] == len(ids) and meta["cached_tokens"] == 0, meta
    top = meta["input_top_logprobs"]
    assert len(top) == len(ids)
    greedy = [entry[0][1] for entry in top[n:]]  # the top token predicted at each continuation position
    assert greedy == cont
    # its dump: every position, with the stream at every layer input 0..L
    recs = [r for r in dump_records(launched["dump"]) if any(q["rid"] == DOCTOR_RID for q in r["requests"])]
    assert recs, "the doctor's forward was not dumped"
    rows = {}
    for rec in recs:
        (q,) = [q for q in rec["requests"] if q["rid"] == DOCTOR_RID]
        assert rec["forward_mode"] == "EXTEND" and q["prefix_len"] is not None
        L, H = rec["num_layers"], rec["hidden_size"]
        assert rec["stream_layer_inputs"] == list(range(L + 1))
        for j in range(q["row_start"], q["row_end"]):
            rows[int(rec["positions"][j])] = (int(rec["input_ids"][j]), rec["stream"][:, j], rec["aux"][j])
        for s, i in enumerate(rec["layers_to_capture"]):  # the served slots are the stream's own values
            assert torch.equal(rec["aux"][:, s * H:(s + 1) * H], rec["stream"][i])
    assert sorted(rows) == list(range(len(ids))) and [rows[p][0] for p in range(len(ids))] == ids
    assert min(q["prefix_len"] for r in recs for q in r["requests"] if q["rid"] == DOCTOR_RID) == 0


# ----------------------------------------------------------------------------------------------------------------
# (e) the doctor with only the draft: the server is the target side (its teacher-forced pass and its dump)
# ----------------------------------------------------------------------------------------------------------------

def _per_prompt(figures):
    return [(p["verify_ct"], p["correct_drafts_histogram"]) for p in figures["per_prompt"]]


def test_online_without_target_predicts_the_server_exactly(pair, launched):
    nt = launched["no_target"]
    assert nt["code"] == 0, nt["text"] + nt["err"]
    j = nt["json"]
    assert j["ok"] and j["verdict"].startswith("matches") and all(j["lossless"]) and len(j["lossless"]) == PROMPTS
    on, pred = j["online"], j["predicted"]
    assert (on["completion_tokens"], on["verify_ct"]) == (pred["completion_tokens"], pred["verify_ct"])
    assert on["correct_drafts_histogram"] == pred["correct_drafts_histogram"] and _per_prompt(on) == _per_prompt(pred)
    assert j["near_ties"] == [] and j["explained_by_near_ties"] == []  # float32: no rounding decided a verify
    # ... and the transformers-based prediction on the same prompts, figure for figure
    hf = accept_with_target(pair, NO_TARGET_TOKENS)["served"]
    assert _per_prompt(pred) == _per_prompt(hf) and pred["served_accept_length"] == hf["served_accept_length"]
    assert j["target"].startswith("server http://127.0.0.1:")


def test_online_without_target_fingerprints_the_served_slots_from_the_full_stream(launched):
    """Needs the plugin's version-2 dump (the residual stream of the doctor's requests)."""
    fp = launched["no_target"]["json"]["fingerprint"]
    assert fp["stream_layer_inputs"] == list(range(9)), ("the server's dump has no stream: this test needs the "
                                                         f"plugin's version-2 writer ({fp['notes']})")
    assert [(s["verdict"], s["best"], s["ok"]) for s in fp["slots"]] == [("exact", 0, True), ("exact", 1, True),
                                                                          ("exact", 4, True)]


def test_miswired_server_without_target_exits_1_and_names_each_slot(pair, miswired):
    """The prediction reads the declared taps from the stream (so it is the correct capture's, not the miswired
    server's own), and the full-stream fingerprint names each served slot's layer. Needs the version-2 dump."""
    nt = miswired["no_target"]
    assert nt["code"] == 1, nt["text"] + nt["err"]
    j = nt["json"]
    assert all(j["lossless"])
    assert _per_prompt(j["predicted"]) == _per_prompt(accept_with_target(pair, NO_TARGET_TOKENS)["served"])
    assert [(s["verdict"], s["best"], s["expected"]) for s in j["fingerprint"]["slots"]] == \
        [("exact", 1, 0), ("exact", 4, 1), ("exact", 7, 4)]
    assert "served slot 0 holds LayerOutput(0) (bit for bit), the draft declares Embedding" in j["verdict"]


def test_training_data_says_which_reading_the_server_captures(launched):
    """The demo pair's training data under both readings of ids [0, 1, 4]: the server (the plugin with the demo draft)
    captures the SGLang reading's taps, slot by slot; bf16 training data against an fp32 server is close, not
    equal."""
    sg, hf = launched["training"]["sglang_reading"], launched["training"]["hf_reading"]
    assert sg["code"] == 0, sg["text"] + sg["err"]
    assert sg["json"]["same_as_served"] and "the server captures what training used" in sg["text"]
    assert [(m["best"], m["verdict"]) for m in sg["json"]["vs_served"]] == [(0, "clear"), (1, "clear"), (2, "clear")]
    assert hf["code"] == 1, hf["text"] + hf["err"]
    assert not hf["json"]["same_as_served"] and "does NOT capture what training used" in hf["text"]


def test_training_data_names_each_training_slots_layer(launched):
    """With the full stream, which layer each training slot was: the [2, 30, 58] question answered on the demo pair.
    Needs the version-2 dump."""
    for name, layers in TRAINING_READINGS.items():
        j = launched["training"][name]["json"]
        assert j["training_layer_inputs"] == layers, (name, j["notes"])
    assert "HF backend" in launched["training"]["hf_reading"]["json"]["reading"]
    assert "SGLang" in launched["training"]["sglang_reading"]["json"]["reading"]


def test_accept_on_the_servers_dump_predicts_the_server(pair, launched):
    """After the server stopped: `doctor accept --hidden-states` on its dump, no target."""
    out = os.path.join(pair.root, "accept_hidden_states.json")
    code, text, err = doctor("accept", "--hidden-states", launched["dump"], "--draft", pair.draft, "--prompts",
                             pair.prompts, "--server-args", flags_text(CHAIN), "--json", out, "--no-progress",
                             "--device", "cpu", "--threads", 1)
    assert code == 0, text + err
    sv = json.load(open(out))["served"]
    assert sv["max_new_tokens"] == NO_TARGET_TOKENS  # as many as the dumped teacher-forced requests hold
    assert _per_prompt(sv) == _per_prompt(launched["no_target"]["json"]["online"])


def test_bad_inputs_against_the_servers_dump(pair, launched, tmp_path):
    import shutil

    import torch

    from eagle3_capture.dump_format.reader import load_record
    from eagle3_capture.doctor.target_side.training_data import save_sample

    dump = launched["dump"]
    base = ("--draft", pair.draft, "--server-args", flags_text(CHAIN), "--no-progress", "--device", "cpu")

    def one_line(code, text, err, *needles):
        assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, text + err
        for n in needles:
            assert n in err, err

    # a dump from another model: its records say L=8, H=64; this checkpoint's config says 12 layers
    other = tmp_path / "other_model"
    other.mkdir()
    cfg = json.load(open(os.path.join(pair.target, "config.json")))
    json.dump({**cfg, "num_hidden_layers": 12}, open(other / "config.json", "w"))
    shutil.copy(os.path.join(pair.target, "model.safetensors"), other / "model.safetensors")
    one_line(*doctor("accept", "--hidden-states", dump, "--prompts", pair.prompts, "--target-checkpoint", other,
                     *base), "from another model")
    # a truncated record
    trunc = tmp_path / "truncated"
    shutil.copytree(dump, trunc)
    victim = sorted(f for f in os.listdir(trunc) if f.endswith(".pt"))[-1]
    data = open(trunc / victim, "rb").read()
    open(trunc / victim, "wb").write(data[: len(data) // 3])
    one_line(*doctor("accept", "--hidden-states", trunc, "--prompts", pair.prompts, *base), victim,
             "not a readable dump record")
    # tokens that do not align: prompts the server never saw
    prompts = json.load(open(pair.prompts))
    bad = tmp_path / "other_prompts.json"
    json.dump([list(reversed(p)) for p in prompts], open(bad, "w"))
    one_line(*doctor("accept", "--hidden-states", dump, "--prompts", bad, *base), "do not align")
    # training data of another hidden size
    rec = max((load_record(os.path.join(dump, f)) for f in sorted(os.listdir(dump))[:8]), key=lambda r: r.rows)
    wide = tmp_path / "wide"
    ids = rec.input_ids[:8]
    save_sample(str(wide / "rows_0-5000" / "data_0.ckpt"), ids, torch.randn(ids.numel(), 3 * 48,
                                                                             dtype=torch.bfloat16),
                torch.randn(ids.numel(), 48, dtype=torch.bfloat16))
    one_line(*doctor("fingerprint", "--training-data", wide, "--captured", dump), "another model")
