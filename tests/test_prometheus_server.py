"""The rules in a REAL Prometheus (tests/prometheus_server.py) scraping metrics written the way SGLang writes them:
two processes (tests/metrics_writer.py, standing in for two schedulers running the plugin) write eagle3-capture's
metrics with prometheus_client's multiprocess mode; an http.server thread serves what prometheus_client's
MultiProcessCollector makes of that directory through its own app, which negotiates the format as SGLang's /metrics
does. The recording rules must give the writer's traffic and the alerts must go pending / firing with the right
labels. About 20 s.

A missing `prometheus` binary fails these tests (it never skips them): `make test` installs it.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector

import metrics_writer as writer
from prometheus_server import PrometheusError, PrometheusServer, Series

from eagle3_capture.acceptance import names

pytestmark = pytest.mark.slow   # about 20 s: a real Prometheus must scrape and evaluate for a few seconds
TESTS = Path(__file__).resolve().parent
MODEL = "m"
TOL = 0.03   # the writer's counters move between two scrapes' reads of their files: a few % of jitter


def serve_multiprocess_dir(path: str):
    """/metrics as SGLang serves it with --enable-metrics: prometheus_client's own app (SGLang mounts its ASGI twin,
    make_asgi_app; both answer a Prometheus scrape in OpenMetrics, which writes the colons of the names as
    underscores) over a MultiProcessCollector of the multiprocess directory."""
    from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server
    from socketserver import ThreadingMixIn

    from prometheus_client import make_wsgi_app

    class Quiet(WSGIRequestHandler):
        def log_message(self, *args):   # Prometheus scrapes every second
            pass

    class Threading(ThreadingMixIn, WSGIServer):
        daemon_threads = True

    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=path)
    server = make_server("127.0.0.1", 0, make_wsgi_app(registry), server_class=Threading, handler_class=Quiet)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
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
    # stored as an OpenMetrics scrape writes them: the prefix's colon as an underscore (the rules match both)
    scraped = {s.labels["__name__"] for s in prom.query('{__name__=~"eagle3_capture[:_][a-z_]+"}')}
    assert scraped == {names.exported(n).replace(":", "_") for n in [*names.COUNTERS, *names.GAUGES]}


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
    [total] = prom.query(f'{{__name__=~"{names.exported(names.VERIFIES).replace(":", "[:_]")}"}}')
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
