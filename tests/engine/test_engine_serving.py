"""SGLang 0.5.23's real serving loop (scheduler, ModelRunner, EAGLEWorkerV2), on the CPU, with the demo pair: what
the server serves and reports beside what the doctor predicts, with the plugin, stock, miswired, as a tree, at TP 2,
and when a setting is malformed or the capture breaks at run time.

Each configuration is one server run (engine_servers.py), started ahead of the tests that read it, two at a time
(engine_runs.py); the tests read its responses and log. The same runs feed test_engine_dump.py and
test_engine_monitoring.py.
"""
import glob
import json
import os
import re

import pytest

from engine_fixtures import CHAIN, NEW_TOKENS, PROMPTS, TREE, doctor, dump_records, flags_text, pair  # noqa: F401
from engine_servers import TREE_PROMPTS, fixtures

pytestmark = [pytest.mark.engine, pytest.mark.sglang, pytest.mark.slow]

launched, stock, stock_shipped, miswired, tree, reference, shifted, tp2, refused = fixtures(
    "launched", "stock", "stock_shipped", "miswired", "tree", "reference", "shifted", "tp2", "refused")


def _meta(responses):
    return [(r["meta_info"]["spec_verify_ct"], r["meta_info"]["spec_correct_drafts_histogram"]) for r in responses]


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
    recs = dump_records(dump)
    assert {(r["tp_rank"], r["tp_size"], r["attn_tp_rank"], r["attn_tp_size"]) for r in recs} == {(0, 2, 0, 2)}
    assert "writes, being attn-TP rank 0" in recs[0]["writer"]
    assert {r["forward_mode"] for r in recs} >= {"EXTEND", "TARGET_VERIFY"}


# ----------------------------------------------------------------------------------------------------------------
# a malformed setting: the plugin refuses to serve, SGLang does not start without it
# ----------------------------------------------------------------------------------------------------------------


def test_a_typo_in_the_off_switch_stops_the_server_with_one_line(refused):
    assert refused.error is not None and not refused.responses
    line = ("eagle3_capture: refusing to serve: EAGLE3_CAPTURE_DISABLE='selftets': unknown hook name(s) "
            "['selftets']")
    assert line in refused.log, refused.log[-4000:]
    assert "Failed to execute general plugin" not in refused.log  # register() did not raise: no stock SGLang
    assert "RuntimeError: " + line in refused.log  # raised at model load, which stops the server


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
