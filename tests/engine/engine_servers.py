"""The engine tests' server configurations on SGLang's real serving loop (CPU, demo pair), as runs of
engine_runs.Runs: what each server is, and what is done with it while it serves. The test modules
(test_engine_*.py) read the runs' results through session fixtures of the same names (`fixtures`).

- `profile`: the correct draft's expected acceptance per position (`doctor accept --profile-out`, no server).
- `training`: the demo pair's SpecForge-layout training data under both readings of ids [0, 1, 4] (no server;
  computed beside the servers, read by `launched`).
- `launched` and `miswired`: `python -m sglang.launch_server` with the plugin, the capture dump, metrics, a real
  Prometheus and `doctor watch`, probed by `doctor online` with and without the target and by an acceptance
  window; one function for both (`launch_and_probe`), the correct draft and the one whose ids are declared one
  layer later. `launched` also carries the doctor's teacher-forced request and the training-data fingerprints.
- `stock`, `stock_shipped`, `tree`, `shifted`, `tp2`, `refused`, `broken_later`: one `sglang.Engine` each
  (serve.py); `reference`: `doctor dump-reference` (no server).
"""
from __future__ import annotations

import json
import os
import time
from typing import Optional

from engine_doctor import TRAINING_READINGS, dump_env, fingerprint_training, online_without_target, training_data
from engine_fixtures import (CHAIN, NEW_TOKENS, PROMPTS, TREE, LaunchedServer, Pair, Served, doctor, flags_text,
                             post_json, serve_engine, wait_for_files)
from engine_metrics import Watch, acceptance, minus, what_prometheus_saw
from engine_runs import Runs, run_fixture
from prometheus_server import PrometheusServer

# the demo draft's taps, [Embedding, LayerOutput(0), LayerOutput(3)], written as stock SGLang 0.5.23 reads ids
# that do not start with 1: layer-input indices, unchanged
STOCK_IDS = [0, 1, 4]
# stock SGLang's capture, fc and id rule; only the capture dump (which rides on the model-forward hook) stays
STOCK_DUMPING = "taps,capture,draft_fc,gather,selftest,acceptance"

DOCTOR_RID = "eagle3-doctor-engine-0"
PROFILE_PROMPTS = 32   # the expected profile's sample: 32 held-out prompts (the servers serve the first 8)
STEPS = CHAIN[0]
TREE_PROMPTS = 4  # a tree verify costs about twice a chain's on the CPU: half the prompts keep CI's time

# The miswired server's alarm threshold (nats; the default is 16). On the demo pair one layer later costs position 1
# only a quarter of its acceptance (0.42 against the profile's 0.56 on the profile's prompts), and a profile of 208
# verifies puts its 3-sigma lower bound at 0.455: at the default the CUSUM needs about a thousand verifies, more than
# this server serves. 6 fires in a couple of hundred (its false-alarm bound, 27 an hour, is a canary's, not a
# deployment's); the correct server keeps the default.
MISWIRED_THRESHOLD = 6


# ----------------------------------------------------------------------------------------------------------------
# no server
# ----------------------------------------------------------------------------------------------------------------

def run_profile(pair: Pair) -> str:
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


def run_training(pair: Pair) -> dict:
    """The demo pair's training data in SpecForge's layout under both readings of ids [0, 1, 4] (transformers,
    bf16): written before the launched server needs it, beside the other servers, not while it waits."""
    return {name: training_data(pair, name, layers) for name, layers in TRAINING_READINGS.items()}


def run_reference(pair: Pair) -> str:
    path = os.path.join(pair.root, "reference.safetensors")
    code, text, err = doctor("dump-reference", "--model", pair.target, "--prompts", pair.prompts, "--out", path,
                             "--device", "cpu")
    assert code == 0, err
    return path


# ----------------------------------------------------------------------------------------------------------------
# launch_server: the correct server and the miswired one
# ----------------------------------------------------------------------------------------------------------------

def record_responses(pair: Pair, url: str, name: str, prompts: Optional[str] = None, workers: int = 1,
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


def _acceptance_window(srv, pair: Pair, name: str) -> dict:
    """The plugin's counters over one window in which only the profile's prompts, sent once more, were served:
    their responses and the counters' difference."""
    before = acceptance(srv.metrics(), STEPS)
    # the profile's own prompts, 8 at a time: live traffic drawn as the profile was (the first 8 alone accept
    # less at position 1 than the 32 do); the recorded file holds the first PROMPTS responses
    served = record_responses(pair, srv.url, name, pair.first_prompts(PROFILE_PROMPTS), workers=8, first=PROMPTS)
    text = srv.metrics()
    return {"served": served, "counted": minus(acceptance(text, STEPS), before), "metrics": text}


def _holds(path, rid):
    import torch

    try:
        return any(r["rid"] == rid for r in torch.load(path, weights_only=True)["requests"])
    except Exception:
        return False


def launch_and_probe(pair: Pair, profile: str, which: str, training: Optional[dict] = None) -> dict:
    """One launch_server with the plugin on, the capture dump on (every forward, the full stream of the doctor's
    requests: EAGLE3_CAPTURE_DUMP_STREAM=all), --enable-metrics against the profile, a real Prometheus scraping it
    and `doctor watch` following it. While it runs: `doctor online` with the transformers target, `doctor online`
    without it (the server as the target side), and the acceptance window (the profile's prompts once more).

    - which="launched": the draft as shipped (ids [-1, 0, 3]), chain flags, the default alarm threshold, and the
      stand-ins' witness of what the draft is fed. Also: the doctor's teacher-forced request by hand (prompt + the
      served greedy continuation, one prefill, rid eagle3-doctor-...), and the fingerprint of SpecForge-layout
      training data (`training`, written beforehand) under both readings of ids [0, 1, 4].
    - which="miswired": the draft config declares its ids as layer inputs [1, 4, 7] = [LayerOutput(0),
      LayerOutput(3), LayerOutput(6)] (the plugin captures what is declared): no embedding, every slot one tap
      later than trained; alarm threshold MISWIRED_THRESHOLD."""
    if which not in ("launched", "miswired"):
        raise ValueError(f"which must be 'launched' or 'miswired', got {which!r}")
    correct = which == "launched"
    dump = os.path.join(pair.root, f"dump_{which}")
    out = os.path.join(pair.root, f"online_{which}.json")
    env = {**dump_env(dump), "EAGLE3_CAPTURE_PROFILE": profile}
    if correct:
        draft, fed = pair.draft, os.path.join(pair.root, "draft_fed_launched")
        env["E3_SGLANG_CPU_RECORD_DRAFT"] = fed
        log_name, window_name = "launch_server", "launched_counted"
    else:
        draft, fed = pair.draft_variant("miswired", eagle_aux_hidden_state_layer_ids=[1, 4, 7],
                                        eagle_aux_hidden_state_convention="layer_inputs"), None
        env["EAGLE3_CAPTURE_ALARM_THRESHOLD"] = str(MISWIRED_THRESHOLD)
        log_name, window_name = "miswired", "miswired"
    result = {"dump": dump}
    with LaunchedServer(pair, draft, CHAIN, env=env, extra=["--enable-metrics"], name=log_name) as srv, \
            PrometheusServer(srv.url + "/metrics") as prom, Watch(srv.url, profile, pair.root, which) as watch:
        code, text, err = doctor("online", "--server", srv.url, "--prompts", pair.prompts, "--target", pair.target,
                                 "--draft", pair.draft, "--new-tokens", NEW_TOKENS, "--json", out, "--no-progress",
                                 "--device", "cpu", "--threads", 1)
        if correct:
            result.update(_teacher_forced(pair, srv, dump))
        result["no_target"] = online_without_target(pair, srv.url, dump, which)
        if correct:
            result["training"] = {name: fingerprint_training(pair, srv.url, dump, name, training[name])
                                  for name in TRAINING_READINGS}
        window = _acceptance_window(srv, pair, window_name)
        window["prometheus"] = what_prometheus_saw(prom, STEPS)
        log = srv.log()
    if correct:
        with open(os.path.join(pair.root, "online_launched.txt"), "w") as f:
            f.write(text)
        result["fed"] = fed
    result.update(code=code, text=text, err=err, json=json.load(open(out)) if os.path.exists(out) else None,
                  log=log, window=window, watch=watch.result())
    if not correct:
        result["served"] = window["served"]
    return result


def _teacher_forced(pair: Pair, srv, dump: str) -> dict:
    """The doctor's teacher-forced request by hand: the first prompt served, then prompt + its greedy continuation
    as one /generate (max_new_tokens 1, return_logprob, logprob_start_len 0, top_logprobs_num 1), until its
    forward is in the dump."""
    with open(pair.prompts) as f:
        prompt = json.load(f)[0]
    served = post_json(srv.url + "/generate", {"input_ids": prompt, "sampling_params": {
        "max_new_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": True}})
    teacher = {"input_ids": prompt + served["output_ids"], "rid": DOCTOR_RID,
               "sampling_params": {"max_new_tokens": 1, "temperature": 0},
               "return_logprob": True, "logprob_start_len": 0, "top_logprobs_num": 1}
    forced = post_json(srv.url + "/generate", teacher)
    wait_for_files(os.path.join(dump, "*.pt"), lambda fs: any(_holds(f, DOCTOR_RID) for f in fs))
    return {"prompt": prompt, "served": served, "teacher": teacher, "forced": forced}


# ----------------------------------------------------------------------------------------------------------------
# sglang.Engine (serve.py)
# ----------------------------------------------------------------------------------------------------------------

def run_stock(pair: Pair):
    """Stock SGLang's capture and id rule (every hook that changes what is served off), the same draft with its ids
    written in stock's own convention, the capture dump on (a stock deployment can be fingerprinted)."""
    dump = os.path.join(pair.root, "dump_stock")
    srv = serve_engine(pair, "stock", pair.draft_variant("stock_ids", eagle_aux_hidden_state_layer_ids=STOCK_IDS),
                       env={"EAGLE3_CAPTURE_DISABLE": STOCK_DUMPING, "EAGLE3_CAPTURE_DUMP": dump,
                            "EAGLE3_CAPTURE_DUMP_MAX": "2"})
    return srv, dump


def run_stock_shipped(pair: Pair) -> Served:
    """Stock SGLang (the plugin registers nothing) with the draft as shipped: ids [-1, 0, 3]."""
    one = pair.first_prompts(1)
    return serve_engine(pair, "stock_shipped", pair.draft, env={"EAGLE3_CAPTURE_DISABLE": "all"}, prompts=one,
                        new_tokens=4)


def run_tree(pair: Pair) -> Served:
    return serve_engine(pair, "plugin_tree", pair.draft, flags=TREE, prompts=pair.first_prompts(TREE_PROMPTS))


def run_shifted(pair: Pair) -> Served:
    """Plugin on, the draft as shipped, and a capture moved one layer later at run time (the test-only stand-in's
    fault): the self-test must name the slot."""
    one = pair.first_prompts(1)
    return serve_engine(pair, "shifted", pair.draft, env={"E3_SGLANG_CPU_SHIFT_CAPTURE": "1"}, prompts=one,
                        new_tokens=2)


def run_tp2(pair: Pair):
    two = pair.first_prompts(2)
    # one core per rank (SGLang's CPU path binds each TP rank's threads; one NUMA node here); the dump on: only
    # attention-TP rank 0 writes
    dump = os.path.join(pair.root, "dump_tp2")
    srv = serve_engine(pair, "plugin_tp2", pair.draft, env={"SGLANG_CPU_OMP_THREADS_BIND": "0|1",
                                                           "EAGLE3_CAPTURE_DUMP": dump}, prompts=two,
                       new_tokens=8, tp=2, metrics=True)
    return srv, two, dump


def run_refused(pair: Pair) -> Served:
    one = pair.first_prompts(1)
    return serve_engine(pair, "refused", pair.draft, env={"EAGLE3_CAPTURE_DISABLE": "selftets"}, prompts=one,
                        new_tokens=2)


def run_broken_later(pair: Pair) -> Served:
    """Plugin on, the self-test re-run on every served forward (EAGLE3_CAPTURE_SELFTEST_EVERY=1, no clock) with
    =raise, and the capture moved one layer later from the 2nd served target forward on (the stand-ins' fault): the
    start-up test passes, the re-check on the next forward names the slot, the requests in flight finish and the
    server refuses every request sent after (each prompt once more, alone)."""
    two = pair.first_prompts(2)
    return serve_engine(pair, "broken_later", pair.draft, prompts=two, new_tokens=8, metrics=True,
                        env={"E3_SGLANG_CPU_SHIFT_CAPTURE_AFTER": "2", "EAGLE3_CAPTURE_SELFTEST_EVERY": "1",
                             "EAGLE3_CAPTURE_SELFTEST_SECONDS": "0", "EAGLE3_CAPTURE_SELFTEST": "raise"},
                        second_round=True)


# ----------------------------------------------------------------------------------------------------------------
# the runs, their order and what they need
# ----------------------------------------------------------------------------------------------------------------

def define(runs: Runs, pair: Pair) -> None:
    """Every run, with its prerequisites and its priority (lower first among those ready): what the longest runs
    wait for first, then the longest (about 13 and 15 minutes on two cores), then the rest, longest first."""
    runs.add("profile", lambda: run_profile(pair), priority=0)
    runs.add("training", lambda: run_training(pair), priority=1)
    runs.add("miswired", lambda prof: launch_and_probe(pair, prof, "miswired"), needs=["profile"], priority=2)
    runs.add("launched", lambda prof, tr: launch_and_probe(pair, prof, "launched", tr),
             needs=["profile", "training"], priority=2)
    runs.add("tp2", lambda: run_tp2(pair), priority=10)
    runs.add("tree", lambda: run_tree(pair), priority=11)
    runs.add("stock", lambda: run_stock(pair), priority=12)
    runs.add("broken_later", lambda: run_broken_later(pair), priority=13)
    runs.add("stock_shipped", lambda: run_stock_shipped(pair), priority=14)
    runs.add("shifted", lambda: run_shifted(pair), priority=15)
    runs.add("refused", lambda: run_refused(pair), priority=16)
    runs.add("reference", lambda: run_reference(pair), priority=17)


def fixtures(*names):
    """The session fixtures of these runs, for a test module: `profile, launched = fixtures("profile", "launched")`."""
    return tuple(run_fixture(n, define) for n in names)
