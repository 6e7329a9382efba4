"""Test-only stand-in for one SGLang scheduler process running the plugin: it writes eagle3-capture's metrics (the
names of python/eagle3_capture/acceptance/names.py) with prometheus_client's multiprocess mode into
$PROMETHEUS_MULTIPROC_DIR, as SGLang's processes do, growing the counters steadily until killed (or ``--seconds``).

    PROMETHEUS_MULTIPROC_DIR=DIR python tests/metrics_writer.py --rank R --share S [--model M] [--seconds N]

The traffic, per second over all processes (this one writes ``share`` of it), starting from 1000 s of the same:
verifies 100; per position 1 / 2 / 3 attempts 100 / 75 / 37.5 and accepted 75 / 37.5 / 18.75 (acceptance 0.75 /
0.5 / 0.5, accept length 1 + 131.25 / 100 = 2.3125). rate(x[5m]) divides by 5 minutes however little of them
Prometheus has seen, so a test of a few seconds sees a fraction of these rates: at 100 a second the rules' floor of
one verify a second is passed after about 3 s of scraping. The profile (gauges, max-merged over processes): acceptance 0.75 /
0.625 / 0.6, accept length 3. Rank 0 is in drift alarm at position 2 (alarm 1, one alarm counted); rank 1's capture
self-test failed (capture_broken 1, one failure). SGLang's own ``sglang:spec_accept_length`` says 2.3 on every rank.
Prints "ready" once every series exists.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

VERIFIES_PER_S = 100.0
ATTEMPTS_PER_S = (100.0, 75.0, 37.5)
ACCEPTED_PER_S = (75.0, 37.5, 18.75)
EXPECTED_ACCEPTANCE = (0.75, 0.625, 0.6)
EXPECTED_ACCEPT_LENGTH = 3.0
ALARM_POSITION = "2"
SGLANG_ACCEPT_LENGTH = 2.3
HISTORY_S = 1000.0
STEP_S = 0.05


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--share", type=float, required=True)
    ap.add_argument("--model", default="m")
    ap.add_argument("--seconds", type=float, default=300.0)
    args = ap.parse_args()
    if not os.path.isdir(os.environ.get("PROMETHEUS_MULTIPROC_DIR", "")):
        print("metrics_writer: set PROMETHEUS_MULTIPROC_DIR to an existing directory", file=sys.stderr)
        return 2
    from prometheus_client import Counter, Gauge

    from eagle3_capture.acceptance import names

    counters = {n: Counter(n, doc, labels) for n, (labels, doc) in names.COUNTERS.items()}
    gauges = {n: Gauge(n, doc, labels, multiprocess_mode="max") for n, (labels, doc) in names.GAUGES.items()}
    m, rank = args.model, str(args.rank)
    positions = [str(p + 1) for p in range(len(ATTEMPTS_PER_S))]
    for p, expected in zip(positions, EXPECTED_ACCEPTANCE):
        gauges[names.EXPECTED_ACCEPTANCE].labels(m, p).set(expected)
        in_alarm = args.rank == 0 and p == ALARM_POSITION
        gauges[names.ALARM].labels(m, p).set(1 if in_alarm else 0)
        gauges[names.DRIFT].labels(m, p).set(1.25 if in_alarm else 0.1)
        counters[names.ALARMS].labels(m, p).inc(1 if in_alarm else 0)
    gauges[names.EXPECTED_ACCEPT_LENGTH].labels(m).set(EXPECTED_ACCEPT_LENGTH)
    broken = args.rank == 1
    gauges[names.CAPTURE_BROKEN].labels(m, rank).set(1 if broken else 0)
    counters[names.SELFTEST_FAILURES].labels(m, rank).inc(1 if broken else 0)
    counters[names.SELFTEST_RUNS].labels(m, rank, "failed" if broken else "passed").inc()
    sglang = Gauge("sglang:spec_accept_length", "SGLang's accept length", ["model_name", "tp_rank"],
                   multiprocess_mode="mostrecent")
    sglang.labels(m, rank).set(SGLANG_ACCEPT_LENGTH)

    def grow(seconds: float) -> None:
        s = seconds * args.share
        counters[names.VERIFIES].labels(m).inc(VERIFIES_PER_S * s)
        for p, a, c in zip(positions, ATTEMPTS_PER_S, ACCEPTED_PER_S):
            counters[names.ATTEMPTS].labels(m, p).inc(a * s)
            counters[names.ACCEPTED].labels(m, p).inc(c * s)

    grow(HISTORY_S)   # a server that has been serving: rate()'s extrapolation is not cut at zero
    print("ready", flush=True)
    start = last = time.monotonic()
    while last - start < args.seconds:
        time.sleep(STEP_S)
        now = time.monotonic()
        grow(now - last)
        last = now
    return 0


if __name__ == "__main__":
    sys.exit(main())
