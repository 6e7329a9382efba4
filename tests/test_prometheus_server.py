"""The rules in a REAL Prometheus (tests/prometheus_server.py) scraping metrics written the way SGLang writes them:
two processes (tests/metrics_writer.py, standing in for two schedulers running the plugin) write eagle3-capture's
metrics with prometheus_client's multiprocess mode; an http.server thread serves what prometheus_client's
MultiProcessCollector makes of that directory (SGLang's /metrics). The recording rules must give the writer's
traffic, the alerts must go pending / firing with the right labels, and every query of the Grafana dashboard
(monitoring/grafana/eagle3_capture.json) must give series. About 20 s.

A missing `prometheus` binary fails these tests (it never skips them): `make test` installs it.
"""
from __future__ import annotations

import http.server
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

import metrics_writer as writer
from prometheus_server import PrometheusError, PrometheusServer, Series

from eagle3_capture.acceptance import names

pytestmark = pytest.mark.slow   # about 20 s: a real Prometheus must scrape and evaluate for a few seconds
TESTS = Path(__file__).resolve().parent
MODEL = "m"
TOL = 0.03   # the writer's counters move between two scrapes' reads of their files: a few % of jitter


def serve_multiprocess_dir(path: str) -> http.server.ThreadingHTTPServer:
    """/metrics as SGLang serves it with --enable-metrics: a fresh registry over the multiprocess directory."""
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path != "/metrics":
                self.send_error(404)
                return
            registry = CollectorRegistry()
            MultiProcessCollector(registry, path=path)
            body = generate_latest(registry)
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE_LATEST)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):   # quiet: Prometheus scrapes every second
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture(scope="module")
def prom(tmp_path_factory):
    mp_dir = str(tmp_path_factory.mktemp("multiproc"))
    env = dict(os.environ, PROMETHEUS_MULTIPROC_DIR=mp_dir)
    writers = [subprocess.Popen([sys.executable, str(TESTS / "metrics_writer.py"), "--rank", str(rank),
                                 "--share", "0.5", "--model", MODEL, "--seconds", "300"],
                                env=env, stdout=subprocess.PIPE, text=True)
               for rank in (0, 1)]
    server = None
    try:
        for w in writers:
            line = w.stdout.readline().strip()
            assert line == "ready", f"metrics_writer: expected 'ready', got {line!r} (exit code {w.poll()})"
        server = serve_multiprocess_dir(mp_dir)
        url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
        with PrometheusServer(url) as p:
            p.wait_for("up", lambda s: len(s) == 1 and s[0].value == 1, timeout=20)
            yield p
    finally:
        if server is not None:
            server.shutdown()
            server.server_close()
        for w in writers:
            w.terminate()
            w.wait(timeout=10)


def test_targets_up_and_exposition_names(prom):
    assert prom.targets_up()
    scraped = {s.labels["__name__"] for s in prom.query('{__name__=~"eagle3_capture:[a-z_]+"}')}
    assert scraped == {names.exported(n) for n in [*names.COUNTERS, *names.GAUGES]}


def near(expected: dict, tol: float = TOL):
    """A wait_for predicate: one series per key of ``expected`` (a position, or None for a series without one),
    each within ``tol`` of its value (the first seconds of scraping are noisier: wait until they settle)."""
    def check(series):
        got = {s.labels.get("position"): s.value for s in series}
        return got.keys() == expected.keys() and all(abs(got[k] - v) <= tol for k, v in expected.items())
    return check


def test_recording_rules_give_the_traffic(prom):
    acceptance = {str(p): c / a for p, (a, c) in enumerate(zip(writer.ATTEMPTS_PER_S, writer.ACCEPTED_PER_S), 1)}
    found = prom.wait_for("eagle3_capture:spec_draft_acceptance:rate5m", near(acceptance), timeout=30)
    assert all(s.labels["model_name"] == MODEL and s.labels["job"] == "sglang" for s in found)
    # rate(x[5m]) divides by 5 minutes, of which this Prometheus has seen seconds: only the floor is checked; both
    # processes' counts (HISTORY_S of traffic, half each) are in the sum the exporter makes
    prom.wait_for("eagle3_capture:spec_verifies:rate5m", lambda s: len(s) == 1 and s[0].value >= 1, timeout=20)
    [total] = prom.query(names.exported(names.VERIFIES))
    assert writer.VERIFIES_PER_S * writer.HISTORY_S <= total.value <= writer.VERIFIES_PER_S * (writer.HISTORY_S + 300)
    live = 1 + sum(writer.ACCEPTED_PER_S) / writer.VERIFIES_PER_S
    prom.wait_for("eagle3_capture:spec_accept_length:rate5m", near({None: live}), timeout=20)
    [expected] = prom.wait_for("eagle3_capture:expected_accept_length:max", timeout=10)
    assert expected.value == writer.EXPECTED_ACCEPT_LENGTH
    expected_acc = prom.wait_for("eagle3_capture:expected_acceptance:max", lambda s: len(s) == 3, timeout=10)
    assert sorted(s.value for s in expected_acc) == sorted(writer.EXPECTED_ACCEPTANCE)
    prom.wait_for("eagle3_capture:spec_accept_length:ratio_to_expected",
                  near({None: live / writer.EXPECTED_ACCEPT_LENGTH}), timeout=20)
    prom.wait_for("eagle3_capture:spec_draft_acceptance:ratio_to_expected",
                  near({p: a / e for (p, a), e in zip(acceptance.items(), writer.EXPECTED_ACCEPTANCE)}), timeout=20)
    [sglang] = prom.wait_for("eagle3_capture:sglang_spec_accept_length:avg5m", timeout=10)
    assert sglang.value == pytest.approx(writer.SGLANG_ACCEPT_LENGTH)
    assert prom.rule_errors() == []


def alert_states(prom):
    return {(a["labels"]["alertname"], a["state"]): a for a in prom.alerts()}


def test_alerts_fire_and_wait(prom):
    prom.wait_for('ALERTS{alertstate="firing"}', lambda s: len(s) >= 2, timeout=20)
    prom.wait_for('ALERTS{alertname="Eagle3AcceptLengthLow"}', timeout=20)
    states = alert_states(prom)
    drift = states[("Eagle3AcceptanceDrift", "firing")]
    assert drift["labels"]["position"] == writer.ALARM_POSITION and drift["labels"]["model_name"] == MODEL
    assert "draft position 2" in drift["annotations"]["summary"]
    assert "Expected: 62.5%" in drift["annotations"]["description"]
    assert "doctor online" in drift["annotations"]["description"]
    broken = states[("Eagle3CaptureSelfTestFailing", "firing")]
    assert broken["labels"]["tp_rank"] == "1" and broken["labels"]["severity"] == "critical"
    # 2.31 < 0.9 x 3 at >= 1 verify/s, but the alert waits 10 minutes: pending
    low = states[("Eagle3AcceptLengthLow", "pending")]
    assert float(low["value"]) == pytest.approx(2.3125, abs=0.1)   # its value at the last evaluation
    assert "the profile expects 3.00" in low["annotations"]["description"]
    # one alert per position in alarm, per broken rank; SGLang's 2.3 agrees with the plugin's count
    assert sorted(states) == [("Eagle3AcceptLengthLow", "pending"), ("Eagle3AcceptanceDrift", "firing"),
                              ("Eagle3CaptureSelfTestFailing", "firing")]


def test_helper_errors_say_what_happened(prom):
    with pytest.raises(PrometheusError, match="bad_data"):
        prom.query("rate(")
    with pytest.raises(PrometheusError, match="did not hold within"):
        prom.wait_for("eagle3_capture:no_such_series", timeout=0.5)
    assert prom.query("1 + 1") == [Series({}, 2.0)]
    with pytest.raises(ValueError, match="http"):
        PrometheusServer("127.0.0.1:30000")


def test_stopped_on_exit(tmp_path):
    with PrometheusServer("http://127.0.0.1:9/metrics") as p:   # nothing listens: the target is down, not an error
        proc, data = p.proc, p.dir
        assert p.query("1") == [Series({}, 1.0)]
    assert proc.poll() is not None and not os.path.exists(data)
    with pytest.raises(PrometheusError, match="not running"):
        p.query("1")


DASHBOARD = TESTS.parent / "monitoring" / "grafana" / "eagle3_capture.json"
DASHBOARD_VARIABLES = {"$job", "$instance", "$model"}   # each "All" = .* (the variables' allValue)


def dashboard_queries():
    """Every PromQL query of the Grafana dashboard: its panels' targets, and its variables' label_values(m, l) as
    (m, l); Grafana's variables replaced by their "All" value."""
    import json

    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    labels = []
    for v in dash["templating"]["list"]:
        if v["type"] != "query":
            continue
        m = re.fullmatch(r"label_values\((.+), (\w+)\)", v["query"]["query"])
        assert m, f"dashboard variable {v['name']}: expected label_values(<selector>, <label>), got {v['query']}"
        labels.append((m.group(1), m.group(2)))
    used = set(re.findall(r"\$\w+", json.dumps([exprs, labels])))
    assert used <= DASHBOARD_VARIABLES, f"dashboard queries use variables no test gives a value: {used}"

    def all_values(e):
        return re.sub(r"\$\w+", ".*", e)
    return [all_values(e) for e in exprs], [(all_values(s), label) for s, label in labels]


def test_every_dashboard_query_runs(prom):
    exprs, labels = dashboard_queries()
    assert len(exprs) >= 10
    prom.wait_for('ALERTS{alertstate="firing"}', timeout=20)
    for e in exprs:   # each must give series for the writers' traffic (a wrong name or label gives none)
        prom.wait_for(e, timeout=20)
    for selector, label in labels:
        found = prom.wait_for(selector, timeout=10)
        assert all(label in s.labels for s in found), (selector, label, found)


def test_a_taken_port_is_retried(monkeypatch):
    import socket

    import prometheus_server

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        offered = iter([taken])
        find = prometheus_server.free_port
        monkeypatch.setattr(prometheus_server, "free_port", lambda: next(offered, None) or find())
        with PrometheusServer("http://127.0.0.1:9/metrics") as p:
            assert not p.url.endswith(f":{taken}") and p.query("2") == [Series({}, 2.0)]
