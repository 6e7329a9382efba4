"""SGLang 0.5.23's real serving loop (scheduler, ModelRunner, EAGLEWorkerV2), on the CPU, with the demo pair:
what the server reports beside what the doctor predicts, with the plugin, without it, miswired, and as a tree.

Each configuration starts one server (session fixtures below); the tests read its responses and log.
"""
import glob
import json
import math
import os
import re
import time
from typing import Optional

import pytest
import torch

from engine_fixtures import (CHAIN, NEW_TOKENS, PROMPTS, TREE, LaunchedServer, doctor, flags_text, pair,  # noqa: F401
                             Served, post_json, serve_engine, wait_for_files)
from engine_doctor import (NO_TARGET_TOKENS, TRAINING_READINGS, accept_with_target, dump_env, fingerprint_training,
                           online_without_target)
from engine_metrics import Watch, acceptance, expected_from_responses, minus, what_prometheus_saw
from prometheus_server import PrometheusServer

pytestmark = [pytest.mark.engine, pytest.mark.sglang, pytest.mark.slow]

# the demo draft's taps, [Embedding, LayerOutput(0), LayerOutput(3)], written as stock SGLang 0.5.23 reads ids
# that do not start with 1: layer-input indices, unchanged
STOCK_IDS = [0, 1, 4]
# stock SGLang's capture, fc and id rule; only the capture dump (which rides on the model-forward hook) stays
STOCK_DUMPING = "taps,capture,draft_fc,gather,selftest,acceptance"


def _meta(responses):
    return [(r["meta_info"]["spec_verify_ct"], r["meta_info"]["spec_correct_drafts_histogram"]) for r in responses]


# ----------------------------------------------------------------------------------------------------------------
# one server per configuration
# ----------------------------------------------------------------------------------------------------------------

DOCTOR_RID = "eagle3-doctor-engine-0"
PROFILE_PROMPTS = 32   # the expected profile's sample: 32 held-out prompts (the servers serve the first 8)
STEPS = CHAIN[0]


@pytest.fixture(scope="session")
def profile(pair):
    """The correct draft's expected acceptance per position: `doctor accept --profile-out` with the transformers
    target on 32 held-out prompts, chain flags. The launched and miswired servers run against it."""
    path = os.path.join(pair.root, "profile.json")
    out = os.path.join(pair.root, "accept_profile.json")
    code, text, err = doctor("accept", "--target", pair.target, "--draft", pair.draft, "--prompts",
                             pair.first_prompts(PROFILE_PROMPTS), "--server-args", flags_text(CHAIN), "--new-tokens",
                             NEW_TOKENS, "--json", out, "--profile-out", path, "--no-progress", "--device", "cpu",
                             "--threads", 1)
    assert code == 0, text + err
    return path


def _acceptance_window(srv, pair, name: str) -> dict:
    """The plugin's counters over one window in which only the profile's prompts, sent once more, were served:
    their responses and the counters' difference."""
    before = acceptance(srv.metrics(), STEPS)
    # the profile's own prompts, 8 at a time: live traffic drawn as the profile was (the first 8 alone accept
    # less at position 1 than the 32 do); the recorded file holds the first PROMPTS responses
    served = record_responses(pair, srv.url, name, pair.first_prompts(PROFILE_PROMPTS), workers=8, first=PROMPTS)
    text = srv.metrics()
    return {"served": served, "counted": minus(acceptance(text, STEPS), before), "metrics": text}


@pytest.fixture(scope="session")
def launched(pair, profile):
    """Plugin on, the draft as shipped (ids [-1, 0, 3]), chain flags, through `python -m sglang.launch_server`, the
    capture dump on (every forward, the full stream of the doctor's requests: EAGLE3_CAPTURE_DUMP_STREAM=all) and the
    stand-ins' witness of what the draft is fed. While it runs: `doctor online` with the transformers target, the
    doctor's teacher-forced request by hand (prompt + the served greedy continuation, one prefill, rid
    eagle3-doctor-...), `doctor online` without the target (the server as the target side), and the fingerprint of
    SpecForge-layout training data under both readings of ids [0, 1, 4]."""
    out = os.path.join(pair.root, "online_launched.json")
    dump = os.path.join(pair.root, "dump_launched")
    fed = os.path.join(pair.root, "draft_fed_launched")
    env = {**dump_env(dump), "E3_SGLANG_CPU_RECORD_DRAFT": fed, "EAGLE3_CAPTURE_PROFILE": profile}
    with open(pair.prompts) as f:
        prompt = json.load(f)[0]
    with LaunchedServer(pair, pair.draft, CHAIN, env=env, extra=["--enable-metrics"]) as srv, \
            PrometheusServer(srv.url + "/metrics") as prom, Watch(srv.url, profile, pair.root, "launched") as watch:
        code, text, err = doctor("online", "--server", srv.url, "--prompts", pair.prompts, "--target", pair.target,
                                 "--draft", pair.draft, "--new-tokens", NEW_TOKENS, "--json", out, "--no-progress",
                                 "--device", "cpu", "--threads", 1)
        served = post_json(srv.url + "/generate", {"input_ids": prompt, "sampling_params": {
            "max_new_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": True}})
        teacher = {"input_ids": prompt + served["output_ids"], "rid": DOCTOR_RID,
                   "sampling_params": {"max_new_tokens": 1, "temperature": 0},
                   "return_logprob": True, "logprob_start_len": 0, "top_logprobs_num": 1}
        forced = post_json(srv.url + "/generate", teacher)
        wait_for_files(os.path.join(dump, "*.pt"), lambda fs: any(_holds(f, DOCTOR_RID) for f in fs))
        no_target = online_without_target(pair, srv.url, dump, "launched")
        training = {name: fingerprint_training(pair, srv.url, dump, name, layers)
                    for name, layers in TRAINING_READINGS.items()}
        window = _acceptance_window(srv, pair, "launched_counted")
        window["prometheus"] = what_prometheus_saw(prom, STEPS)
        log = srv.log()
    with open(os.path.join(pair.root, "online_launched.txt"), "w") as f:
        f.write(text)
    return {"code": code, "text": text, "err": err, "json": json.load(open(out)) if os.path.exists(out) else None,
            "log": log, "dump": dump, "fed": fed, "prompt": prompt, "served": served, "teacher": teacher,
            "forced": forced, "no_target": no_target, "training": training, "window": window,
            "watch": watch.result()}


def _holds(path, rid):
    import torch

    try:
        return any(r["rid"] == rid for r in torch.load(path, weights_only=True)["requests"])
    except Exception:
        return False


@pytest.fixture(scope="session")
def stock(pair):
    """Stock SGLang's capture and id rule (every hook that changes what is served off), the same draft with its ids
    written in stock's own convention, the capture dump on (a stock deployment can be fingerprinted)."""
    dump = os.path.join(pair.root, "dump_stock")
    srv = serve_engine(pair, "stock", pair.draft_variant("stock_ids", eagle_aux_hidden_state_layer_ids=STOCK_IDS),
                       env={"EAGLE3_CAPTURE_DISABLE": STOCK_DUMPING, "EAGLE3_CAPTURE_DUMP": dump,
                            "EAGLE3_CAPTURE_DUMP_MAX": "2"})
    return srv, dump


@pytest.fixture(scope="session")
def stock_shipped(pair):
    """Stock SGLang (the plugin registers nothing) with the draft as shipped: ids [-1, 0, 3]."""
    one = pair.first_prompts(1)
    return serve_engine(pair, "stock_shipped", pair.draft, env={"EAGLE3_CAPTURE_DISABLE": "all"}, prompts=one,
                        new_tokens=4)


# The miswired server's alarm threshold (nats; the default is 16). On the demo pair one layer later costs position 1
# only a quarter of its acceptance (0.42 against the profile's 0.56 on the profile's prompts), and a profile of 208
# verifies puts its 3-sigma lower bound at 0.455: at the default the CUSUM needs about a thousand verifies, more than
# this server serves. 6 fires in a couple of hundred (its false-alarm bound, 27 an hour, is a canary's, not a
# deployment's); the correct server keeps the default.
MISWIRED_THRESHOLD = 6


@pytest.fixture(scope="session")
def miswired(pair, profile):
    """Plugin on, but the draft config declares its ids as layer inputs [1, 4, 7] = [LayerOutput(0), LayerOutput(3),
    LayerOutput(6)] (the plugin captures what is declared): no embedding, every slot one tap later than trained.
    The capture dump is on (the full stream of the doctor's requests). While it runs: `doctor online` with the
    transformers target and without it."""
    dump = os.path.join(pair.root, "dump_miswired")
    out = os.path.join(pair.root, "online_miswired.json")
    variant = pair.draft_variant("miswired", eagle_aux_hidden_state_layer_ids=[1, 4, 7],
                                 eagle_aux_hidden_state_convention="layer_inputs")
    env = {**dump_env(dump), "EAGLE3_CAPTURE_PROFILE": profile,
           "EAGLE3_CAPTURE_ALARM_THRESHOLD": str(MISWIRED_THRESHOLD)}
    with LaunchedServer(pair, variant, CHAIN, env=env, extra=["--enable-metrics"], name="miswired") as srv, \
            PrometheusServer(srv.url + "/metrics") as prom, Watch(srv.url, profile, pair.root, "miswired") as watch:
        code, text, err = doctor("online", "--server", srv.url, "--prompts", pair.prompts, "--target", pair.target,
                                 "--draft", pair.draft, "--new-tokens", NEW_TOKENS, "--json", out, "--no-progress",
                                 "--device", "cpu", "--threads", 1)
        no_target = online_without_target(pair, srv.url, dump, "miswired")
        window = _acceptance_window(srv, pair, "miswired")
        window["prometheus"] = what_prometheus_saw(prom, STEPS)
        log = srv.log()
    return {"code": code, "text": text, "err": err, "json": json.load(open(out)) if os.path.exists(out) else None,
            "log": log, "dump": dump, "no_target": no_target, "served": window["served"], "window": window,
            "watch": watch.result()}


def record_responses(pair, url: str, name: str, prompts: Optional[str] = None, workers: int = 1,
                     first: Optional[int] = None) -> Served:
    """Prompts (default: the PROMPTS ones) once more through the launched server's /generate (greedy, ignore_eos,
    NEW_TOKENS), `workers` at a time (SGLang batches concurrent requests), written as serve.py writes an Engine's
    responses: what `doctor online` reads as a recorded --server file (the `first` rows only, when given)."""
    from concurrent.futures import ThreadPoolExecutor

    t0 = time.time()
    path = os.path.join(pair.root, f"{name}_launched.jsonl")

    def one(ids):
        r = post_json(url + "/generate", {"input_ids": ids, "sampling_params": {
            "temperature": 0, "max_new_tokens": NEW_TOKENS, "ignore_eos": True}})
        return {"input_ids": ids, "output_ids": r.get("output_ids"), "meta_info": r.get("meta_info")}

    with ThreadPoolExecutor(workers) as pool:
        rows = list(pool.map(one, json.load(open(prompts or pair.prompts))))
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows[:first])
    return Served(rows, path, "", time.time() - t0)


TREE_PROMPTS = 4  # a tree verify costs about twice a chain's on the CPU: half the prompts keep CI's time


@pytest.fixture(scope="session")
def tree(pair):
    return serve_engine(pair, "plugin_tree", pair.draft, flags=TREE, prompts=pair.first_prompts(TREE_PROMPTS))


@pytest.fixture(scope="session")
def reference(pair):
    path = os.path.join(pair.root, "reference.safetensors")
    code, text, err = doctor("dump-reference", "--model", pair.target, "--prompts", pair.prompts, "--out", path,
                             "--device", "cpu")
    assert code == 0, err
    return path


@pytest.fixture(scope="session")
def shifted(pair):
    """Plugin on, the draft as shipped, and a capture moved one layer later at run time (the test-only stand-in's
    fault): the self-test must name the slot."""
    one = pair.first_prompts(1)
    return serve_engine(pair, "shifted", pair.draft, env={"E3_SGLANG_CPU_SHIFT_CAPTURE": "1"}, prompts=one,
                        new_tokens=2)


# ----------------------------------------------------------------------------------------------------------------
# (a) plugin on: lossless, the accept length stock SGLang serves given ids in its own convention, as predicted
# ----------------------------------------------------------------------------------------------------------------

def test_launch_server_with_the_plugin_matches_the_prediction(launched):
    assert launched["code"] == 0, launched["text"] + launched["err"] + launched["log"][-3000:]
    j = launched["json"]
    assert j["ok"] and j["verdict"].startswith("matches") and all(j["lossless"]) and len(j["lossless"]) == PROMPTS
    assert j["server_flags"] == {"num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4}  # read from /server_info
    on, pred = j["online"], j["predicted"]
    assert (on["completion_tokens"], on["verify_ct"]) == (pred["completion_tokens"], pred["verify_ct"])
    assert on["correct_drafts_histogram"] == pred["correct_drafts_histogram"]
    assert [p["verify_ct"] for p in on["per_prompt"]] == [p["verify_ct"] for p in pred["per_prompt"]]
    assert j["near_ties"] == [] and j["explained_by_near_ties"] == []  # float32: no rounding decided a verify
    assert "verdict: matches" in launched["text"]
    # the plugin's promised lines are in the server's log: the startup line at model load and the self-test
    log = launched["log"]
    assert re.search(r"eagle3_capture: SGLang \S+ \(adapter [a-z+-]+\): DeepseekV3ForCausalLM: taps \[Embedding, "
                     r"LayerOutput\(0\), LayerOutput\(3\)\]", log), log[-3000:]
    assert "layers_to_capture [0, 1, 4]" in log and "taps=on" in log
    assert "capture self-test passed: slot 0 equals the embedding bit for bit" in log
    # on a served forward (the model runner's), never a warm-up or capture pass
    assert re.search(r"capture self-test passed: .* \(\d+ rows; served EXTEND forward, request \S+", log), log[-3000:]


def test_plugin_serves_what_stock_serves_with_ids_in_its_convention(launched, stock):
    srv, _ = stock
    assert srv.error is None, srv.log[-3000:]
    assert len(srv.responses) == PROMPTS
    online = launched["json"]["online"]["per_prompt"]
    assert [(p["verify_ct"], p["correct_drafts_histogram"]) for p in online] == _meta(srv.responses)
    assert "taps hook off (EAGLE3_CAPTURE_DISABLE)" in srv.log  # the registration line reached the log


# ----------------------------------------------------------------------------------------------------------------
# (b) stock SGLang with the draft as shipped fails at the first prefill, as `doctor check` predicts
# ----------------------------------------------------------------------------------------------------------------

def test_stock_with_the_shipped_draft_fails_as_check_predicts(pair, stock_shipped):
    assert stock_shipped.error is not None and not stock_shipped.responses
    assert "RuntimeError: captured 2 of 3 aux hidden states" in stock_shipped.log
    code, text, err = doctor("check", "--target-config", pair.target, "--draft-config", pair.draft, "--server-args",
                             flags_text(CHAIN), "--json", os.path.join(pair.root, "check_shipped.json"))
    assert code == 1, text + err
    j = json.load(open(os.path.join(pair.root, "check_shipped.json")))
    errors = {f["code"]: f["message"] for f in j["findings"] if f["severity"] == "error"}
    assert "captured 2 of 3 aux hidden states" in errors["sglang-capture-error"]
    assert "taps hook off (EAGLE3_CAPTURE_DISABLE)" in stock_shipped.log


# ----------------------------------------------------------------------------------------------------------------
# (c) a miswired capture: lower served accept length, `doctor online` exits 1 naming step 1, fingerprint names it
# ----------------------------------------------------------------------------------------------------------------

def test_miswired_capture_is_named_online_and_by_fingerprint(pair, miswired, reference):
    assert "layers_to_capture [1, 4, 7]" in miswired["log"]
    code, text, err, j = miswired["code"], miswired["text"], miswired["err"], miswired["json"]
    assert code == 1, text + err
    assert all(j["lossless"]) and not j["ok"]
    assert "online below offline" in j["verdict"] and "at step 1" in j["verdict"] and "EAGLE3_CAPTURE_DUMP" in j["verdict"]
    # the prediction is for the trained taps, i.e. what a correct capture serves (the tests above): clearly more
    assert j["online"]["served_accept_length"] < j["predicted"]["served_accept_length"] - 0.1
    # the dump of that server, against the reference, with the taps the draft was trained on
    code, text, err = doctor("fingerprint", "--reference", reference, "--captured", miswired["dump"],
                             "--draft-config", pair.draft, "--target-config", pair.target)
    assert code == 1, text + err
    assert "fingerprint-missing-embedding" in text and "MISMATCH" in text


def test_a_stock_deployment_can_be_fingerprinted(pair, stock, reference):
    srv, dump = stock
    assert srv.error is None, srv.log[-3000:]
    assert os.listdir(dump), "the capture dump (taps hook off) wrote nothing"
    code, text, err = doctor("fingerprint", "--reference", reference, "--captured", dump, "--draft-config",
                             pair.draft, "--target-config", pair.target)
    assert code == 0, text + err
    assert "MISMATCH" not in text


# ----------------------------------------------------------------------------------------------------------------
# (d) `doctor accept`'s served accept length is the server's tokens / verifies: chain and tree
# ----------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("which", ["chain", "tree"])
def test_accept_predicts_the_servers_accept_length(pair, request, which):
    if which == "chain":
        served = request.getfixturevalue("launched")["json"]["online"]
        flags = CHAIN
        online = [(p["verify_ct"], p["correct_drafts_histogram"]) for p in served["per_prompt"]]
        length = served["served_accept_length"]
    else:
        tree = request.getfixturevalue("tree")
        assert tree.error is None, tree.log[-3000:]
        flags, online, length = TREE, _meta(tree.responses), tree.tokens_per_verify
    out = os.path.join(pair.root, f"accept_{which}.json")
    prompts = pair.prompts if which == "chain" else pair.first_prompts(TREE_PROMPTS)
    code, text, err = doctor("accept", "--target", pair.target, "--draft", pair.draft, "--prompts", prompts,
                             "--server-args", flags_text(flags), "--new-tokens", NEW_TOKENS, "--json", out,
                             "--no-progress", "--device", "cpu", "--threads", 1)
    assert code == 0, text + err
    sv = json.load(open(out))["served"]
    assert abs(sv["served_accept_length"] - length) <= 0.01
    assert [(p["verify_ct"], p["correct_drafts_histogram"]) for p in sv["per_prompt"]] == online


# ----------------------------------------------------------------------------------------------------------------
# runtime guards
# ----------------------------------------------------------------------------------------------------------------

def test_self_test_names_a_capture_broken_at_run_time(shifted):
    assert "capture shifted on purpose" in shifted.log
    assert ("capture self-test FAILED: slot 0 should hold Embedding" in shifted.log
            and "the slot holds layer input 1 (LayerOutput(0))" in shifted.log), shifted.log[-3000:]


# ----------------------------------------------------------------------------------------------------------------
# tensor parallelism: two scheduler processes over gloo
# ----------------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def tp2(pair):
    two = pair.first_prompts(2)
    # one core per rank (SGLang's CPU path binds each TP rank's threads; one NUMA node here); the dump on: only
    # attention-TP rank 0 writes
    dump = os.path.join(pair.root, "dump_tp2")
    srv = serve_engine(pair, "plugin_tp2", pair.draft, env={"SGLANG_CPU_OMP_THREADS_BIND": "0|1",
                                                           "EAGLE3_CAPTURE_DUMP": dump}, prompts=two,
                       new_tokens=8, tp=2, metrics=True)
    return srv, two, dump


def test_tp2_capture_after_attention_tp_matches_the_prediction(pair, tp2):
    srv, prompts, _ = tp2
    assert srv.error is None, srv.log[-3000:]
    for rank in ("TP0", "TP1"):
        assert any(rank in ln and "capture self-test passed" in ln for ln in srv.log.splitlines()), rank
        assert any(rank in ln and "layers_to_capture [0, 1, 4]" in ln for ln in srv.log.splitlines()), rank
    code, text, err = doctor("online", "--server", srv.path, "--prompts", prompts, "--target", pair.target,
                             "--draft", pair.draft, "--server-args", flags_text(CHAIN), "--no-progress", "--device",
                             "cpu", "--threads", 1)
    assert code == 0 and "verdict: matches" in text, text + err


def test_tp2_only_attention_tp_rank_0_writes_the_dump(tp2):
    srv, prompts, dump = tp2
    assert srv.error is None, srv.log[-3000:]
    files = [os.path.basename(f) for f in glob.glob(os.path.join(dump, "*.pt"))]
    assert files and all("_tp0_" in f for f in files), files
    recs = _records(dump)
    assert {(r["tp_rank"], r["tp_size"], r["attn_tp_rank"], r["attn_tp_size"]) for r in recs} == {(0, 2, 0, 2)}
    assert "writes, being attn-TP rank 0" in recs[0]["writer"]
    assert {r["forward_mode"] for r in recs} >= {"EXTEND", "TARGET_VERIFY"}


# ----------------------------------------------------------------------------------------------------------------
# the capture dump of served traffic, and the doctor's teacher-forced request (the launched server)
# ----------------------------------------------------------------------------------------------------------------

def _records(dump):
    from eagle3_capture.dump_format import validate_record

    recs = []
    for f in sorted(glob.glob(os.path.join(dump, "*.pt"))):
        rec = torch.load(f, weights_only=True)
        validate_record(rec, f)
        recs.append(rec)
    assert not glob.glob(os.path.join(dump, "*.tmp"))
    return sorted(recs, key=lambda r: r["seq"])


def _rows(rec, req):
    return slice(req["row_start"], req["row_end"])


def test_served_traffic_is_dumped_as_the_contract_says(pair, launched):
    assert launched["code"] == 0, launched["text"] + launched["err"]  # the dump changed nothing served
    everything = _records(launched["dump"])
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
    recs = [r for r in _records(launched["dump"]) if any(q["rid"] == DOCTOR_RID for q in r["requests"])]
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
# a malformed setting: the plugin refuses to serve, SGLang does not start without it
# ----------------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def refused(pair):
    one = pair.first_prompts(1)
    return serve_engine(pair, "refused", pair.draft, env={"EAGLE3_CAPTURE_DISABLE": "selftets"}, prompts=one,
                        new_tokens=2)


def test_a_typo_in_the_off_switch_stops_the_server_with_one_line(refused):
    assert refused.error is not None and not refused.responses
    line = ("eagle3_capture: refusing to serve: EAGLE3_CAPTURE_DISABLE='selftets': unknown hook name(s) "
            "['selftets']")
    assert line in refused.log, refused.log[-4000:]
    assert "Failed to execute general plugin" not in refused.log  # register() did not raise: no stock SGLang
    assert "RuntimeError: " + line in refused.log  # raised at model load, which stops the server


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


# ----------------------------------------------------------------------------------------------------------------
# what `doctor online` believes holds for every response of SGLang's real loop
# ----------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("which, flags", [("stock", CHAIN), ("miswired", CHAIN), ("tree", TREE)])
def test_every_served_response_passes_the_doctors_count_checks(request, which, flags):
    """doctor/sglang_model/responses.py derives the relations between completion_tokens, the verifies, the histogram and the
    newer counters from SGLang 0.5.23's source: every response its serving loop returns satisfies them, for a chain
    and a tree, served right or miswired; 0.5.23 writes the old names and the newer ones side by side."""
    from eagle3_capture.doctor.sglang_model.responses import check_counts, read_recorded

    srv = request.getfixturevalue(which)
    srv = srv["served"] if isinstance(srv, dict) else srv[0] if isinstance(srv, tuple) else srv
    assert srv.error is None, srv.log[-3000:]
    responses = read_recorded(srv.path)
    check_counts(responses, flags)
    assert len(responses) == (TREE_PROMPTS if which == "tree" else PROMPTS)
    assert all(r.completion_tokens == NEW_TOKENS for r in responses)
    assert all(r.histogram is not None and r.num_proposed_drafts is not None for r in responses)
    meta = srv.responses[0]["meta_info"]
    assert {"spec_verify_ct", "spec_correct_drafts_histogram", "spec_num_correct_drafts",
            "spec_num_proposed_drafts", "spec_accept_length"} <= set(meta), sorted(meta)


# ----------------------------------------------------------------------------------------------------------------
# (e) acceptance while serving: the plugin's per-position counters, the drift alarm, the self-test re-run
# ----------------------------------------------------------------------------------------------------------------

def _equal_counts(counted, responses):
    """The plugin's (verifies, attempts, accepted) against the sum of the responses' histograms, exactly."""
    want = expected_from_responses(responses, STEPS)
    assert want[0] > 0, "no verify served"
    assert counted == want, f"counted {counted}, the responses' histograms give {want}"


def test_per_position_counters_equal_the_responses_histograms_tp1(launched):
    w = launched["window"]
    _equal_counts(w["counted"], w["served"].responses)


def test_per_position_counters_equal_the_responses_histograms_tp2(tp2):
    srv, _, _ = tp2
    assert srv.error is None and srv.metrics, srv.log[-3000:]
    _equal_counts(acceptance(srv.metrics, STEPS), srv.responses)
    # one rank counts and says so (attention-TP rank 0); the other only runs the hook
    said = [ln for ln in srv.log.splitlines() if "eagle3_capture: acceptance: counting on (attention-TP rank 0" in ln]
    assert len(said) == 1 and "exported to SGLang's /metrics" in said[0], said


def test_no_alarm_on_the_correct_server(launched):
    from engine_metrics import by_position, total
    from eagle3_capture.acceptance import names

    text, log = launched["window"]["metrics"], launched["log"]
    assert "acceptance drift ALARM" not in log, [ln for ln in log.splitlines() if "ALARM" in ln]
    assert total(text, names.ALARMS) == 0 and set(by_position(text, names.ALARM).values()) == {0.0}
    verifies = total(text, names.VERIFIES)
    assert verifies >= 200, f"only {verifies:.0f} verifies: too short a run to say the alarm keeps quiet"
    exp = by_position(text, names.EXPECTED_ACCEPTANCE)
    assert sorted(exp) == [1, 2, 3] and all(0 < v <= 1 for v in exp.values()), exp


def test_the_drift_alarm_names_the_position_on_the_miswired_server(miswired, profile):
    from engine_metrics import by_position, total
    from eagle3_capture.acceptance import drift, names, profile as profiles

    log, text = miswired["log"], miswired["window"]["metrics"]
    lines = [ln for ln in log.splitlines() if "acceptance drift ALARM at draft position" in ln]
    assert lines, log[-3000:]
    m = re.search(r"ALARM at draft position (\d+): (\d+) of (\d+) verifies", lines[0])
    position, accepted, attempts = int(m.group(1)), int(m.group(2)), int(m.group(3))
    assert position == 1, lines[0]
    # detection delay: the CUSUM's expected count, h / E[LLR per attempt], at the acceptance the alarm line reports
    # for its run (since the statistic last stood at 0), doubled for chance and the one-second blocks (drift.py)
    settings = drift.DriftSettings(threshold=MISWIRED_THRESHOLD)
    p = drift.DriftMonitor.from_profile(profiles.read(profile), settings).positions[0]
    r = accepted / attempts
    per_attempt = r * math.log(p.p1 / p.p0) + (1 - r) * math.log((1 - p.p1) / (1 - p.p0))
    assert per_attempt > 0, (r, p.p0, p.p1)
    bound = 2 * math.ceil(MISWIRED_THRESHOLD / per_attempt)
    print(f"drift alarm: position 1 after {attempts} attempts ({accepted} accepted); served acceptance {r:.3f}, "
          f"profile {p.expected:.3f} (p0 {p.p0:.3f}, p1 {p.p1:.3f}); expected delay "
          f"{MISWIRED_THRESHOLD / per_attempt:.0f} attempts at h = {MISWIRED_THRESHOLD}")
    assert attempts <= bound, (lines[0], bound)
    assert total(text, names.ALARMS, position=1) >= 1 and by_position(text, names.ALARM)[1] == 1.0


@pytest.fixture(scope="session")
def broken_later(pair):
    """Plugin on, the self-test re-run on every served forward (EAGLE3_CAPTURE_SELFTEST_EVERY=1, no clock) with
    =raise, and the capture moved one layer later from the 2nd served target forward on (the stand-ins' fault): the
    start-up test passes, the re-check on the next forward names the slot, the requests in flight finish and the
    server refuses every request sent after (each prompt once more, alone)."""
    two = pair.first_prompts(2)
    return serve_engine(pair, "broken_later", pair.draft, prompts=two, new_tokens=8, metrics=True,
                        env={"E3_SGLANG_CPU_SHIFT_CAPTURE_AFTER": "2", "EAGLE3_CAPTURE_SELFTEST_EVERY": "1",
                             "EAGLE3_CAPTURE_SELFTEST_SECONDS": "0", "EAGLE3_CAPTURE_SELFTEST": "raise"},
                        second_round=True)


def test_the_self_test_rerun_names_a_capture_broken_while_serving(broken_later):
    from engine_metrics import total
    from eagle3_capture.acceptance import names

    srv = broken_later
    log = srv.log
    assert srv.error is None and len(srv.responses) == 2, (srv.error, log[-3000:])   # in flight: served
    assert "capture self-test passed" in log and "run at start-up" in log, log[-3000:]
    failed = [ln for ln in log.splitlines() if "capture self-test FAILED" in ln]
    assert failed and "slot 0 should hold Embedding" in failed[0] and "run after 1 served forwards" in failed[0], \
        log[-3000:]
    assert "refusing new requests from now on" in log
    assert total(srv.metrics, names.SELFTEST_FAILURES) >= 1 and total(srv.metrics, names.CAPTURE_BROKEN) == 1
    refused = [r for r in srv.second_round if "error" in r]
    assert refused and len(refused) == len(srv.second_round), srv.second_round
    assert all("request refused: the capture self-test failed while serving" in r["error"] for r in refused), refused


def test_a_real_prometheus_evaluates_the_rules_on_the_server(launched, profile):
    from eagle3_capture.acceptance import profile as profiles

    seen = launched["window"]["prometheus"]
    assert seen["rule_errors"] == [], seen["rule_errors"]
    rec = seen["recorded"]
    for name, series in rec.items():
        assert series, f"{name}: no series from the real server"
    acc = {int(labels["position"]): v for labels, v in rec["eagle3_capture:spec_draft_acceptance:rate5m"]}
    assert sorted(acc) == [1, 2, 3] and all(0.0 <= v <= 1.0 for v in acc.values()), acc
    want = profiles.read(profile).acceptance()
    exp = {int(labels["position"]): v for labels, v in rec["eagle3_capture:expected_acceptance:max"]}
    assert exp == pytest.approx({p + 1: w for p, w in enumerate(want)}, rel=1e-9), (exp, want)
    [(_, length)] = rec["eagle3_capture:spec_accept_length:rate5m"]
    [(_, sglang_length)] = rec["eagle3_capture:sglang_spec_accept_length:avg5m"]
    # SGLang's gauge is its last logging interval's accept length (averaged over time here), ours the window's
    # counts: the same quantity over different stretches of traffic, so only their range is compared
    assert 1.0 <= length <= 1.0 + STEPS and 1.0 <= sglang_length <= 1.0 + STEPS, (length, sglang_length)
    firing = [a for a in seen["alerts"] if a["state"] == "firing"]
    assert firing == [], firing


def test_a_real_prometheus_fires_the_drift_alert_on_the_miswired_server(miswired):
    seen = miswired["window"]["prometheus"]
    assert seen["rule_errors"] == [], seen["rule_errors"]
    drift = [a for a in seen["alerts"] if a["name"] == "Eagle3AcceptanceDrift" and a["state"] == "firing"]
    assert [a["labels"]["position"] for a in drift] == ["1"], seen["alerts"]


def test_doctor_watch_stays_quiet_on_the_correct_server(launched):
    w = launched["watch"]
    assert w["code"] == 0, w["out"][-3000:] + w["err"][-2000:]
    assert os.path.getsize(w["plot"]) > 0 and json.load(open(w["json"]))


def test_doctor_watch_exits_1_on_the_miswired_server(miswired):
    w = miswired["watch"]
    assert w["code"] == 1, w["out"][-3000:] + w["err"][-2000:]
    assert "position 1" in (w["out"] + w["err"]), w["out"][-3000:]
    with open(w["plot"], "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
