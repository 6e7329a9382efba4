"""Acceptance while SGLang 0.5.23's real serving loop serves: the plugin's per-position counters against the
responses (TP 1 and TP 2), the drift alarm on the miswired server and none on the correct one, a real Prometheus
evaluating the rules, `doctor watch`, and the self-test re-run that names a capture broken while serving.

The servers are runs of engine_servers.py (see test_engine_serving.py).
"""
import json
import math
import os
import re

import pytest

from engine_fixtures import pair  # noqa: F401  (fixture)
from engine_metrics import acceptance, expected_from_responses
from engine_servers import MISWIRED_THRESHOLD, STEPS, fixtures

pytestmark = [pytest.mark.engine, pytest.mark.sglang, pytest.mark.slow]

launched, miswired, tp2, broken_later, profile = fixtures("launched", "miswired", "tp2", "broken_later", "profile")

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
