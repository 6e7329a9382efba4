"""The acceptance counts of a real server: ``python -m sglang.launch_server`` at TP 2 with ``--enable-metrics`` on
the CPU (the demo pair, chain flags), a profile of the server's flags. What SGLang's /metrics reads of the plugin's
counters grows, over the test's requests, by exactly the sum of their responses' ``spec_correct_drafts_histogram``:
the two TP ranks count each verify once. The profile's gauges are exported, and the model-load line is said once.
"""
import json
import os
import time
import urllib.request

import pytest

from engine_fixtures import CHAIN, NEW_TOKENS, LaunchedServer, pair, post_json  # noqa: F401  (fixture)

pytestmark = [pytest.mark.engine, pytest.mark.sglang, pytest.mark.slow]

MODEL_LINE = "eagle3_capture: acceptance: counting on (attention-TP rank 0"


def _metrics(url: str) -> dict:
    """{(name, position or ''): value} of the plugin's series on the server's /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url + "/metrics", timeout=60) as r:
        text = r.read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.startswith("eagle3_capture:"):
                out[(s.name, s.labels.get("position", ""))] = s.value
    return out


def _wait_for(predicate, what: str, timeout: float = 120.0):
    deadline = time.time() + timeout
    while not predicate():
        if time.time() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(1)


def test_counters_equal_the_responses_histograms_at_tp2(pair):
    from eagle3_capture.acceptance import profile
    from eagle3_capture.acceptance.drift import BLOCK_SECONDS
    from eagle3_capture.acceptance.positions import add, attempts_accepted

    s, k, d = CHAIN
    prof = profile.write(profile.make("doctor accept", profile.Speculative(s, k, d), [40, 30, 20, 10], 8),
                         os.path.join(pair.root, "acceptance_profile.json"))
    with open(pair.prompts) as f:
        prompts = json.load(f)
    env = {"EAGLE3_CAPTURE_PROFILE": prof}
    with LaunchedServer(pair, pair.draft, CHAIN, env=env, extra=["--tp-size", "2", "--enable-metrics"],
                        name="launch_server_tp2_metrics") as srv:
        # SGLang's own warm-up request verifies too: start from after it, once its counts were flushed
        _wait_for(lambda: "ready to roll" in srv.log(), "the server's warm-up")
        time.sleep(3 * BLOCK_SECONDS)
        before = _metrics(srv.url)
        responses = [post_json(srv.url + "/generate", {"input_ids": p, "sampling_params": {
            "max_new_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": True}}) for p in prompts]
        time.sleep(3 * BLOCK_SECONDS)
        after = _metrics(srv.url)
        log = srv.log()
    h = []
    for r in responses:
        h = add(h, r["meta_info"]["spec_correct_drafts_histogram"])
    assert sum(h) == sum(r["meta_info"]["spec_verify_ct"] for r in responses) > 0
    att, acc = attempts_accepted(h, s)

    def grew(name, position=""):
        return after.get((name, position), 0) - before.get((name, position), 0)

    assert grew("eagle3_capture:spec_verifies_total") == sum(h), (before, after, h)
    for p in range(1, s + 1):
        assert grew("eagle3_capture:spec_draft_attempts_total", str(p)) == att[p - 1], (p, after, h)
        assert grew("eagle3_capture:spec_draft_accepted_total", str(p)) == acc[p - 1], (p, after, h)
    expected = profile.read(prof).acceptance()
    for p in range(1, s + 1):
        assert after[("eagle3_capture:expected_acceptance", str(p))] == pytest.approx(expected[p - 1])
    lines = [ln for ln in log.splitlines() if MODEL_LINE in ln]
    assert len(lines) == 1 and "exported to SGLang's /metrics" in lines[0] and "alarm on" in lines[0], lines
