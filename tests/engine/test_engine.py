"""SGLang 0.5.23's real serving loop (scheduler, ModelRunner, EAGLEWorkerV2), on the CPU, with the demo pair:
what the server reports beside what the doctor predicts, with the plugin, without it, miswired, and as a tree.

Each configuration starts one server (session fixtures below); the tests read its responses and log.
"""
import json
import os

import pytest

from engine_fixtures import (CHAIN, NEW_TOKENS, PROMPTS, TREE, LaunchedServer, doctor, flags_text, pair,  # noqa: F401
                             serve_engine)

pytestmark = [pytest.mark.engine, pytest.mark.sglang, pytest.mark.slow]

# the demo draft's taps, [Embedding, LayerOutput(0), LayerOutput(3)], written as stock SGLang 0.5.23 reads ids
# that do not start with 1: layer-input indices, unchanged
STOCK_IDS = [0, 1, 4]
# stock SGLang's capture, fc and id rule; only the capture dump (which rides on the model-forward hook) stays
STOCK_DUMPING = "taps,capture,draft_fc,gather,selftest"


def _meta(responses):
    return [(r["meta_info"]["spec_verify_ct"], r["meta_info"]["spec_correct_drafts_histogram"]) for r in responses]


# ----------------------------------------------------------------------------------------------------------------
# one server per configuration
# ----------------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def launched(pair):
    """Plugin on, the draft as shipped (ids [-1, 0, 3]), chain flags, through `python -m sglang.launch_server`;
    `doctor online` against it while it runs."""
    out = os.path.join(pair.root, "online_launched.json")
    with LaunchedServer(pair, pair.draft, CHAIN) as srv:
        code, text, err = doctor("online", "--server", srv.url, "--prompts", pair.prompts, "--target", pair.target,
                                 "--draft", pair.draft, "--new-tokens", NEW_TOKENS, "--json", out, "--no-progress",
                                 "--device", "cpu", "--threads", 1)
        log = srv.log()
    with open(os.path.join(pair.root, "online_launched.txt"), "w") as f:
        f.write(text)
    return {"code": code, "text": text, "err": err, "json": json.load(open(out)) if os.path.exists(out) else None,
            "log": log}


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
    one = os.path.join(pair.root, "one_prompt.json")
    with open(pair.prompts) as f, open(one, "w") as g:
        json.dump(json.load(f)[:1], g)
    return serve_engine(pair, "stock_shipped", pair.draft, env={"EAGLE3_CAPTURE_DISABLE": "all"}, prompts=one,
                        new_tokens=4)


@pytest.fixture(scope="session")
def miswired(pair):
    """Plugin on, but the draft config declares its ids as layer inputs [1, 4, 7] = [LayerOutput(0), LayerOutput(3),
    LayerOutput(6)] (the plugin captures what is declared): no embedding, every slot one tap later than trained.
    The capture dump is on."""
    dump = os.path.join(pair.root, "dump_miswired")
    srv = serve_engine(pair, "miswired", pair.draft_variant(
        "miswired", eagle_aux_hidden_state_layer_ids=[1, 4, 7], eagle_aux_hidden_state_convention="layer_inputs"),
        env={"EAGLE3_CAPTURE_DUMP": dump, "EAGLE3_CAPTURE_DUMP_MAX": "2"})
    return srv, dump


@pytest.fixture(scope="session")
def tree(pair):
    return serve_engine(pair, "plugin_tree", pair.draft, flags=TREE)


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
    one = os.path.join(pair.root, "one_prompt.json")
    with open(pair.prompts) as f, open(one, "w") as g:
        json.dump(json.load(f)[:1], g)
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
    assert "verdict: matches" in launched["text"]
    # the plugin's promised lines are in the server's log: the startup line at model load and the self-test
    log = launched["log"]
    assert "eagle3_capture: DeepseekV3ForCausalLM: taps [Embedding, LayerOutput(0), LayerOutput(3)]" in log
    assert "layers_to_capture [0, 1, 4]" in log and "taps=on" in log
    assert "capture self-test passed: slot 0 equals the embedding bit for bit" in log


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
    srv, dump = miswired
    assert srv.error is None, srv.log[-3000:]
    assert "layers_to_capture [1, 4, 7]" in srv.log
    out = os.path.join(pair.root, "online_miswired.json")
    code, text, err = doctor("online", "--server", srv.path, "--prompts", pair.prompts, "--target", pair.target,
                             "--draft", pair.draft, "--server-args", flags_text(CHAIN), "--json", out,
                             "--no-progress", "--device", "cpu", "--threads", 1)
    assert code == 1, text + err
    j = json.load(open(out))
    assert all(j["lossless"]) and not j["ok"]
    assert "online below offline" in j["verdict"] and "at step 1" in j["verdict"] and "EAGLE3_CAPTURE_DUMP" in j["verdict"]
    assert j["online"]["served_accept_length"] == pytest.approx(srv.tokens_per_verify)
    # the prediction is for the trained taps, i.e. what a correct capture serves (the tests above): clearly more
    assert srv.tokens_per_verify < j["predicted"]["served_accept_length"] - 0.1
    # the dump of that server, against the reference, with the taps the draft was trained on
    code, text, err = doctor("fingerprint", "--reference", reference, "--captured", dump, "--draft-config",
                             pair.draft, "--target-config", pair.target)
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
    code, text, err = doctor("accept", "--target", pair.target, "--draft", pair.draft, "--prompts", pair.prompts,
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
    two = os.path.join(pair.root, "two_prompts.json")
    with open(pair.prompts) as f, open(two, "w") as g:
        json.dump(json.load(f)[:2], g)
    # one core per rank (SGLang's CPU path binds each TP rank's threads; one NUMA node here)
    srv = serve_engine(pair, "plugin_tp2", pair.draft, env={"SGLANG_CPU_OMP_THREADS_BIND": "0|1"}, prompts=two,
                       new_tokens=8, tp=2)
    return srv, two


def test_tp2_capture_after_attention_tp_matches_the_prediction(pair, tp2):
    srv, prompts = tp2
    assert srv.error is None, srv.log[-3000:]
    for rank in ("TP0", "TP1"):
        assert any(rank in ln and "capture self-test passed" in ln for ln in srv.log.splitlines()), rank
        assert any(rank in ln and "layers_to_capture [0, 1, 4]" in ln for ln in srv.log.splitlines()), rank
    code, text, err = doctor("online", "--server", srv.path, "--prompts", prompts, "--target", pair.target,
                             "--draft", pair.draft, "--server-args", flags_text(CHAIN), "--no-progress", "--device",
                             "cpu", "--threads", 1)
    assert code == 0 and "verdict: matches" in text, text + err


# ----------------------------------------------------------------------------------------------------------------
# what `doctor online` believes holds for every response of SGLang's real loop
# ----------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("which, flags", [("stock", CHAIN), ("miswired", CHAIN), ("tree", TREE)])
def test_every_served_response_passes_the_doctors_count_checks(request, which, flags):
    """doctor/responses.py derives the relations between completion_tokens, the verifies, the histogram and the
    newer counters from SGLang 0.5.23's source: every response its serving loop returns satisfies them, for a chain
    and a tree, served right or miswired; 0.5.23 writes the old names and the newer ones side by side."""
    from eagle3_capture.doctor.responses import check_counts, read_recorded

    srv = request.getfixturevalue(which)
    srv = srv[0] if isinstance(srv, tuple) else srv
    assert srv.error is None, srv.log[-3000:]
    responses = read_recorded(srv.path)
    check_counts(responses, flags)
    assert len(responses) == PROMPTS and all(r.completion_tokens == NEW_TOKENS for r in responses)
    assert all(r.histogram is not None and r.num_proposed_drafts is not None for r in responses)
    meta = srv.responses[0]["meta_info"]
    assert {"spec_verify_ct", "spec_correct_drafts_histogram", "spec_num_correct_drafts",
            "spec_num_proposed_drafts", "spec_accept_length"} <= set(meta), sorted(meta)
