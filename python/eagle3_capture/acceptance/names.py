"""The Prometheus metrics of the plugin (exported through SGLang's own ``/metrics`` with ``--enable-metrics``), in
SGLang's style: ``eagle3_capture:<name>``, counters ending in ``_total`` once exported.

Every metric carries ``model_name`` (SGLang's served model name, as on ``sglang:*``). Per-position metrics carry
``position``: the draft position, 1 = the first draft token after the verified one (a tree's depth). Acceptance
counts are made once per request and verify, on the scheduler that is attention-TP rank 0 (of each DP group), so
the sum over processes that Prometheus' multiprocess collector makes counts every verify once. The self-test's
counters carry ``tp_rank``: every rank checks its own capture.

With a request's ``spec_correct_drafts_histogram`` h (h[k]: verifies that accepted k drafts):
``spec_verifies`` = sum(h); ``spec_draft_attempts{position=p}`` = sum(h[p-1:]) (verifies in which the draft at p was
verified: every earlier one accepted); ``spec_draft_accepted{position=p}`` = sum(h[p:]).
"""
from __future__ import annotations

PREFIX = "eagle3_capture:"
# counters (the exporter appends _total)
VERIFIES = PREFIX + "spec_verifies"
ATTEMPTS = PREFIX + "spec_draft_attempts"
ACCEPTED = PREFIX + "spec_draft_accepted"
ALARMS = PREFIX + "acceptance_alarms"
SELFTEST_RUNS = PREFIX + "selftest_runs"
SELFTEST_FAILURES = PREFIX + "selftest_failures"
# gauges
EXPECTED_ACCEPTANCE = PREFIX + "expected_acceptance"
EXPECTED_ACCEPT_LENGTH = PREFIX + "expected_accept_length"
DRIFT = PREFIX + "acceptance_drift"
ALARM = PREFIX + "acceptance_alarm"
CAPTURE_BROKEN = PREFIX + "capture_broken"

MODEL = "model_name"
POSITION = "position"
TP_RANK = "tp_rank"
RESULT = "result"   # selftest_runs: passed | failed | skipped

COUNTERS = {
    VERIFIES: ((MODEL,), "Verifies counted by eagle3-capture (one per request and verify)"),
    ATTEMPTS: ((MODEL, POSITION), "Verifies in which the draft at this position was verified (all earlier drafts "
                                  "accepted)"),
    ACCEPTED: ((MODEL, POSITION), "Verifies in which the draft at this position was accepted"),
    ALARMS: ((MODEL, POSITION), "Acceptance drift alarms raised at this draft position"),
    SELFTEST_RUNS: ((MODEL, TP_RANK, RESULT), "Capture self-tests run on served forwards, by result"),
    SELFTEST_FAILURES: ((MODEL, TP_RANK), "Capture self-tests that failed"),
}
GAUGES = {
    EXPECTED_ACCEPTANCE: ((MODEL, POSITION), "The profile's acceptance at this draft position (of the verifies "
                                             "that reached it)"),
    EXPECTED_ACCEPT_LENGTH: ((MODEL,), "The profile's accept length (tokens per verify)"),
    DRIFT: ((MODEL, POSITION), "The drift statistic over its alarm threshold (the alarm fires at 1)"),
    ALARM: ((MODEL, POSITION), "1 while acceptance at this position is in alarm, else 0"),
    CAPTURE_BROKEN: ((MODEL, TP_RANK), "1 after a failed capture self-test until one passes, else 0"),
}


def exported(name: str) -> str:
    """The name a counter has on /metrics (prometheus_client appends _total)."""
    return name + "_total" if name in COUNTERS else name


__all__ = ["PREFIX", "VERIFIES", "ATTEMPTS", "ACCEPTED", "ALARMS", "SELFTEST_RUNS", "SELFTEST_FAILURES",
           "EXPECTED_ACCEPTANCE", "EXPECTED_ACCEPT_LENGTH", "DRIFT", "ALARM", "CAPTURE_BROKEN", "MODEL", "POSITION",
           "TP_RANK", "RESULT", "COUNTERS", "GAUGES", "exported"]
